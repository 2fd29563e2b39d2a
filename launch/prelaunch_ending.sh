# ---- prelaunch_ending.sh (pasted into prelaunch.sh): the ending — signals and the warning,
# runs.jsonl (the one writer and reader), how the run ended, the requeue.
kit::on_signal() {
  if [[ "$1" == "${KIT_WARNING_SIGNAL}" ]]; then
    kit::log "got SIG$1: the time limit is near; passing it to the job step"
    kit::pass_warning
    if (( ! KIT_WARNED && KIT_RESTART < KIT_MAX_RESTARTS )); then
      kit::stop_before_limit &
      KIT_BG_PIDS+=("$!")
    fi
    KIT_WARNED=1
  else
    KIT_STOPPING=1
    kit::log "got SIG$1: stopping the job step (cancelled, requeued, preempted or at the time limit)"
    kit::forward "$1"
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
    end="$(squeue --noheader --jobs="${SLURM_JOB_ID}" --format=%e 2>/dev/null | awk 'NR == 1')" || end=""
    end="$(date -d "${end}" +%s 2>/dev/null)" || end=$(( $(date +%s) + KIT_SIGNAL_LEAD ))
    left=$(( end - $(date +%s) - KIT_LIMIT_MARGIN ))
    (( left > 0 )) || break
    kit::nap "$(( left < 30 ? left : 30 ))"
  done
  KIT_RUN_ADVANCED=false
  if (( $(kit::checkpoint_step) > KIT_START_STEP )); then KIT_RUN_ADVANCED=true; fi
  if kit::stalled; then
    kit::log "$(( end - $(date +%s) )) s before the time limit: the checkpoint step has not advanced, so a requeue would be refused: letting the step run on"
    return 0
  fi
  kit::log "the job step still runs $(( end - $(date +%s) )) s before the time limit: stopping it, to requeue the job"
  mkdir -p "${KIT_PROGRESS_DIR}"
  : >"${KIT_PROGRESS_DIR}/.stop"
  mv -f "${KIT_PROGRESS_DIR}/.stop" "${KIT_PROGRESS_DIR}/stop"
}

# kit::checkpoint_step: the step of the newest checkpoint, as the command
# reports it in KIT_CHECKPOINT_STEP_FILE; -1 when it reports none.
kit::checkpoint_step() {
  local step=""
  if [[ -r "${KIT_CHECKPOINT_STEP_FILE}" ]]; then
    read -r step <"${KIT_CHECKPOINT_STEP_FILE}" || true
  fi
  if [[ "${step}" =~ ^[0-9]{1,18}$ ]]; then printf '%s\n' "$(( 10#${step} ))"; else printf '%s\n' -1; fi
}

# kit::record_run END RC [TEARDOWN]: one line per run in runs.jsonl (how it
# ended, the checkpoint step it ended at, and whether that advanced during the
# run; TEARDOWN: the code of a step that failed after its work was finished).
kit::record_run() {
  local -r end="$1" rc="$2" teardown="${3-}"
  local -r step="$(kit::checkpoint_step)"
  local advanced=false
  if (( step > KIT_START_STEP )); then advanced=true; fi
  kit::append_run "${KIT_RESTART}" "${end}" "${rc}" "${step}" "${advanced}" "${teardown}"
  KIT_RUN_ADVANCED="${advanced}"
}

# kit::append_run RUN END RC STEP ADVANCED [TEARDOWN]: the one writer of runs.jsonl's
# records (kit.jobdir.records.run_records is their one reader in Python).
kit::append_run() {
  printf '{"run": %d, "end": "%s", "exit_code": %d, "checkpoint_step": %d, "advanced": %s, "time": %d%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$(date +%s)" "${6:+, \"teardown_exit_code\": ${6}}" >>"${KIT_RUNS_FILE}"
}

# kit::read_run RUN|last: the last record of run RUN (or the file's last record) in
# runs.jsonl, its fields in KIT_RECORD (run, end, exit_code, checkpoint_step,
# advanced, time); status 1: none. The one reader of runs.jsonl in bash: the lines
# kit::append_run writes, which are json.dumps's (a test pins the pair); a torn
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

# kit::stalled: true when this run (KIT_RUN_ADVANCED) and the run before it
# (its line in runs.jsonl) both went without the checkpoint step advancing
# (only for commands that report one).
kit::stalled() {
  [[ "${KIT_RUN_ADVANCED}" == false && -e "${KIT_CHECKPOINT_STEP_FILE}" ]] || return 1
  kit::read_run "$(( KIT_RESTART - 1 ))" || return 1
  [[ "${KIT_RECORD[advanced]}" == false ]]
}

# kit::requeue WHY [NODE]: requeue the job within the retry budget, with NODE
# (a suspect) left out of the next run where the partition has nodes to
# spare. Returns 1 when the budget is spent or the requeue failed.
kit::requeue() {
  local -r why="$1" suspect="${2-}"
  local excluded total
  if kit::stalled; then
    kit::log "${why}; the checkpoint step did not advance in this run or the one before (still $(kit::checkpoint_step)): not requeueing again"
    KIT_END_CODE="${KIT_EXIT_NO_PROGRESS}"
    return 1
  fi
  if (( KIT_RESTART >= KIT_MAX_RESTARTS )); then
    kit::log "${why}; retry budget spent (${KIT_MAX_RESTARTS} restarts), not requeueing"
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
  if [[ -n "${suspect}" ]]; then
    # The line that starts with ReqNodeList: no job name or path can stand there.
    excluded="$(scontrol show job "${SLURM_JOB_ID}" 2>/dev/null | sed -n 's/^ *ReqNodeList=[^ ]* ExcNodeList=\([^ ]*\)$/\1/p' | awk 'NR == 1')" || excluded=""
    [[ "${excluded}" == "(null)" ]] && excluded=""
    excluded="${excluded:+${excluded},}${suspect}"
    total="$(sinfo --noheader --partition="${SLURM_JOB_PARTITION-}" --format=%D 2>/dev/null | awk '{ n += $1 } END { print n + 0 }')"
    if (( total - $(scontrol show hostnames "${excluded}" | wc -l) >= ${SLURM_JOB_NUM_NODES:-1} )) \
      && scontrol update JobId="${SLURM_JOB_ID}" ExcNodeList="${excluded}"; then
      kit::log "the next run leaves out ${excluded}"
    else
      kit::log "the next run may use ${suspect} again: the partition has no node to spare"
    fi
  fi
  exit 0
}

# kit::first_failure: the exit code of the rank whose command failed first in
# this run (srun itself reports the highest code, often that of a rank it
# stopped because another one failed): by time, then rank, as
# kit.jobdir.failures.first_failure decides it (a test holds the pair to one answer).
kit::first_failure() {
  kit::rank_ends | awk '$4 == "self" && $3 != 0' | sort -k1,1n -k2,2n | awk 'NR == 1 { print $3; found = 1 } END { exit !found }'
}

# kit::all_ranks_done: did every rank's command end by itself with 0 in this run?
kit::all_ranks_done() {
  kit::rank_ends | awk -v world="${KIT_WORLD_SIZE}" '$4 == "self" && $3 == 0 { n++ } END { exit !(n == world) }'
}

# kit::declared_finished RANK: has RANK declared its work finished in this run
# (kit.train.progress.finished(): its progress file's first word)?
kit::declared_finished() {
  local word=""
  { read -r word _ <"${KIT_PROGRESS_DIR}/rank-$1"; } 2>/dev/null || return 1
  [[ "${word}" == finished ]]
}

# kit::all_ranks_declared: has every rank declared its work finished in this run?
kit::all_ranks_declared() {
  local rank
  for (( rank = 0; rank < KIT_WORLD_SIZE; rank++ )); do
    kit::declared_finished "${rank}" || return 1
  done
}

# kit::rank_ends: the launchers' records of how each rank ended in this run.
kit::rank_ends() {
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
    kit::append_run "${KIT_RUN}" killed -1 "$(kit::checkpoint_step)" null
  done
  KIT_START_STEP="$(kit::checkpoint_step)"
  KIT_RUN_ADVANCED=true
  KIT_END_CODE=
}

# kit::conclude: what the run's end (KIT_STEP_RC) means (finished, requeued,
# failed, ...), recorded in runs.jsonl; exits with the job's code.
kit::conclude() {
  local -r rc="${KIT_STEP_RC}"
  if [[ -e "${KIT_HANG_DIR}/report" ]]; then
    KIT_SUSPECT_NODE="$(sed -n 's/^node=//p' "${KIT_HANG_DIR}/report")"
    kit::record_run hang "${rc}"
    kit::log "the step ended after a hang: every rank's stacks are in ${KIT_HANG_DIR}"
    if ! kit::requeue "the step was stopped because a rank made no progress" "${KIT_SUSPECT_NODE}"; then
      exit "${KIT_END_CODE:-${KIT_EXIT_HUNG}}"
    fi
  elif [[ -e "${KIT_FINISHED_FILE}" ]] || kit::all_ranks_declared; then
    kit::conclude_declared
  elif (( KIT_WARNED && rc == 0 )) && kit::all_ranks_done; then
    # Warned, but no command was given the signal or stopped: it ended its work by itself.
    : >"${KIT_FINISHED_FILE}"
    kit::record_run finished 0
    kit::log "step ended with exit 0 after the warning, every command by itself; the work is finished"
  elif (( KIT_WARNED )); then
    kit::conclude_warned
  elif (( KIT_STOPPING )); then
    kit::record_run stopped "${rc}"
    kit::log "step ended with exit ${rc} after a stop signal; the work is not finished"
    if (( rc == 0 )); then KIT_STEP_RC=143; fi
  elif [[ -e "${KIT_JOB_DIR}/function.pkl" ]] && (( rc == 0 )); then
    # A function job (kit.submit, kit.map) is finished only when every rank returned
    # (declared above): a rank that left through os._exit(0) did not.
    kit::record_run incomplete 0
    kit::log "srun exited 0, but not every rank returned from the function (a rank exited without returning): the work is not finished"
    KIT_STEP_RC="${KIT_EXIT_INCOMPLETE}"
  elif (( rc == 0 )) && kit::all_ranks_done; then
    : >"${KIT_FINISHED_FILE}"
    kit::record_run finished 0
    kit::log "step ended with exit 0; the work is finished"
  elif (( rc == 0 )); then
    kit::record_run incomplete 0
    kit::log "srun exited 0, but not every rank's command ended with 0 by itself (a node failed, or a task was killed): the work is not finished"
    KIT_STEP_RC="${KIT_EXIT_INCOMPLETE}"
  else
    kit::record_run failed "${rc}"
    kit::log "step ended with exit ${rc}"
  fi
  exit "${KIT_STEP_RC}"
}

# kit::conclude_declared: the command said its work is done (FINISHED, or every
# rank through kit.train.progress.finished()). A rank that then died of a signal
# (torch's teardown aborts now and then: 134) is told, but the work stays
# finished and the job ends COMPLETED, so that what waits for it (--after) runs.
# A code of the command's own (1-127: a wrapper's next stage failed) still fails
# the job.
kit::conclude_declared() {
  local -r rc="${KIT_STEP_RC}"
  if (( rc == 0 || rc > 128 )); then
    if [[ ! -e "${KIT_FINISHED_FILE}" ]]; then : >"${KIT_FINISHED_FILE}"; fi
  fi
  if (( rc > 128 )); then
    kit::record_run finished 0 "${rc}"
    kit::log "step ended with exit ${rc} (a signal) after its work was declared finished: a failure in teardown; the work is finished: exiting 0"
    KIT_STEP_RC=0
  elif (( rc != 0 )); then
    kit::record_run failed "${rc}"
    kit::log "step ended with exit ${rc} after the work was declared finished: a command failed after it"
  else
    kit::record_run finished 0
    kit::log "step ended with exit 0; the work is finished"
  fi
}

# kit::conclude_warned: the run ended after the time-limit warning: requeued if
# it may be; else stopped before the work was done: never report success, and
# blame no command for the signal kit or Slurm stopped it with.
kit::conclude_warned() {
  local -r rc="${KIT_STEP_RC}"
  kit::record_run warned "${rc}"
  if ! kit::requeue "step ended with exit ${rc} after the warning"; then
    if [[ -n "${KIT_END_CODE}" ]]; then
      KIT_STEP_RC="${KIT_END_CODE}"
    elif KIT_FIRST_RC="$(kit::first_failure)"; then
      KIT_STEP_RC="${KIT_FIRST_RC}"
    else
      KIT_STEP_RC="${KIT_EXIT_BUDGET_SPENT}"
    fi
  fi
}
