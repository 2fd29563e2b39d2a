#!/usr/bin/env bash
# launcher.sh: runs once per task of a kit job's srun step, as kit ships it; the job's values are
# in job.env beside it.
#
# Maps Slurm's task variables to the ones torch.distributed and Lightning
# read; on local rank 0 starts the node's sidecars; runs the command in the
# background and waits for it, passing on TERM, INT and the warning signal;
# on exit stops every background process it started. Its exit code is the
# command's.
# shellcheck disable=SC2317  # functions run from traps look unreachable to shellcheck
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

# This script adopts every process its command orphans (a child subreaper):
# a daemon that leaves the session and clears its environment (`env -i
# setsid ...`) stays below it, so the teardown finds it in the process tree.
# prctl(PR_SET_CHILD_SUBREAPER) holds across exec: set it, then run this
# script again. Without python3 or perl (an image with neither) the token
# sweep below still finds what keeps its environment.
# Python ignores SIGPIPE and SIGXFSZ at its start, and ignored signals survive
# exec: the helper puts back what this script was started with (SigIgn), so the
# command gets the signal dispositions it would have had.
# This task's first line (progress/r<K>/task-<rank>: the time from the step's
# start to here is srun's launch, and under an image the container's start).
export KIT_TASK_START="${KIT_TASK_START:-${EPOCHREALTIME/,/.}}"
if [[ -z "${KIT_SUBREAPER_SET-}" ]]; then
  export KIT_SUBREAPER_SET="$$"
  # perl first: it starts in a tenth of python's time (a node's start is CPU
  # the whole allocation waits on) and leaves signal dispositions alone.
  if [[ "${HOSTTYPE-}" == @(x86_64|aarch64) ]] && command -v perl >/dev/null 2>&1; then
    exec perl -e 'syscall($ARGV[0] eq "x86_64" ? 157 : 167, 36, 1, 0, 0, 0); shift; exec { $ARGV[0] } @ARGV' \
      "${HOSTTYPE}" "${BASH}" "$0" "$@"
  elif command -v python3 >/dev/null 2>&1; then
    KIT_SIGIGN=0
    while read -r key value; do
      if [[ "${key}" == SigIgn: ]]; then KIT_SIGIGN="${value}"; fi
    done </proc/$$/status
    exec python3 -S -c 'import os, signal, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
except Exception:
    pass
ignored = int(sys.argv[1], 16)
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_IGN if ignored >> (sig - 1) & 1 else signal.SIG_DFL)
os.execv(sys.argv[2], sys.argv[2:])' "${KIT_SIGIGN}" "${BASH}" "$0" "$@"
  fi
fi
unset KIT_SUBREAPER_SET
readonly KIT_STARTED_AT="${KIT_TASK_START}"
unset KIT_TASK_START

# srun starts it by its path in the job directory (inside a container too: pyxis mounts it there).
if [[ "$0" == */* ]]; then readonly KIT_SCRIPTS_DIR="${0%/*}"; else readonly KIT_SCRIPTS_DIR=.; fi
# shellcheck source=job.env
source "${KIT_SCRIPTS_DIR}/job.env"
source "${KIT_SCRIPTS_DIR}/lib.sh"
kit::lib_init

# Slurm's task variables, under the names torch.distributed and Lightning read (NAME=SOURCE each).
readonly -a KIT_RANK_MAPPING
for kit_kv in "${KIT_RANK_MAPPING[@]}"; do
  kit_source="${kit_kv#*=}"
  [[ -n "${!kit_source-}" ]] || kit::die "${kit_source} is not set: launcher.sh runs as a task of an srun step"
  export "${kit_kv%%=*}=${!kit_source}"
done
unset kit_kv kit_source
KIT_WHO="rank ${RANK}"
: "${MASTER_ADDR:?is not set: launcher.sh runs in the step that prelaunch.sh starts}"
: "${MASTER_PORT:?is not set: launcher.sh runs in the step that prelaunch.sh starts}"
: "${KIT_LOG_DIR:?is not set: launcher.sh runs in the step that prelaunch.sh starts}"
: "${KIT_HANG_DIR:?is not set: launcher.sh runs in the step that prelaunch.sh starts}"

# One task per node (a per-node launcher such as torchrun): torchrun started here joins one
# world across every node of the step through its PET_* variables (its options' defaults).
readonly KIT_PER_NODE_LAUNCHER KIT_NPROC_PER_NODE
if (( KIT_PER_NODE_LAUNCHER )); then
  export PET_NNODES="${PET_NNODES:-${WORLD_SIZE}}"
  export PET_NODE_RANK="${PET_NODE_RANK:-${NODE_RANK}}"
  export PET_MASTER_ADDR="${PET_MASTER_ADDR:-${MASTER_ADDR}}"
  export PET_MASTER_PORT="${PET_MASTER_PORT:-${MASTER_PORT}}"
  if [[ -n "${KIT_NPROC_PER_NODE}" ]]; then export PET_NPROC_PER_NODE="${PET_NPROC_PER_NODE:-${KIT_NPROC_PER_NODE}}"; fi
fi

# Lightning ignores Slurm in jobs named "bash" or "interactive" and would run
# every task as rank 0; with these variables it reads the ranks above instead.
case "${SLURM_JOB_NAME-}" in
  bash | interactive) export TORCHELASTIC_RUN_ID="${TORCHELASTIC_RUN_ID:-kit-${SLURM_JOB_ID}}" ;;
esac
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
# gloo binds the address its host name resolves to, which on many nodes is a loopback one
# (Debian's /etc/hosts: 127.0.1.1), so ranks on other nodes cannot reach it: unless the job
# chose, it uses the interface this node reaches MASTER_ADDR through (read from
# /proc/net/route: images without `ip` too). NCCL picks its own interfaces and is left to them.
if [[ -z "${GLOO_SOCKET_IFNAME-}" && "${MASTER_ADDR}" != 127.* ]]; then
  kit::route_iface "${MASTER_ADDR}"
  if [[ -n "${KIT_ROUTE_IFACE}" ]]; then export GLOO_SOCKET_IFNAME="${KIT_ROUTE_IFACE}"; fi
fi
# In a container, kit's runtime lives at /opt/kit (built in, or mounted by kit launch).
if [[ "${KIT_CONTAINER:-0}" == 1 && -d /opt/kit/python && ":${PYTHONPATH-}:" != *:/opt/kit/python:* ]]; then
  export PYTHONPATH="/opt/kit/python${PYTHONPATH:+:${PYTHONPATH}}"
fi
export PYTHONUNBUFFERED="${PYTHONUNBUFFERED:-1}"
if kit::truthy "${DEBUG:-0}"; then set -x; fi

# The command; a sweep task's own, its parameter values in place (NUL-separated words).
readonly KIT_SWEEP_TASK
if (( KIT_SWEEP_TASK )); then mapfile -d '' -t KIT_COMMAND <"${KIT_JOB_DIR}/command"; fi
readonly KIT_COMMAND
readonly KIT_STOP_GRACE
readonly KIT_PREFLIGHT KIT_PREFLIGHT_WAIT=300  # --preflight; how long the first node waits for every node's record
readonly KIT_PREFLIGHT_NETWORK  # --preflight-network: the nodes' local ranks 0 test the links together
# Sidecars, three words each: name, a program that must exist ('' for none),
# and the bash command that runs it. Local rank 0 starts them, one per node.
readonly -a KIT_SIDECARS
KIT_NODE="${SLURMD_NODENAME:-$(hostname)}"
export KIT_NODE_LOG_PREFIX="${KIT_LOG_DIR}/${KIT_NODE}.r${KIT_RESTART:-0}"
# Where the ranks of this node leave training metrics for the node's exporter.
export KIT_METRICS_DIR="${KIT_JOB_DIR}/metrics/${KIT_NODE}"
readonly KIT_RANK_LOG="${KIT_LOG_DIR}/rank-${RANK}.r${KIT_RESTART:-0}.log"
# The command touches this file as it makes progress (see kit::answer_hang).
export KIT_PROGRESS_FILE="${KIT_PROGRESS_DIR:?is not set: launcher.sh runs in the step that prelaunch.sh starts}/rank-${RANK}"

# kit::container_mode: how this task's container holds the image, in KIT_MODE:
# "squashfuse" (pyxis with use_squashfuse=1: the squashfs read through
# squashfuse, never unpacked), "create" (enroot create's unpacked copy; the
# stand-in's), "host" without an image. The root's file system does not tell
# (enroot lays a kernel overlay over the squashfuse mount); the runtime's
# squashfuse daemon does: it runs below the node's first task of the step, so
# it is found below this task's slurmstepd, before any command has started.
KIT_MODE=host
kit::container_mode() {
  local pid comm
  [[ "${KIT_CONTAINER:-0}" == 1 ]] || return 0
  KIT_MODE=create
  kit::tree "${PPID}" all
  for pid in "${KIT_TREE[@]}"; do
    { read -r comm <"${KIT_PROC}/${pid}/comm"; } 2>&"${KIT_NULL_FD}" || continue
    if [[ "${comm}" == squashfuse ]]; then KIT_MODE=squashfuse; return 0; fi
  done
}

# kit::descendants PID: PID and every process below it, one per line.
kit::descendants() {
  kit::tree "$1"
  printf '%s\n' "${KIT_TREE[@]}"
}

# kit::dump_stacks PID: what every process of the command is doing: its
# state and kernel wait channel, then Python stacks through py-spy (which
# reads a process without its cooperation), or kernel stacks without it.
kit::dump_stacks() {
  local pid exe spy progress=""
  local -a pids
  mapfile -t pids < <(kit::descendants "$1")
  { read -r progress <"${KIT_PROGRESS_FILE}"; } 2>&"${KIT_NULL_FD}" || true
  printf 'rank=%s node=%s time=%s\nprogress=%s\n' "${RANK}" "${KIT_NODE}" "$(printf '%(%Y-%m-%dT%H:%M:%S%z)T' -1)" "${progress}"
  for pid in "${pids[@]}"; do
    printf 'process %s state %s wchan=%s: %s\n' "${pid}" \
      "$(awk '$1 == "State:" { $1 = ""; sub(/^ /, ""); print }' "${KIT_PROC}/${pid}"/status 2>&"${KIT_NULL_FD}")" \
      "$(cat "${KIT_PROC}/${pid}"/wchan 2>&"${KIT_NULL_FD}")" "$(kit::cmdline "${pid}")"
  done
  spy="${KIT_PY_SPY:-$(command -v py-spy || true)}"
  if [[ -z "${spy}" ]]; then
    printf 'stacks: py-spy not found (pip install py-spy where the command runs): kernel stacks only\n'
  fi
  for pid in "${pids[@]}"; do
    exe="$(readlink "${KIT_PROC}/${pid}"/exe 2>&"${KIT_NULL_FD}")" || continue
    if [[ -n "${spy}" && "${exe##*/}" == python* ]]; then
      printf '\n--- py-spy dump --pid %s\n' "${pid}"
      timeout 20 "${spy}" dump --nonblocking --pid "${pid}" 2>&1 || printf '(py-spy failed: exit %s)\n' "$?"
    elif [[ -z "${spy}" ]]; then
      printf '\n--- /proc/%s/stack\n' "${pid}"
      cat "${KIT_PROC}/${pid}"/stack 2>&1 || true
    fi
  done
}

# kit::answer_hang: in the background while the command runs. When the
# progress watchdog (prelaunch) asks, write this rank's stacks, wait for the
# watchdog to name the suspect, then stop the command (briefly: it is stuck).
kit::answer_hang() {
  local tries
  kit::helper_traps
  until [[ -e "${KIT_HANG_DIR}/request" ]]; do kit::nap 1; done
  kit::dump_stacks "${KIT_MAIN_PID}" >"${KIT_HANG_DIR}/.rank-${RANK}.txt" 2>&1 || true
  mv -f "${KIT_HANG_DIR}/.rank-${RANK}.txt" "${KIT_HANG_DIR}/rank-${RANK}.txt"
  for (( tries = 0; tries < 300; tries++ )); do
    [[ ! -e "${KIT_HANG_DIR}/stop" ]] || break
    kit::nap 0.1
  done
  KIT_STOP_TIMEOUT=2 kit::stop "${KIT_MAIN_PID}"
}

# kit::deliver SIG PID: send the warning once PID catches it (a trainer
# installs its handler only after its imports). A command that never does is
# never sent it: the default action of USR1 is to die, and a command that
# cannot act on the warning must not be killed by it. prelaunch stops such a
# command shortly before the time limit instead (progress/r<K>/stop) when a
# restart is left. A warning given is marked (progress/r<K>/warned-<rank>):
# a command that then exits 0 may have stopped early, not finished.
kit::deliver() {
  local -r sig="$1" pid="$2"
  local -r bit=$(( $(kill -l "${sig}") - 1 ))
  local key value rest mine caught own tries=0 told=0
  # A background subshell gets default signal actions: a second warning sent
  # to the task's process group would kill it before it delivered the first.
  kit::helper_traps
  # Until it execs, the command's process is a fork of this script and shows
  # this script's handlers: it counts only once its command line is its own.
  mine="$(tr '\0' ' ' <"${KIT_PROC}/$$/cmdline")"
  while [[ ! -e "${KIT_PROGRESS_DIR}/stop" ]]; do
    # Its command line first, then its handlers: read the other way round, the handlers could be the fork's (this
    # script's, before exec) and the command line the new program's, whose trap is not set yet.
    own=0
    if [[ "$(tr '\0' ' ' <"${KIT_PROC}/${pid}"/cmdline 2>&"${KIT_NULL_FD}")" != "${mine}" ]]; then own=1; fi
    caught=""
    while read -r key value rest; do
      if [[ "${key}" == SigCgt: ]]; then caught="${value}"; fi
    done 2>&"${KIT_NULL_FD}" <"${KIT_PROC}/${pid}"/status || { kit::log "the command (pid ${pid}) is gone: SIG${sig} not passed on"; return 0; }
    [[ -n "${caught}" ]] || { kit::log "the command (pid ${pid}) shows no signal handlers: SIG${sig} not passed on"; return 0; }
    if (( own && (16#${caught} >> bit) & 1 )); then
      : >"${KIT_PROGRESS_DIR}/warned-${RANK}"
      if kill -s "${sig}" "${pid}" 2>&"${KIT_NULL_FD}"; then
        kit::log "sent SIG${sig} to the command (pid ${pid})"
      else
        rm -f "${KIT_PROGRESS_DIR}/warned-${RANK}"
        kit::log "the command (pid ${pid}) is gone: SIG${sig} not passed on"
      fi
      return 0
    fi
    if (( ! told )) && { (( ++tries >= ${KIT_SIGNAL_GRACE:-30} * 10 )) || kit::_limit_near; }; then
      told=1
      kit::log "the command (pid ${pid}) has no handler for SIG${sig}: not sending it (it would end the command); it runs on, and with a restart left kit stops it shortly before the time limit and requeues the job"
    fi
    kit::nap 0.1
  done
  if (( ! told )); then
    kit::log "the command (pid ${pid}) has no handler for SIG${sig}: not sending it (it would end the command)"
  fi
}

# kit::_limit_near: whether the time prelaunch gave for the warning's wait has come (progress/r<K>/limit-near:
# shortly before the time limit; absent for a straggler's warning, or where Slurm did not answer).
kit::_limit_near() {
  local by="" now
  [[ -r "${KIT_PROGRESS_DIR}/limit-near" ]] || return 1
  read -r by <"${KIT_PROGRESS_DIR}/limit-near" || true
  printf -v now '%(%s)T' -1
  [[ "${by}" =~ ^[0-9]{1,12}$ ]] && (( now >= by ))
}
# kit::watch_prelaunch: act on what prelaunch passes on in progress/r<K>/:
# the warning (kit::pass_warning), given to the command once it handles it,
# and a stop before the time limit (kit::stop_before_limit), which stops the
# command as a TERM to this script would.
kit::watch_prelaunch() {
  local -r sig="${KIT_WARNING_SIGNAL:-USR1}"
  local warned=0
  kit::helper_traps
  until [[ -e "${KIT_PROGRESS_DIR}/stop" ]]; do
    if (( ! warned )) && [[ -e "${KIT_PROGRESS_DIR}/warning" ]]; then
      warned=1
      kit::log "prelaunch warns the command (the time limit is near, or a straggler with --on-straggler requeue): passing SIG${sig} to it once it handles it"
      kit::deliver "${sig}" "${KIT_MAIN_PID}"
    else
      kit::nap 1
    fi
  done
  kit::log "prelaunch stops the command before the time limit"
  kill -s TERM "$$"
}
# kit::watch_rendezvous: mark this rank as joined (progress/r<K>/joined-<rank>)
# once a process of its command listens on or connects to MASTER_PORT: it has
# reached torch.distributed's rendezvous (the TCP store rank 0 serves there).
# The hang watchdog compares ranks: one that has not joined while another has,
# KIT_FIRST_PROGRESS_TIMEOUT after the step started, hangs before it. Looks
# every 2 s (every 10 s after that timeout: a rank late under load is still
# marked, so the others' rule can fire) until the rank joins or reports
# progress (it got past: no look at its sockets then, whose three programs
# would take the CPU of every node's start); the task's teardown ends it.
kit::watch_rendezvous() {
  local -r slow=$(( SECONDS + KIT_FIRST_PROGRESS_TIMEOUT + 10 ))
  local port pid inodes
  printf -v port ':%04X' "${MASTER_PORT}"
  local -a fds
  kit::helper_traps
  while true; do
    if (( SECONDS < slow )); then kit::nap 2; else kit::nap 10; fi
    [[ ! -e "${KIT_PROGRESS_FILE}" ]] || return 0
    kit::tree "${KIT_MAIN_PID}"
    fds=()
    for pid in "${KIT_TREE[@]}"; do fds+=("${KIT_PROC}/${pid}/fd"); done
    inodes=" $(find "${fds[@]}" -maxdepth 1 -lname 'socket:*' -printf '%l ' 2>&"${KIT_NULL_FD}" | tr -d 'socket:[]') "
    if awk -v p="${port}" -v mine="${inodes}" 'FNR > 1 && ($2 ~ p"$" || $3 ~ p"$") && index(mine, " " $10 " ") { found = 1 }
        END { exit !found }' "${KIT_PROC}"/net/tcp "${KIT_PROC}"/net/tcp6 2>&"${KIT_NULL_FD}"; then
      : >"${KIT_PROGRESS_DIR}/joined-${RANK}"
      return 0
    fi
  done
}
KIT_WARNING_PENDING=0
# kit::kill_after SECONDS PID: KILL the command's group when it has not
# stopped SECONDS after the stop signal (a DDP rank whose peer is gone hangs
# in its teardown collective): this launcher then tears its sidecars down
# long before Slurm's KillWait (30 s by default) kills everything.
kit::kill_after() {
  local -r grace="$1" pid="$2"
  kit::helper_traps
  kit::nap "${grace}"
  kit::running "${pid}" || return 0
  kit::log "the command did not stop ${grace} s after the stop signal: killing it"
  kill -KILL -- "-${pid}" 2>&"${KIT_NULL_FD}" || kill -KILL "${pid}" 2>&"${KIT_NULL_FD}" || true
}
kit::on_signal() {
  if [[ "$1" != "${KIT_WARNING_SIGNAL:-USR1}" ]]; then
    if (( ! KIT_STOPPING )) && [[ -n "${KIT_MAIN_PID}" ]]; then
      kit::kill_after "${KIT_STOP_GRACE}" "${KIT_MAIN_PID}" <&"${KIT_NULL_FD}" &
      KIT_BG_PIDS+=("$!")
    fi
    KIT_STOPPING=1
    kit::forward "$1"
  elif [[ -n "${KIT_MAIN_PID}" ]]; then
    kit::log "got SIG$1: passing it to the command once it handles it"
    kit::deliver "$1" "${KIT_MAIN_PID}" <&"${KIT_NULL_FD}" &
    KIT_BG_PIDS+=("$!")
  else
    KIT_WARNING_PENDING=1
  fi
}
# kit::preflight: --preflight: this node checked before any command starts (python -m kit.preflight: its
# GPUs, a burn-in), the first node's local rank 0 judges every node's record, and each task waits for that
# verdict (progress/r<run>/preflight). Status 1: a node failed (the verdict names it), or no verdict came.
kit::preflight() {
  local -r verdict="${KIT_PROGRESS_DIR}/preflight" python="${KIT_PYTHON:-python3}" log="${KIT_NODE_LOG_PREFIX}.preflight.log"
  local word="" naps=0
  local -a network=()
  if (( KIT_PREFLIGHT_NETWORK )); then
    network=(--network "${MASTER_ADDR}:${MASTER_PORT}" --rank "${SLURM_NODEID:-0}" --nodes "${SLURM_STEP_NUM_NODES:-${SLURM_NNODES:-1}}")
  fi
  if (( LOCAL_RANK == 0 )); then
    "${python}" -m kit.preflight node --node "${KIT_NODE}" --out "${KIT_PROGRESS_DIR}/preflight-${KIT_NODE}.json" \
      "${network[@]}" >>"${log}" 2>&1 || true
    if (( ${SLURM_NODEID:-0} == 0 )); then
      "${python}" -m kit.preflight judge "${KIT_PROGRESS_DIR}" --nodes "${SLURM_STEP_NUM_NODES:-${SLURM_NNODES:-1}}" \
        --timeout "${KIT_PREFLIGHT_WAIT}" >>"${log}" 2>&1 || true
    fi
  fi
  while [[ ! -e "${verdict}" ]] && (( naps < (KIT_PREFLIGHT_WAIT + 60) * 10 )); do
    kit::nap 0.1
    (( naps += 1 ))
    kit::handle_signals
    if (( KIT_STOPPING )); then return 1; fi
  done
  { read -r word <"${verdict}"; } 2>/dev/null || true
  [[ "${word}" == verdict=ok ]] && return 0
  kit::log "preflight: ${word:-no verdict in $(( KIT_PREFLIGHT_WAIT + 60 )) s}: the command does not start"
  return 1
}

trap kit::cleanup EXIT
# INT becomes TERM: a command started in the background ignores INT.
kit::trap TERM "${KIT_WARNING_SIGNAL:-USR1}"
trap 'KIT_SIGNALS+=(TERM)' INT

if (( LOCAL_RANK == 0 )); then
  KIT_SIDECAR_SHELL="$(declare -f kit::sidecar_main kit::yield_cpu)"$'\nkit::sidecar_main "$1"'
  for (( i = 0; i < ${#KIT_SIDECARS[@]}; i += 3 )); do
    name="${KIT_SIDECARS[i]}"
    needs="${KIT_SIDECARS[i + 1]}"
    if [[ -n "${needs}" ]] && ! command -v "${needs}" >&"${KIT_NULL_FD}" 2>&1; then
      kit::log "sidecar ${name}: ${needs} not found, not started"
      continue
    fi
    # One that ends by itself leaves its exit code (progress/r<K>/sidecar-NAME.NODE: kit ps, --wait and kit
    # events say it); readers leave out a record from after the node's command ended.
    # The command reaches its shell's environment with no `env` started for it: a prefix assignment to a
    # function is exported to what the function runs.
    KIT_SIDECAR_COMMAND="${KIT_SIDECARS[i + 2]}" kit::spawn "${name}" bash -c "${KIT_SIDECAR_SHELL}" \
      kit-sidecar "${KIT_PROGRESS_DIR}/sidecar-${name}.${KIT_NODE}" >>"${KIT_NODE_LOG_PREFIX}.${name}.log" 2>&1
  done
fi

kit::handle_signals
if (( KIT_STOPPING )); then exit 143; fi
if (( KIT_PREFLIGHT )) && ! kit::preflight; then exit "$(( KIT_STOPPING ? 143 : 1 ))"; fi
# Slurm signals the task's whole process group: the rank log's writer ignores
# those signals (it ends when the command's output closes), and the command
# runs in a group of its own, so each signal reaches it once, from this script.
exec {KIT_LOG_FD}> >(trap '' INT TERM HUP USR1 USR2; exec tee -a "${KIT_RANK_LOG}")
KIT_DRAIN_PIDS+=("$!")
# This rank's exit record (logs/exit.r<run>.rank-<R>: "time rank rc self|stopped|warned", empty
# while the rank runs; kit.jobdir.failures.rank_ends reads it), opened before the command starts:
# under pyxis's squashfuse mode the step's signal also stops the runtime's squashfuse, and a
# path through the image's root may then fail; this descriptor needs none.
exec {KIT_EXIT_FD}>"${KIT_LOG_DIR}/exit.r${KIT_RESTART:-0}.rank-${RANK}"
kit::start "${KIT_COMMAND[@]}" >&"${KIT_LOG_FD}" 2>&1 {KIT_LOG_FD}>&- {KIT_EXIT_FD}>&-
KIT_MAIN_PID=$!
exec {KIT_LOG_FD}>&-
kit::container_mode
printf '%s %s %s %s\n' "${KIT_NODE}" "${KIT_MAIN_PID}" "${KIT_STARTED_AT}" "${KIT_MODE}" >"${KIT_PROGRESS_DIR}/task-${RANK}"
# From here on this script reads /proc through its working directory (lib.sh's KIT_PROC): the
# command has its own, and what the teardown needs must not depend on the image's root.
if cd /proc; then KIT_PROC=.; fi
kit::watch_prelaunch <&"${KIT_NULL_FD}" &
KIT_BG_PIDS+=("$!")
if (( ${KIT_HANG_TIMEOUT:-0} > 0 )); then
  kit::answer_hang <&"${KIT_NULL_FD}" &
  KIT_BG_PIDS+=("$!")
  if (( ${WORLD_SIZE:-1} > 1 )); then
    kit::watch_rendezvous <&"${KIT_NULL_FD}" &
    KIT_BG_PIDS+=("$!")
  fi
fi
kit::handle_signals
if (( KIT_WARNING_PENDING )); then kit::on_signal "${KIT_WARNING_SIGNAL:-USR1}"; fi
kit::wait_for "${KIT_MAIN_PID}"
KIT_MAIN_PID=
if [[ -e "${KIT_HANG_DIR}/stop" ]]; then
  kit::log "the command was stopped by the hang watchdog (exit ${KIT_RC})"
  KIT_STOPPING=1
elif (( KIT_STOPPING && KIT_RC == 0 )); then
  # Stopped before it finished (Lightning exits 0 on SIGTERM): never a success.
  kit::log "the command exited 0 after a stop signal: exiting 143"
  KIT_RC=143
fi
# How this rank ended, for prelaunch: the first rank that failed by itself
# gives the job its code, and the work is finished only when every rank
# says its command ended by itself with 0 (srun alone may exit 0 after a
# node failure killed its tasks): not stopped, and not given the warning.
# kit::record_exit RC HOW: the one writer of this rank's exit record (KIT_EXIT_FD, above).
kit::record_exit() {
  printf '%s000 %s %s %s\n' "${EPOCHREALTIME//[.,]/}" "${RANK}" "$1" "$2" >&"${KIT_EXIT_FD}"
}
KIT_HOW=self
if (( KIT_STOPPING )); then
  KIT_HOW=stopped
elif [[ -e "${KIT_PROGRESS_DIR}/warned-${RANK}" ]]; then
  KIT_HOW=warned
fi
kit::record_exit "${KIT_RC}" "${KIT_HOW}"
exit "${KIT_RC}"
