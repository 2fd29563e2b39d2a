# shellcheck shell=bash
# ---- prelaunch_ending.sh (sourced by prelaunch.sh): the ending — signals and the warning,
# runs.jsonl (the one writer and reader), how the run ended, the requeue.
[[ -z "${KIT_PRELAUNCH_ENDING_SH-}" ]] || return 0  # sourced once
readonly KIT_PRELAUNCH_ENDING_SH=1
kit::on_signal() {
  if [[ "$1" == "${KIT_WARNING_SIGNAL}" ]]; then
    kit::log "got SIG$1: the time limit is near; passing it to the job step"
    kit::pass_warning
    if (( ! KIT_WARNED )); then
      kit::_tell_limit &
      KIT_BG_PIDS+=("$!")
      if (( KIT_RESTART < KIT_MAX_RESTARTS )); then
        kit::stop_before_limit &
        KIT_BG_PIDS+=("$!")
      fi
    fi
    KIT_WARNED=1
  else
    KIT_STOPPING=1
    kit::log "got SIG$1: stopping the job step (cancelled, requeued, preempted or at the time limit)"
    kit::forward "$1"
  fi
}

# kit::early_warning: a warning that came before kit::batch set its traps
# (prelaunch's first command noted it) is acted on as if it came now.
kit::early_warning() {
  if (( KIT_EARLY_WARNING )); then
    kit::log "the warning signal came as the script started"
    KIT_SIGNALS+=("${KIT_WARNING_SIGNAL}")
  fi
}

# kit::pass_warning: hand the warning to the step by a file each launcher
# watches (progress/r<K>/warning): the launcher gives it to its command once
# the command handles it. Signalling srun would not do: slurmstepd passes a
# forwarded signal to every process of the step at once, so a command still
# importing (or a sidecar) would die of it. A warning that comes before the
# step exists waits in the file (Slurm may send it up to a minute early).
kit::pass_warning() {
  mkdir -p "${KIT_PROGRESS_DIR}"
  printf '%s\n' "${KIT_WARNING_SIGNAL}" >"${KIT_PROGRESS_DIR}/.warning"
  mv -f "${KIT_PROGRESS_DIR}/.warning" "${KIT_PROGRESS_DIR}/warning"
}

# kit::_tell_limit: when the launchers stop waiting for their commands to handle the warning (progress/r<K>/
# limit-near: Unix time, KIT_LIMIT_MARGIN s before the limit), so that a rank log says the command has no
# handler before the limit ends the job. Slurm sends the warning from a periodic check, up to ~30 s after its
# lead: a fixed wait (KIT_SIGNAL_GRACE) could outlast the job. Asked in the background: the warning itself
# must not wait on Slurm's answer.
kit::_tell_limit() {
  local end
  kit::helper_traps
  end="$(kit::_job_end)" || return 0
  printf '%s\n' "$(( end - KIT_LIMIT_MARGIN ))" >"${KIT_PROGRESS_DIR}/.limit-near"
  mv -f "${KIT_PROGRESS_DIR}/.limit-near" "${KIT_PROGRESS_DIR}/limit-near"
}

# kit::stop_before_limit: with a restart left, a step still running shortly
# before the time limit (its command has no handler for the warning, or did
# not stop on it) is stopped by kit, so that the run is requeued and resumes
# from its last checkpoint instead of being killed by Slurm at the limit. The
# launchers stop their commands (TERM; KILL after the stop grace) when
# progress/r<K>/stop appears. The limit is read again before acting: an
# admin may have extended it. Nothing is stopped when the requeue would be
# refused (the checkpoint step stalled): the command may yet finish.
kit::stop_before_limit() {
  local end left
  kit::helper_traps
  while :; do
    end="$(kit::_job_end)" || end=$(( $(date +%s) + KIT_SIGNAL_LEAD ))
    left=$(( end - $(date +%s) - KIT_LIMIT_MARGIN ))
    (( left > 0 )) || break
    kit::nap "$(( left < 30 ? left : 30 ))"
  done
  kit::_note_advance
  if kit::_stalled; then
    kit::log "$(( end - $(date +%s) )) s before the time limit: the checkpoint step has not advanced, so a requeue would be refused: letting the step run on"
    return 0
  fi
  kit::log "the job step still runs $(( end - $(date +%s) )) s before the time limit: stopping it, to requeue the job"
  mkdir -p "${KIT_PROGRESS_DIR}"
  : >"${KIT_PROGRESS_DIR}/.stop"
  mv -f "${KIT_PROGRESS_DIR}/.stop" "${KIT_PROGRESS_DIR}/stop"
}

# kit::_checkpoint_step: the step of the newest checkpoint, as the command
# reports it in KIT_CHECKPOINT_STEP_FILE; -1 when it reports none.
kit::_checkpoint_step() {
  local step=""
  if [[ -r "${KIT_CHECKPOINT_STEP_FILE}" ]]; then
    read -r step <"${KIT_CHECKPOINT_STEP_FILE}" || true
  fi
  if [[ "${step}" =~ ^[0-9]{1,18}$ ]]; then printf '%s\n' "$(( 10#${step} ))"; else printf '%s\n' -1; fi
}

# kit::_note_advance: whether the checkpoint step advanced during this run (KIT_RUN_ADVANCED).
kit::_note_advance() {
  KIT_RUN_ADVANCED=false
  if (( $(kit::_checkpoint_step) > KIT_START_STEP )); then KIT_RUN_ADVANCED=true; fi
}

# kit::_record_run END RC [TEARDOWN] [THEN]: one line per run in runs.jsonl (how it
# ended, the checkpoint step it ended at, and whether that advanced during the
# run, as kit::_note_advance found; TEARDOWN: the code of a step that failed after
# its work was finished; THEN restart: the next run starts in this allocation).
kit::_record_run() {
  local -r end="$1" rc="$2" teardown="${3-}" then="${4-}"
  kit::_append_run "${KIT_RESTART}" "${end}" "${rc}" "$(kit::_checkpoint_step)" "${KIT_RUN_ADVANCED}" \
    "$(( KIT_RUN_START_US / 1000 ))" "${teardown}" "${then}"
}

# kit::_append_run RUN END RC STEP ADVANCED START_MS [TEARDOWN] [THEN]: the one writer of runs.jsonl's
# records (kit.jobdir.records.run_records is their one reader in Python). START_MS: when the
# run's batch script began, or for a run restarted in its allocation when it began (ms; null: not
# known, a run caught up after it was killed); end_ms: now (kit.jobdir.goodput cuts the job's time
# at both); then: "restart" when the next run starts in this allocation (kit::restarted_here counts them).
kit::_append_run() {
  local -r now="${EPOCHREALTIME//[.,]/}"
  printf '{"run": %d, "end": "%s", "exit_code": %d, "checkpoint_step": %d, "advanced": %s, "time": %d, "start_ms": %s, "end_ms": %d%s%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$(( now / 1000000 ))" "$6" "$(( now / 1000 ))" "${7:+, \"teardown_exit_code\": ${7}}" \
    "${8:+, \"then\": \"${8}\"}" >>"${KIT_RUNS_FILE}"
}

# kit::restarted_here: how many runs so far were followed by a run in their own allocation (runs.jsonl's
# "then": "restart"): with Slurm's restart count, the number of the batch script's first run.
kit::restarted_here() {
  local line n=0
  if [[ -r "${KIT_RUNS_FILE}" ]]; then
    while IFS= read -r line || [[ -n "${line}" ]]; do
      if [[ "${line}" == '{"run": '* && "${line}" == *', "then": "restart"}' ]]; then n=$(( n + 1 )); fi
    done <"${KIT_RUNS_FILE}"
  fi
  printf '%s\n' "${n}"
}

# kit::read_run RUN|last: the last record of run RUN (or the file's last record) in
# runs.jsonl, its fields in KIT_RECORD (run, end, exit_code, checkpoint_step,
# advanced, time); status 1: none. The one reader of runs.jsonl in bash: the lines
# kit::_append_run writes, which are json.dumps's (a test pins the pair); a torn
# or foreign line is skipped, as Python's reader skips it.
kit::read_run() {
  local line found=""
  local -r re='^\{"run": ([0-9]+), "end": "([a-z_-]+)", "exit_code": (-?[0-9]+), "checkpoint_step": (-?[0-9]+), "advanced": (true|false|null), "time": ([0-9]+)[,}]'
  KIT_RECORD=()
  [[ -r "${KIT_RUNS_FILE}" ]] || return 1
  while IFS= read -r line || [[ -n "${line}" ]]; do
    if [[ "${line}" =~ ${re} ]] && [[ "$1" == last || "${BASH_REMATCH[1]}" == "$1" ]]; then found="${line}"; fi
  done <"${KIT_RUNS_FILE}"
  [[ -n "${found}" && "${found}" =~ ${re} ]] || return 1
  KIT_RECORD=([run]="${BASH_REMATCH[1]}" [end]="${BASH_REMATCH[2]}" [exit_code]="${BASH_REMATCH[3]}"
              [checkpoint_step]="${BASH_REMATCH[4]}" [advanced]="${BASH_REMATCH[5]}" [time]="${BASH_REMATCH[6]}")
}

# kit::_stalled: true when this run (KIT_RUN_ADVANCED) and the run before it
# (its line in runs.jsonl) both went without the checkpoint step advancing
# (only for commands that report one).
kit::_stalled() {
  [[ "${KIT_RUN_ADVANCED}" == false && -e "${KIT_CHECKPOINT_STEP_FILE}" ]] || return 1
  kit::read_run "$(( KIT_RESTART - 1 ))" || return 1
  [[ "${KIT_RECORD[advanced]}" == false ]]
}

# kit::_job_field FORMAT: one squeue field of this job (%e its end, %r its state's reason);
# nothing when Slurm does not answer.
kit::_job_field() {
  squeue --noheader --jobs="${SLURM_JOB_ID}" --format="$1" 2>/dev/null | awk 'NR == 1' || true
}

# kit::_job_end: the job's time limit as Slurm says it now (Unix time); fails when Slurm does not answer (an
# empty answer too: `date -d ''` is today's midnight, which would stop the step at once).
kit::_job_end() {
  local end
  end="$(kit::_job_field %e)"
  [[ -n "${end}" ]] && date -d "${end}" +%s 2>/dev/null
}

# kit::_await_stop: a step that failed while Slurm ends the job (cancelled as the step began: srun refused,
# "Job/step already completing"; or its tasks signalled first) may end before the batch script's own stop
# signal comes: when Slurm no longer says RUNNING, that signal is waited for (at most 5 s), so that the run
# is recorded as stopped, not as failed. A cancel that came as Slurm started the batch script, before the
# script was there to be signalled, sends no signal at all: the run is stopped all the same.
kit::_await_stop() {
  local state tries
  state="$(kit::_job_field %T)"
  [[ -n "${state}" && "${state}" != RUNNING ]] || return 0
  kit::log "the step failed while Slurm ends the job (${state}): waiting for its stop signal"
  for (( tries = 0; tries < 25 && ! KIT_STOPPING; tries++ )); do
    kit::nap 0.2
    kit::handle_signals
  done
  (( ! KIT_STOPPING )) || return 0
  kit::log "no stop signal came (Slurm ended the job as this script started): the run was stopped by Slurm"
  KIT_STOPPING=1
}

# kit::requeue WHY [NODE]: requeue the job within the retry budget, with NODE
# (a suspect) left out of the next run where the partition has nodes to
# spare. Returns 1 when the budget is spent, the checkpoint step stalled, a
# stop signal was not the time limit's, or the requeue failed. After a stop
# signal Slurm's reason (%r) tells: TimeLimit at the time limit; None for a
# cancel, an admin's requeue or a preemption (each job then shows COMPLETING),
# and Slurm requeues even a cancelled batch job when asked: a requeue then would
# undo the user's cancel. No answer: no requeue.
kit::requeue() {
  local -r why="$1" suspect="${2-}"
  local excluded
  if kit::_stalled; then
    kit::log "${why}; the checkpoint step did not advance in this run or the one before (still $(kit::_checkpoint_step)): not requeueing again"
    KIT_END_CODE="${KIT_EXIT_NO_PROGRESS}"
    return 1
  fi
  if (( KIT_RESTART >= KIT_MAX_RESTARTS )); then
    kit::log "${why}; retry budget spent (${KIT_MAX_RESTARTS} restarts), not requeueing"
    return 1
  fi
  if (( KIT_STOPPING )) && [[ "$(kit::_job_field %r)" != TimeLimit ]]; then
    kit::log "${why}; a stop signal came that was not the time limit (a cancel, or a requeue or preemption Slurm carries out itself): not requeueing"
    return 1
  fi
  kit::log "${why}; requeueing (restart $(( KIT_RESTART + 1 )) of ${KIT_MAX_RESTARTS})"
  kit::stop_background
  # Slurm TERMs the batch step for the requeue about to be asked: the scontrol
  # and sinfo below must not die of it (one did, and the suspect stayed in the
  # next run's nodes).
  trap '' TERM INT
  if ! scontrol requeue "${SLURM_JOB_ID}"; then
    kit::log "scontrol requeue failed"
    return 1
  fi
  # Slurm holds a requeued job for its credential lifetime (BeginTime = the
  # batch script's end + 121 s by default) unless the job already has a later
  # begin time: giving it one a few seconds ahead (past this script's end, and
  # past the second in which the old run's credential was revoked) starts the
  # next run as soon as the scheduler next looks.
  if ! scontrol update JobId="${SLURM_JOB_ID}" StartTime="now+${KIT_REQUEUE_DELAY}" 2>/dev/null; then
    kit::log "the next run waits for Slurm's hold after a requeue (scontrol update StartTime was refused)"
  fi
  local left=""
  if [[ -n "${suspect}" ]]; then
    if excluded="$(kit::_spared "${suspect}")" && scontrol update JobId="${SLURM_JOB_ID}" ExcNodeList="${excluded}"; then
      left="; the next run leaves out ${excluded}"
      kit::log "the next run leaves out ${excluded}"
    else
      kit::log "the next run may use ${suspect} again: the partition has no node to spare"
    fi
  fi
  printf '%s\n' "${why}${left}" >"${KIT_PROGRESS_DIR}/.requeued"
  mv -f "${KIT_PROGRESS_DIR}/.requeued" "${KIT_PROGRESS_DIR}/requeued"
  kit::notify_last
  exit 0
}

# kit::_spared SUSPECT: the nodes the job leaves out with SUSPECT added, printed when the partition still has as
# many nodes as the job needs without them; status 1 when it has not (the job would wait for nodes it cannot get).
kit::_spared() {
  local excluded total
  # The line that starts with ReqNodeList: no job name or path can stand there.
  excluded="$(scontrol show job "${SLURM_JOB_ID}" 2>/dev/null | sed -n 's/^ *ReqNodeList=[^ ]* ExcNodeList=\([^ ]*\)$/\1/p' | awk 'NR == 1')" || excluded=""
  if [[ "${excluded}" == "(null)" ]]; then excluded=""; fi
  excluded="${excluded:+${excluded},}$1"
  total="$(sinfo --noheader --partition="${SLURM_JOB_PARTITION-}" --format=%D 2>/dev/null | awk '{ n += $1 } END { print n + 0 }')"
  (( total - $(scontrol show hostnames "${excluded}" | wc -l) >= ${SLURM_JOB_NUM_NODES:-1} )) || return 1
  printf '%s\n' "${excluded}"
}

# kit::_restart_here END SUSPECT: may the next run start in this allocation, as a new srun step, instead of
# after a requeue? After a hang, a failed preflight, or a straggler under --on-straggler restart; with a restart
# left, the checkpoint step not stalled, no stop signal or time-limit warning (the allocation is ending); and the
# SUSPECT nodes left out on spares (--spare-nodes), or none named, or (not after a preflight: it would fail again)
# none the partition could spare: leaving them out is then worth no requeue's wait.
kit::_restart_here() {
  local -r end="$1" suspect="$2"
  case "${end}" in
    hang | preflight | failed) ;;
    straggler) [[ "${KIT_ON_STRAGGLER}" == restart ]] || return 1 ;;
    *) return 1 ;;
  esac
  (( KIT_RESTART < KIT_MAX_RESTARTS && ! KIT_STOPPING && ! KIT_WARNED )) || return 1
  if kit::_stalled; then return 1; fi
  if [[ -n "${suspect}" ]] && kit::leave_out "${suspect}"; then return 0; fi
  # A failed command's node is only a guess: kept rather than requeued for.
  [[ "${end}" == failed ]] && return 0
  [[ "${end}" != preflight ]] && { [[ -z "${suspect}" ]] || ! kit::_spared "${suspect}" >/dev/null; }
}

# kit::leave_out NODES: leave NODES (comma-separated) out of this allocation's next runs (KIT_LEFT_OUT), when
# its spare nodes still make up the step without them; status 1 when they do not, or there are none.
kit::leave_out() {
  local -r out="${KIT_LEFT_OUT:+${KIT_LEFT_OUT},}$1"
  local -a kept=()
  (( ${SLURM_JOB_NUM_NODES:-0} > KIT_STEP_NODES )) || return 1
  mapfile -t kept < <(kit::kept_nodes "${out}")
  (( ${#kept[@]} >= KIT_STEP_NODES )) || return 1
  KIT_LEFT_OUT="${out}"
}

# kit::_kept_or_left SUSPECT END: what a restart in the allocation does with SUSPECT, for the batch log.
kit::_kept_or_left() {
  if [[ -z "$1" ]]; then return 0; fi
  if [[ ",${KIT_LEFT_OUT}," == *",$1,"* ]]; then
    printf ', without %s: a spare node takes its place\n' "$1"
  elif [[ "$2" == failed ]]; then
    printf ', %s kept: no spare node in the allocation\n' "$1"
  else
    printf ', %s kept: the partition has no node to spare\n' "$1"
  fi
}

# kit::next_run: the next run in this allocation: the last one's watchers stopped, its number and directories,
# its start, the checkpoint step it resumes from.
kit::next_run() {
  local pid
  local -a kept=()
  KIT_RUN_START_US="${EPOCHREALTIME//[.,]/}"
  kit::stop "${KIT_RUN_PIDS[@]}"
  for pid in "${KIT_BG_PIDS[@]}"; do
    if [[ " ${KIT_RUN_PIDS[*]} " != *" ${pid} "* ]]; then kept+=("${pid}"); fi
  done
  KIT_BG_PIDS=("${kept[@]}") KIT_RUN_PIDS=()
  kit::begin_run "$(( KIT_RESTART + 1 ))"
  KIT_START_STEP="$(kit::_checkpoint_step)"
  KIT_RUN_ADVANCED=true KIT_END_CODE="" KIT_SUSPECT_NODE="" KIT_STEP_RC=0
}

# kit::first_failure [rank]: the exit code (with "rank": the rank) of the rank whose command failed first in
# this run (srun itself reports the highest code, often that of a rank it
# stopped because another one failed): by time, then rank, as
# kit.jobdir.failures.first_failure decides it (a test holds the pair to one answer).
kit::first_failure() {
  local field=3
  if [[ "${1-}" == rank ]]; then field=2; fi
  kit::_rank_ends | awk '$4 == "self" && $3 != 0' | sort -k1,1n -k2,2n | awk -v f="${field}" 'NR == 1 { print $f; found = 1 } END { exit !found }'
}

# kit::_all_ranks_done: did every rank's command end by itself with 0 in this run?
kit::_all_ranks_done() {
  kit::_rank_ends | awk -v world="${KIT_WORLD_SIZE}" '$4 == "self" && $3 == 0 { n++ } END { exit !(n == world) }'
}

# kit::declared_finished RANK: has RANK declared its work finished in this run
# (kit.train.progress.finished(): its progress file's first word)?
kit::declared_finished() {
  local word=""
  { read -r word _ <"${KIT_PROGRESS_DIR}/rank-$1"; } 2>/dev/null || return 1
  [[ "${word}" == finished ]]
}

# kit::_all_ranks_declared: has every rank declared its work finished in this run?
kit::_all_ranks_declared() {
  local rank
  for (( rank = 0; rank < KIT_WORLD_SIZE; rank++ )); do
    kit::declared_finished "${rank}" || return 1
  done
}

# kit::_rank_ends: the launchers' records of how each rank ended in this run.
kit::_rank_ends() {
  local -a files=("${KIT_LOG_DIR}/exit.r${KIT_RESTART}.rank-"*)
  [[ -e "${files[0]}" ]] || return 0
  cat "${files[@]}"
}

# A run that Slurm ended with SIGKILL (after KillWait, or with its node)
# left no line in runs.jsonl: say so, so the record has every run.
kit::catch_up_runs() {
  KIT_LAST_RUN=""
  if kit::read_run last; then KIT_LAST_RUN="${KIT_RECORD[run]}"; fi
  for (( KIT_RUN = ${KIT_LAST_RUN:--1} + 1; KIT_RUN < KIT_RESTART; KIT_RUN++ )); do
    kit::_append_run "${KIT_RUN}" killed -1 "$(kit::_checkpoint_step)" null null
  done
  KIT_START_STEP="$(kit::_checkpoint_step)"
  KIT_RUN_ADVANCED=true
  KIT_END_CODE=
}

# kit::_run_facts: the facts of this run's end that kit.core.ending's table reads, as name=value
# words: preflight hang declared straggler warned stopping function all_done (0 or 1), rc (zero, own or signal).
kit::_run_facts() {
  local -r rc="${KIT_STEP_RC}"
  local class=own
  if (( rc == 0 )); then class=zero; elif (( rc > 128 )); then class=signal; fi
  printf 'preflight=%d hang=%d declared=%d straggler=%d warned=%d stopping=%d function=%d all_done=%d restart_failed=%d rc=%s\n' \
    "$(kit::_holds kit::_preflight_failed)" \
    "$(kit::_holds test -e "${KIT_HANG_DIR}/report")" "$(kit::_holds kit::_work_declared)" \
    "$(kit::_holds test -e "${KIT_PROGRESS_DIR}/straggler-stop")" \
    "${KIT_WARNED}" "${KIT_STOPPING}" "$(kit::_holds test -e "${KIT_JOB_DIR}/function.pkl")" \
    "$(kit::_holds kit::_all_ranks_done)" "$(kit::_holds test "${KIT_ON_FAILURE}" = restart)" "${class}"
}

# kit::_preflight_failed: did this run's preflight verdict (kit.preflight.verdict) fail a node?
kit::_preflight_failed() {
  [[ "$(kit::field "${KIT_PROGRESS_DIR}/preflight" verdict)" == failed ]]
}

# kit::field FILE KEY: the value of FILE's first KEY=VALUE line (a hang report's, the preflight verdict's).
kit::field() {
  local line
  [[ -r "$1" ]] || return 0
  while IFS= read -r line; do
    if [[ "${line}" == "$2="* ]]; then printf '%s\n' "${line#"$2="}"; return 0; fi
  done <"$1"
}

# kit::_suspects: the nodes the next run leaves out: those the preflight failed, else the one a hang report names,
# else the straggler's (--on-straggler requeue).
kit::_suspects() {
  local rank
  if kit::_preflight_failed; then
    kit::field "${KIT_PROGRESS_DIR}/preflight" nodes
  elif [[ -e "${KIT_HANG_DIR}/report" ]]; then
    kit::field "${KIT_HANG_DIR}/report" node
  elif [[ -e "${KIT_PROGRESS_DIR}/straggler-stop" ]]; then
    kit::field "${KIT_PROGRESS_DIR}/straggler" node
  elif rank="$(kit::first_failure rank)"; then
    kit::node_of "${rank}"
  fi
}

# kit::node_of RANK: the node RANK's task ran on in this run (its launcher's record, progress/r<run>/task-<rank>);
# nothing when it left none.
kit::node_of() {
  local node=""
  { read -r node _ <"${KIT_PROGRESS_DIR}/task-$1"; } 2>/dev/null || true
  printf '%s\n' "${node}"
}

# kit::_holds COMMAND...: 1 when COMMAND succeeds, else 0.
kit::_holds() {
  if "$@"; then printf '1\n'; else printf '0\n'; fi
}

# kit::_work_declared: FINISHED is there, or every rank declared its work finished.
kit::_work_declared() {
  [[ -e "${KIT_FINISHED_FILE}" ]] || kit::_all_ranks_declared
}

# kit::_facts_hold WHEN FACTS: does every name=value word of WHEN stand in FACTS?
kit::_facts_hold() {
  local fact
  local -a wanted=()
  read -r -a wanted <<<"$1"
  for fact in "${wanted[@]}"; do
    [[ " $2 " == *" ${fact} "* ]] || return 1
  done
  return 0
}

# kit::_ending FACTS: the first row of KIT_ENDINGS whose facts hold in FACTS.
kit::_ending() {
  local row when
  for row in "${KIT_ENDINGS[@]}"; do
    when="${row%%|*}"
    if kit::_facts_hold "${when}" "$1"; then printf '%s\n' "${row}"; return 0; fi
  done
  return 1
}

# kit::conclude: how the run ended (KIT_STEP_RC and the facts around it), by the first row of
# kit.core.ending's table that holds: recorded in runs.jsonl, told, FINISHED written, the next run
# started in this allocation (returns: kit::batch's loop) or the job requeued as the row says; else
# exits with the job's code.
kit::conclude() {
  local -r rc="${KIT_STEP_RC}"
  local facts row when end code flags why says next=""
  if (( rc != 0 && ! KIT_STOPPING )); then kit::_await_stop; fi
  facts="$(kit::_run_facts)"
  row="$(kit::_ending "${facts}")"
  IFS='|' read -r when end code flags why says <<<"${row}"
  kit::log "the run ended with ${facts}: ${end} (${when:-any other end})"
  if [[ " ${flags} " == *" mark "* && ! -e "${KIT_FINISHED_FILE}" ]]; then : >"${KIT_FINISHED_FILE}"; fi
  if [[ " ${flags} " == *" suspect "* ]]; then KIT_SUSPECT_NODE="$(kit::_suspects)"; fi
  kit::_note_advance
  if [[ -n "${why}" ]] && kit::_restart_here "${end}" "${KIT_SUSPECT_NODE}"; then next=restart; fi
  if [[ " ${flags} " == *" teardown "* ]]; then kit::_record_run "${end}" 0 "${rc}" "${next}"; else kit::_record_run "${end}" "${rc}" "" "${next}"; fi
  says="${says//\{rc\}/${rc}}"
  if [[ "${says}" == *"{preflight}"* ]]; then says="${says//\{preflight\}/$(kit::field "${KIT_PROGRESS_DIR}/preflight" why)}"; fi
  if [[ "${says}" == *"{straggler}"* ]]; then says="${says//\{straggler\}/$(kit::field "${KIT_PROGRESS_DIR}/straggler" why)}"; fi
  if [[ -n "${says}" ]]; then kit::log "${says//\{hang_dir\}/${KIT_HANG_DIR}}"; fi
  if [[ "${next}" == restart ]]; then
    kit::log "${why//\{rc\}/${rc}}; restarting in this allocation (restart $(( KIT_RESTART + 1 )) of ${KIT_MAX_RESTARTS})$(kit::_kept_or_left "${KIT_SUSPECT_NODE}" "${end}")"
    return 0
  fi
  if [[ -n "${why}" ]]; then kit::requeue "${why//\{rc\}/${rc}}" "${KIT_SUSPECT_NODE}" || true; fi
  kit::_exit_job "$(kit::_ending_code "${code}")"
}

# kit::_exit_job CODE: the batch script's last word, then its exit with the job's code: exited.json (stopped: a
# stop signal came, and what follows is Slurm's to say: a cancel, a requeue of its own, the time limit), and
# --notify's last sends.
kit::_exit_job() {
  printf '{"code": %d, "run": %d, "stopped": %d}\n' "$1" "${KIT_RESTART}" "${KIT_STOPPING}" >"${KIT_PROGRESS_DIR}/.exited.json"
  mv -f "${KIT_PROGRESS_DIR}/.exited.json" "${KIT_PROGRESS_DIR}/exited.json"
  kit::notify_last
  exit "$1"
}

# kit::_ending_code WORDS: the job's exit code, the first of WORDS that gives one (kit.core.ending.Ending.code):
# rc, a number, refusal (a refused requeue's code), first_failure, or a KIT_EXIT_<NAME>.
kit::_ending_code() {
  local word name
  local -a words=()
  read -r -a words <<<"$1"
  for word in "${words[@]}"; do
    case "${word}" in
      rc) printf '%s\n' "${KIT_STEP_RC}"; return 0 ;;
      refusal) if [[ -n "${KIT_END_CODE}" ]]; then printf '%s\n' "${KIT_END_CODE}"; return 0; fi ;;
      first_failure) if kit::first_failure; then return 0; fi ;;
      [0-9]*) printf '%s\n' "${word}"; return 0 ;;
      *) name="KIT_EXIT_${word}"; printf '%s\n' "${!name}"; return 0 ;;
    esac
  done
  printf '%s\n' "${KIT_EXIT_INCOMPLETE}"
}
