# shellcheck shell=bash
# ---- prelaunch_watchdog.sh (sourced by prelaunch.sh): the hang watchdog — each rank's
# progress read, a suspect named, every rank's stacks collected, the step stopped.
[[ -z "${KIT_PRELAUNCH_WATCHDOG_SH-}" ]] || return 0  # sourced once
readonly KIT_PRELAUNCH_WATCHDOG_SH=1
# kit::_saving: true when some rank's progress file says it is saving a checkpoint.
kit::_saving() {
  local file line
  for file in "${KIT_PROGRESS_DIR}"/rank-*; do
    line=""
    { read -r line <"${file}"; } 2>/dev/null || true
    if [[ "${line}" == checkpoint* ]]; then return 0; fi
  done
  return 1
}

# The watchdog polls every KIT_HANG_TIMEOUT/60 s (1 to 15 s): a hang is declared
# at most 1/60 of the timeout late, and a 64-node job with the default timeout
# costs the file system 64 reads every 15 s, not every second.
readonly KIT_WATCH_EVERY=$(( KIT_HANG_TIMEOUT < 120 ? 1 : (KIT_HANG_TIMEOUT > 900 ? 15 : KIT_HANG_TIMEOUT / 60) ))

# kit::_progress_times WITH_JOINED: each rank's progress file time (µs) in
# KIT_TOUCHED[rank], and with WITH_JOINED=1 the ranks that joined the
# rendezvous in KIT_JOINED[rank]. Each file is looked up by its name (find with
# the files as its starting points: one stat each, no listing of the
# directory): on a shared file system a poll costs one metadata read per rank.
kit::_progress_times() {
  local name stamp sec frac rank
  local -a paths=()
  KIT_TOUCHED=() KIT_JOINED=()
  for (( rank = 0; rank < KIT_WORLD_SIZE; rank++ )); do
    paths+=("${KIT_PROGRESS_DIR}/rank-${rank}")
    if (( $1 )); then paths+=("${KIT_PROGRESS_DIR}/joined-${rank}"); fi
  done
  while read -r name stamp; do
    case "${name}" in
      rank-*)
        sec="${stamp%.*}" frac="${stamp#*.}000000"
        KIT_TOUCHED["${name#rank-}"]=$(( sec * 1000000 + 10#${frac:0:6} )) ;;
      joined-*) KIT_JOINED["${name#joined-}"]=1 ;;
    esac
  done < <(find "${paths[@]}" -maxdepth 0 -printf '%f %T@\n' 2>/dev/null)
}

# kit::watch_progress STEP_PID: the hang watchdog, in the background while the
# step runs. Each rank's command touches its KIT_PROGRESS_FILE as it makes
# progress; once any rank of this job has ever done so, a rank whose file is
# older than KIT_HANG_TIMEOUT (or that has not touched it KIT_FIRST_PROGRESS_TIMEOUT
# after the step started) stops the run. While any rank's file has a first
# line starting with "checkpoint" (a save), every rank gets
# KIT_FIRST_PROGRESS_TIMEOUT instead: the others wait for the saver in a
# barrier. The watchdog asks every rank for its stacks (the launchers
# answer), names the suspect, then lets the launchers stop their commands.
kit::watch_progress() {
  local -r step_pid="$1" start_us="${EPOCHREALTIME/./}"
  local -r first_us=$(( KIT_FIRST_PROGRESS_TIMEOUT * 1000000 ))
  local armed=0 now
  kit::helper_traps
  if [[ -e "${KIT_JOB_DIR}/progress/seen" ]]; then armed=1; fi
  while [[ -z "${KIT_SUSPECT}" ]]; do
    kit::nap "${KIT_WATCH_EVERY}"
    kit::running "${step_pid}" || return 0
    now="${EPOCHREALTIME/./}"
    # Who joined the rendezvous matters only once no rank has reported progress in time.
    kit::_progress_times $(( ! armed && now - start_us > first_us ))
    if (( ! armed )); then
      if (( ${#KIT_TOUCHED[@]} == 0 )); then
        kit::_rendezvous_suspect "${start_us}"
        continue
      fi
      armed=1
      : >"${KIT_JOB_DIR}/progress/seen"
    fi
    kit::_progress_suspect "${start_us}"
  done
  kit::_stop_the_hang "${step_pid}"
}

# kit::_rendezvous_suspect STEP_START_US: no rank has reported progress, so only the
# rendezvous tells: a rank that has not joined it (kit::watch_rendezvous) while
# another has, KIT_FIRST_PROGRESS_TIMEOUT after the step started, hangs before it.
kit::_rendezvous_suspect() {
  local -r start_us="$1" now="${EPOCHREALTIME/./}"
  local rank
  if (( now - start_us > KIT_FIRST_PROGRESS_TIMEOUT * 1000000 && ${#KIT_JOINED[@]} > 0 && ${#KIT_JOINED[@]} < KIT_WORLD_SIZE )); then
    for (( rank = 0; rank < KIT_WORLD_SIZE; rank++ )); do
      [[ -n "${KIT_JOINED[${rank}]-}" ]] || break
    done
    KIT_SUSPECT="${rank}" KIT_SUSPECT_LAST="${start_us}"
    KIT_WHY="has not joined the rendezvous (port ${MASTER_PORT}) $(( (now - start_us) / 1000000 )) s after the step started, while ${#KIT_JOINED[@]} rank(s) wait in it"
  fi
  return 0
}

# kit::_progress_suspect STEP_START_US: the rank whose progress is oldest past
# KIT_HANG_TIMEOUT (KIT_FIRST_PROGRESS_TIMEOUT for one that never reported, and
# for all while a rank saves a checkpoint), if any, in KIT_SUSPECT.
kit::_progress_suspect() {
  local -r start_us="$1" now="${EPOCHREALTIME/./}"
  local -r hang_us=$(( KIT_HANG_TIMEOUT * 1000000 )) first_us=$(( KIT_FIRST_PROGRESS_TIMEOUT * 1000000 ))
  local rank last limit saving=""
  for (( rank = 0; rank < KIT_WORLD_SIZE; rank++ )); do
    if [[ -n "${KIT_TOUCHED[${rank}]-}" ]]; then
      last="${KIT_TOUCHED[${rank}]}" limit="${hang_us}"
    else
      last="${start_us}" limit="${first_us}"
    fi
    (( now - last > limit )) || continue
    # A rank that declared its work finished waits for the others, rightly.
    if kit::declared_finished "${rank}"; then continue; fi
    # A save on any rank: the longer first-progress timeout applies to all.
    if (( now - last <= first_us )); then
      if [[ -z "${saving}" ]]; then
        saving=no
        if kit::_saving; then saving=yes; fi
      fi
      [[ "${saving}" == no ]] || continue
    fi
    if [[ -z "${KIT_SUSPECT}" ]] || (( last < KIT_SUSPECT_LAST )); then KIT_SUSPECT="${rank}" KIT_SUSPECT_LAST="${last}"; fi
  done
  KIT_WHY="made no progress for $(( (now - KIT_SUSPECT_LAST) / 1000000 )) s"
  return 0
}

# kit::_stop_the_hang STEP_PID: every rank's stacks asked for (the launchers answer),
# the report written, then the launchers stop their commands; a step that outlives
# that is killed.
kit::_stop_the_hang() {
  local -r step_pid="$1"
  local tries name
  mkdir -p "${KIT_HANG_DIR}"
  printf 'rank=%s\n' "${KIT_SUSPECT}" >"${KIT_HANG_DIR}/request"
  kit::log "rank ${KIT_SUSPECT} ${KIT_WHY}: collecting every rank's stacks"
  for (( tries = 0; tries < 150; tries++ )); do
    [[ "$(find "${KIT_HANG_DIR}" -maxdepth 1 -name 'rank-*.txt' | wc -l)" -lt "${KIT_WORLD_SIZE}" ]] || break
    kit::nap 0.1
  done
  kit::_hang_report "${KIT_SUSPECT}" "${KIT_WHY}"
  : >"${KIT_HANG_DIR}/stop"
  for (( tries = 0; tries < 30; tries++ )); do
    kit::running "${step_pid}" || return 0
    kit::nap 1
  done
  kit::log "the job step did not end after the hang: killing it"
  squeue --steps --noheader --format=%i --jobs="${SLURM_JOB_ID}" 2>/dev/null | while read -r name; do
    case "${name}" in *.batch | *.extern) ;; *) scancel --signal=KILL "${name}" || true ;; esac
  done
}

# Where a rank's main thread waits for the others (kit::_in_collective).
readonly KIT_WAITING_FRAMES='\\((.*/)?(torch/(distributed|autograd|utils/data|nn/parallel)/|torch/_tensor\\.py|(multiprocessing/|queue\\.py|threading\\.py|selectors\\.py))[^:]*:[0-9]+\\)'

# kit::_in_collective DUMP: the rank's Python stacks show it waiting for the others
# (a collective, a barrier, a rendezvous, DDP's backward, a DataLoader).
#
# What counts is where each of the rank's Python processes is now: the
# innermost frame of its main thread (DataLoader workers left out: they are
# the rank's helpers). A rank waits when every one of them is inside torch's
# waiting places (torch.distributed, autograd's backward under DDP, a
# DataLoader's queue) or Python's (threading, queue, multiprocessing); a rank
# with one in code of its own (a sleep, a busy loop, a blocking read) is stuck
# there. Stacks with no main-thread frame: any torch.distributed frame counts.
kit::_in_collective() {
  local rc=0
  awk -v wait="${KIT_WAITING_FRAMES}" '
    function done() { if (first != "" && !worker) { seen++; if (first !~ wait) own++ } first = ""; main = 0; worker = 0 }
    /^--- py-spy dump/ { done(); next }
    /^Thread .*"MainThread"/ { main = 1; next }
    /^Thread / { main = 0; next }
    main && first == "" && /^    [^ ]/ { first = $0 }
    /torch\/utils\/data\/_utils\/worker\.py/ { worker = 1 }
    END { done(); if (!seen) exit 2; exit (own > 0) }' "$1" || rc=$?
  if (( rc == 2 )); then
    grep -q -E '\((.*/)?torch/distributed/[^:]*:[0-9]+\)' "$1"
  else
    return "${rc}"
  fi
}

# kit::_hang_report RANK WHY: name the suspect in KIT_HANG_DIR/report. A
# rank whose process is stopped (T) or stuck in the kernel (D) is the likelier
# culprit than the rank that merely reported last: the others wait on it. So
# is a rank in code of its own while the other ranks wait for it (in a
# collective, DDP's backward, a DataLoader: kit::_in_collective).
kit::_hang_report() {
  local rank="$1" why="$2" node="" dump last="" file summary
  local -a waiting=() elsewhere=()
  dump="$(grep -l -E '^process [0-9]+ state [TtD] ' "${KIT_HANG_DIR}"/rank-*.txt 2>/dev/null | awk 'NR == 1')" || true
  if [[ -n "${dump}" ]]; then
    rank="${dump##*/rank-}" rank="${rank%.txt}"
    why="its process is $(grep -m1 -o -E '^process [0-9]+ state [TtD] \([a-z ]+\)' "${dump}" | sed 's/^process [0-9]* state //')"
  else
    for file in "${KIT_HANG_DIR}"/rank-*.txt; do
      if [[ ! -e "${file}" ]] || ! grep -q '^--- py-spy dump' "${file}"; then continue; fi
      if kit::_in_collective "${file}"; then waiting+=("${file}"); else elsewhere+=("${file}"); fi
    done
    if (( ${#waiting[@]} > 0 && ${#elsewhere[@]} > 0 )) && [[ " ${elsewhere[*]} " != *"/rank-${rank}.txt "* ]]; then
      dump="$(printf '%s\n' "${elsewhere[@]}" | sort -V | awk 'NR == 1')"
      rank="${dump##*/rank-}" rank="${rank%.txt}"
      why="is in code of its own while ${#waiting[@]} rank(s) wait for it (its stacks: ${dump##*/})"
    elif (( ${#waiting[@]} + ${#elsewhere[@]} == 0 && KIT_WORLD_SIZE > 1 )) && [[ "${why}" == "made no progress"* ]]; then
      rank=unknown  # progress alone: every rank stops at once in a collective, the one that waits too
    fi
  fi
  node="$(kit::node_of "${rank}")"
  { read -r last <"${KIT_PROGRESS_DIR}/rank-${rank}"; } 2>/dev/null || true
  summary="rank ${rank} on ${node:-?} ${why} (last progress: ${last:-none})"
  if [[ "${rank}" == unknown ]]; then
    summary="no rank named: the ranks ${why}, and no rank's Python stacks could be taken (py-spy, in kit-slurm[train], where the command runs; see hang/${KIT_HANG_DIR##*/}/rank-*.txt)"
  fi
  printf 'rank=%s\nnode=%s\nsummary=%s\n' "${rank}" "${node}" "${summary}" >"${KIT_HANG_DIR}/.report"
  mv -f "${KIT_HANG_DIR}/.report" "${KIT_HANG_DIR}/report"
  kit::log "hang: $(sed -n 's/^summary=//p' "${KIT_HANG_DIR}/report"); stopping the job step"
}

# kit::watch_stragglers STEP_PID: --on-straggler requeue or restart, in the background while the step runs (a
# restart left). Once the first node's exporter names a straggler (progress/r<K>/straggler: kit.jobdir.stragglers),
# the command is warned as before the time limit — it checkpoints and stops —, and the step stopped if it still
# runs KIT_STRAGGLER_GRACE s later; the ending (straggler=1) requeues the job without the straggler's node, or under
# restart starts the next run in this allocation where the partition has no node to spare for it.
readonly KIT_STRAGGLER_GRACE=120
kit::watch_stragglers() {
  local -r step_pid="$1"
  local waited
  kit::helper_traps
  until [[ -e "${KIT_PROGRESS_DIR}/straggler" ]]; do
    kit::running "${step_pid}" || return 0
    kit::nap 2
  done
  : >"${KIT_PROGRESS_DIR}/straggler-stop"
  kit::log "$(kit::field "${KIT_PROGRESS_DIR}/straggler" why): warning the command to checkpoint and stop (--on-straggler ${KIT_ON_STRAGGLER}: the next run leaves $(kit::field "${KIT_PROGRESS_DIR}/straggler" node) out where the partition can spare it)"
  kit::pass_warning
  for (( waited = 0; waited < KIT_STRAGGLER_GRACE; waited++ )); do
    kit::running "${step_pid}" || return 0
    kit::nap 1
  done
  kit::log "the job step runs on ${KIT_STRAGGLER_GRACE} s after the warning: stopping it"
  : >"${KIT_PROGRESS_DIR}/.stop"
  mv -f "${KIT_PROGRESS_DIR}/.stop" "${KIT_PROGRESS_DIR}/stop"
}
