# shellcheck shell=bash
# ---- kit's shared bash functions (launch/lib.sh, sourced by both scripts) ----
[[ -z "${KIT_LIB_SH-}" ]] || return 0  # sourced once
readonly KIT_LIB_SH=1
# The teardown may run after the container's root is gone (Slurm stopped the step's
# processes, the runtime's FUSE daemon with them): what it needs is bash's own (printf's
# time format, EPOCHREALTIME, kit::nap), never a program from the image.
kit::log() {
  printf '[kit %(%Y-%m-%dT%H:%M:%S%z)T %s] %s\n' -1 "${KIT_WHO:-?}" "$*" >&2
}

kit::die() {
  kit::log "error: $*"
  exit 2
}

# kit::route_iface ADDR: the interface this node reaches the IPv4 address ADDR through, in KIT_ROUTE_IFACE:
# the longest matching route of /proc/net/route (there on every Linux, in images without
# `ip` too), the lower metric first; empty for a dotted quad it cannot read, no route or lo.
# No subshell: it runs in every task's start.
KIT_ROUTE_IFACE=""
kit::route_iface() {
  local a b c d iface dest flags metric mask len bits best="" best_len=-1 best_metric=0 target
  KIT_ROUTE_IFACE=""
  IFS=. read -r a b c d _ <<<"$1"
  [[ "${a}.${b}.${c}.${d}" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || return 0
  target=$(( (10#${d} << 24) | (10#${c} << 16) | (10#${b} << 8) | 10#${a} ))  # little-endian, as the file's hex
  while read -r iface dest _ flags _ _ metric mask _; do
    [[ "${dest}" =~ ^[0-9A-Fa-f]{8}$ && "${mask}" =~ ^[0-9A-Fa-f]{8}$ && "${flags}" =~ ^[0-9A-Fa-f]+$ ]] || continue
    (( (16#${flags} & 1) && (target & 16#${mask}) == 16#${dest} )) || continue
    len=0 bits=$(( 16#${mask} ))
    while (( bits )); do (( len += bits & 1, bits >>= 1 )) || true; done
    if (( len > best_len || (len == best_len && metric < best_metric) )); then
      best="${iface}" best_len="${len}" best_metric="${metric}"
    fi
  done <"${KIT_PROC}/net/route"
  # shellcheck disable=SC2034  # the launcher reads it
  if [[ "${best}" != lo ]]; then KIT_ROUTE_IFACE="${best}"; fi
}

# kit::cmdline PID: PID's command line, words separated by spaces, at most 400 characters.
kit::cmdline() {
  local text=""
  text="$(tr '\0' ' ' <"${KIT_PROC}/$1/cmdline" 2>&"${KIT_NULL_FD}")" || true
  printf '%s' "${text:0:400}"
}

kit::truthy() {
  local -r value="${1,,}"
  case "${value}" in
    1 | y | yes | t | true | on) return 0 ;;
    *) return 1 ;;
  esac
}

# Every program this script starts for the task (the command, sidecars)
# carries KIT_TASK_TOKEN in its environment, and so does everything they start,
# even what leaves their process group (setsid, a daemon): kit::_sweep finds
# and stops those at the end. Not exported: this script's own helpers lack it.
KIT_TASK_TOKEN=  # set by kit::lib_init

# kit::start CMD...: start CMD in the background, in its own process group
# when setsid exists (so teardown reaches its children too), with the token.
kit::start() {
  if command -v setsid >&"${KIT_NULL_FD}" 2>&1; then
    KIT_TASK_TOKEN="${KIT_TASK_TOKEN}" setsid "$@" {KIT_NAP_FD}<&- {KIT_NULL_FD}<&- &
  else
    KIT_TASK_TOKEN="${KIT_TASK_TOKEN}" "$@" {KIT_NAP_FD}<&- {KIT_NULL_FD}<&- &
  fi
}

# ---- the shell a sidecar runs in: bash -c "${KIT_SIDECAR_SHELL}" kit-sidecar RECORD, in a session of its
# own where setsid exists, the sidecar's command in KIT_SIDECAR_COMMAND (an environment variable, not an
# argument: `pgrep -f` of the command then finds the sidecar, not this shell too) ----

# kit::sidecar_main RECORD: run the sidecar's command and write how it ended to RECORD ("RC TIME"). The
# warning signals are ignored: a `scancel --signal` reaches every process. The teardown's TERM to the group
# reaches the sidecar and this shell, whose trap waits for the sidecar to stop (the teardown's bounded wait is
# on this shell) and exits without a record. Started with & and waited for: a non-interactive bash says
# "Terminated" in the log for a foreground child killed by a signal.
kit::sidecar_main() {
  local child=""
  trap '' USR1 USR2
  trap 'if [[ -n "${child}" ]]; then wait "${child}"; fi; exit 143' TERM
  (kit_sidecar="${KIT_SIDECAR_COMMAND}"; unset KIT_SIDECAR_COMMAND; eval "${kit_sidecar}") & child=$!
  wait "${child}"
  printf '%d %s\n' "$?" "${EPOCHREALTIME/,/.}" >"$1"
}

# kit::yield_cpu NICE: for a sidecar's command, before it starts: its session's scheduling group gets nice
# NICE. Where the kernel groups each session for the scheduler (sched_autogroup, on in most distributions'
# kernels) a process's nice weighs only inside its group, so `nice -n 19` alone leaves a sidecar an equal
# share with the training's whole group. Only when the session is this shell's own (setsid made it), never
# the task's; nothing where the kernel has no autogroup.
kit::yield_cpu() {
  local stat
  local -a fields
  { read -r stat </proc/$$/stat; } 2>/dev/null || return 0
  read -r -a fields <<<"${stat##*) }"
  if [[ "${fields[3]-}" == "$$" ]]; then
    { printf '%s\n' "$1" >/proc/self/autogroup; } 2>/dev/null || true
  fi
}

# kit::spawn NAME CMD...: kit::start CMD with no input, and record its pid (NAME is for
# the reader: what the process is).
KIT_BG_PIDS=()
kit::spawn() {
  shift
  kit::start "$@" <&"${KIT_NULL_FD}"
  KIT_BG_PIDS+=("$!")
}

# The container runtime's processes below this task ("pid:start" each): what was
# already below it when this script began. pyxis in squashfuse mode keeps enroot's
# squashfuse (with fuse-overlayfs where enroot has no native overlay) and the
# stopped shells that hold them below the node's first task for the step's whole
# life: they serve the container's root, and stopping them unmounts it under
# every task of the node. Never the job's: the
# teardown leaves them to pyxis and Slurm.
KIT_RUNTIME=()

# kit::_start_time PID: PID's start time (/proc/PID/stat's 22nd field) in
# KIT_START_TIME: with the pid, it names one process for good.
KIT_START_TIME=
kit::_start_time() {
  local stat
  local -a fields
  KIT_START_TIME=
  { read -r stat <"${KIT_PROC}/$1/stat"; } 2>&"${KIT_NULL_FD}" || return 1
  read -r -a fields <<<"${stat##*) }"
  KIT_START_TIME="${fields[19]-}"
}

# kit::_runtime_own PID: true when PID is one of KIT_RUNTIME (the same process).
# Every return names its status: the teardown runs in the EXIT trap, where a
# bare `return` gives the status of the command that ran before the trap (a
# failed command's), not of the test before it.
kit::_runtime_own() {
  local entry
  for entry in "${KIT_RUNTIME[@]}"; do
    if [[ "${entry%%:*}" == "$1" ]]; then
      if kit::_start_time "$1" && [[ "${KIT_START_TIME}" == "${entry#*:}" ]]; then return 0; fi
      return 1
    fi
  done
  return 1
}

# kit::tree PID [all]: PID and every process below it, the runtime's left out
# (with "all": kept), in KIT_TREE (no fork: the teardown calls it and must not
# find its own helpers).
KIT_TREE=()
kit::tree() {
  local pid file
  local -a queue=("$1") children
  KIT_TREE=()
  while (( ${#queue[@]} > 0 )); do
    pid="${queue[0]}"
    queue=("${queue[@]:1}")
    if [[ "${2-}" != all ]] && (( ${#KIT_TREE[@]} > 0 )) && kit::_runtime_own "${pid}"; then continue; fi
    KIT_TREE+=("${pid}")
    for file in "${KIT_PROC}/${pid}"/task/*/children; do
      children=()
      { read -r -a children <"${file}"; } 2>&"${KIT_NULL_FD}" || true
      queue+=("${children[@]}")
    done
  done
}

# kit::_describe PID...: "PID (its name, state, parent, age and command line, its last 70
# characters)" for each, comma-separated, in KIT_DESCRIBED; KIT_OWN_FORKS: those
# of them that are forks of this script not yet gone (a helper's subshell: the
# same command line). No fork: the teardown calls it.
KIT_DESCRIBED=
KIT_OWN_FORKS=()
kit::_describe() {
  local pid text stat own comm now
  local -a args out fields
  { mapfile -d '' -t args <"${KIT_PROC}/$$/cmdline"; } 2>&"${KIT_NULL_FD}" || args=()
  own="${args[*]}"
  { read -r now _ <"${KIT_PROC}/uptime"; } 2>&"${KIT_NULL_FD}" || now=0.00
  KIT_OWN_FORKS=()
  for pid in "$@"; do
    args=() fields=()
    { mapfile -d '' -t args <"${KIT_PROC}/${pid}/cmdline"; } 2>&"${KIT_NULL_FD}" || true
    { read -r stat <"${KIT_PROC}/${pid}/stat"; } 2>&"${KIT_NULL_FD}" || stat=""
    comm="${stat#* (}"
    comm="${comm%%) *}"
    read -r -a fields <<<"${stat##*) }"
    text="${args[*]}"
    if [[ "${text}" == "${own}" ]]; then KIT_OWN_FORKS+=("${pid}"); fi
    if (( ${#text} > 70 )); then text="…${text: -70}"; fi
    # Its age from its start time (clock ticks since boot; 100 a second) and /proc/uptime.
    stat=$(( ${now/./} - ${fields[19]:-0} ))
    out+=("${pid} (${comm}, state ${fields[0]-?}, parent ${fields[1]-?} of launcher $$, started $(( stat / 100 )).$(( stat % 100 / 10 )) s ago: ${text})")
  done
  KIT_DESCRIBED="${out[0]-}"
  for text in "${out[@]:1}"; do KIT_DESCRIBED+=", ${text}"; done
}

# kit::_sweep_tree: stop every process still below this script (orphans it
# adopted included) but the rank log's writers and the container runtime's
# (KIT_RUNTIME), until none is left. What the command left is said as such;
# a fork of this script (a helper's subshell outliving its helper) is kit's own.
kit::_sweep_tree() {
  local pid round
  local -a pids
  for (( round = 0; round < 5; round++ )); do
    kit::tree "$$"
    pids=()
    for pid in "${KIT_TREE[@]:1}"; do
      # A process that has already exited (a zombie not yet reaped) is not left running.
      if [[ " ${KIT_DRAIN_PIDS[*]} " != *" ${pid} "* ]] && kit::running "${pid}"; then pids+=("${pid}"); fi
    done
    (( ${#pids[@]} > 0 )) || return 0
    # What a stopped command's group is still taking down (a child reparented to this
    # script as it exits) goes by itself in a moment: only what stays is left behind.
    if (( round == 0 )) && kit::_await_exit 10 "${pids[@]}"; then continue; fi
    kit::_describe "${pids[@]}"
    if (( ${#KIT_OWN_FORKS[@]} == ${#pids[@]} )); then
      kit::log "stopping ${#pids[@]} of this launcher's own subshell(s) still running: ${KIT_DESCRIBED}"
    else
      kit::log "stopping ${#pids[@]} process(es) left below the task: ${KIT_DESCRIBED}"
    fi
    KIT_STOP_TIMEOUT=2 kit::stop "${pids[@]}"
  done
}

# kit::_sweep: stop every process still carrying this task's token, scanning
# again until a scan finds none (one can fork between a scan and the stop).
# bash's own reads, no program: under pyxis's squashfuse mode the image may be
# gone by now (its programs with it), and no child of this script is left to
# be taken for one the command left behind.
kit::_sweep() {
  local file round pid
  local -a pids words
  for (( round = 0; round < 5; round++ )); do
    pids=()
    for file in "${KIT_PROC}"/[0-9]*/environ; do
      pid="${file#"${KIT_PROC}"/}"
      pid="${pid%/environ}"
      [[ "${pid}" != "$$" ]] || continue
      { mapfile -d '' -t words <"${file}"; } 2>&"${KIT_NULL_FD}" || continue
      # One match over the joined words first: word by word in bash only where the token is (a node's every
      # process is read; the loop alone, in every launcher of a one-machine cluster at once, cost seconds).
      [[ "${words[*]}" == *"KIT_TASK_TOKEN=${KIT_TASK_TOKEN}"* ]] || continue
      if kit::_has_word "KIT_TASK_TOKEN=${KIT_TASK_TOKEN}" "${words[@]}"; then pids+=("${pid}"); fi
    done
    (( ${#pids[@]} > 0 )) || return 0
    kit::log "stopping ${#pids[@]} process(es) the command or a sidecar left running: ${pids[*]}"
    KIT_STOP_TIMEOUT=2 kit::stop "${pids[@]}"
  done
}

# kit::_has_word WORD WORDS...: true when WORD is one of WORDS.
kit::_has_word() {
  local -r word="$1"
  local each
  shift
  for each in "$@"; do
    if [[ "${each}" == "${word}" ]]; then return 0; fi
  done
  return 1
}

# kit::lib_init: what this file needs set up, called once by the script that includes it
# (the file itself only defines: including it has no side effects). KIT_NULL_FD: /dev/null,
# opened now: the teardown's redirections need no path (under pyxis's squashfuse mode a
# signalled step may have lost the image's root, /dev's mount point in it), nor does a helper
# started with `&` (without job control bash opens /dev/null for its input unless given one:
# a helper started on the stop signal then never ran, and the stuck command waited out KillWait). KIT_NAP_FD: a pipe that
# no one writes to: `read -t` on it is a sleep that a trapped signal interrupts at once, with
# no child process and no `wait` builtin (see kit::wait_for). Programs this script starts do
# not get it.
KIT_NAP_FD=
KIT_NULL_FD=
# Where this script reads /proc: "/proc", or "." once a launcher has made /proc its working
# directory (a signalled squashfuse-mode step may take the image's root, the mount point of
# /proc in it, away: a path from "/" then fails, one from the working directory does not).
KIT_PROC=/proc
kit::lib_init() {
  local pid last
  exec {KIT_NULL_FD}<>/dev/null
  KIT_TASK_TOKEN="${SLURM_JOB_ID:-0}.${SLURM_STEP_ID:-0}.${SLURM_PROCID:-0}.$$"
  kit::tree "$$"
  for pid in "${KIT_TREE[@]:1}"; do
    if kit::_start_time "${pid}"; then KIT_RUNTIME+=("${pid}:${KIT_START_TIME}"); fi
  done
  last="${!-}"
  exec {KIT_NAP_FD}<> <(:)
  # Its writer (a fork) has nothing to write: reaped here, not found below this
  # script by a later kit::tree (bash before 4.4 leaves $! as it was: no wait).
  if [[ "${!-}" != "${last}" ]]; then wait "$!" 2>&"${KIT_NULL_FD}" || true; fi
}

# kit::nap SECONDS: sleep; a TERM trap interrupts it at once.
kit::nap() {
  read -r -t "$1" -u "${KIT_NAP_FD}" || true
}

# kit::helper_traps: for a helper run as `func &`: TERM ends it at once; the
# warning signals, which Slurm sends to every process of the step, do not.
kit::helper_traps() {
  trap 'exit 0' TERM
  trap '' USR1 USR2
  trap - INT EXIT
  # Named for ps and the teardown's log (the kernel keeps 15 bytes): "kit:answer_hang".
  { printf '%s' "kit:${FUNCNAME[1]#kit::}" >"${KIT_PROC}/${BASHPID}/comm"; } 2>&"${KIT_NULL_FD}" || true
}

# kit::running PID: true while PID exists and is not a zombie.
kit::running() {
  local stat
  { read -r stat <"${KIT_PROC}/$1/stat"; } 2>&"${KIT_NULL_FD}" || return 1
  stat="${stat##*) }"
  [[ "${stat:0:1}" != Z ]]
}

# kit::_await_exit TICKS PID...: wait up to TICKS x 50 ms until none of PIDs runs;
# true when none does.
kit::_await_exit() {
  local -r ticks="$1"
  local pid tries alive
  shift
  for (( tries = 0; tries <= ticks; tries++ )); do
    alive=0
    for pid in "$@"; do
      if kit::running "${pid}"; then
        alive=1
        break
      fi
    done
    (( alive )) || return 0
    (( tries == ticks )) || kit::nap 0.05
  done
  return 1
}

# kit::stop PID...: TERM each process (its group if it leads one), wait up
# to KIT_STOP_TIMEOUT seconds for all of them, KILL what is left, reap.
kit::stop() {
  local pid
  local -r timeout_ticks=$(( ${KIT_STOP_TIMEOUT:-5} * 20 ))
  (( $# > 0 )) || return 0
  for pid in "$@"; do
    kill -TERM -- "-${pid}" 2>&"${KIT_NULL_FD}" || kill -TERM "${pid}" 2>&"${KIT_NULL_FD}" || true
  done
  kit::_await_exit "${timeout_ticks}" "$@" || true
  for pid in "$@"; do
    kill -KILL -- "-${pid}" 2>&"${KIT_NULL_FD}" || kill -KILL "${pid}" 2>&"${KIT_NULL_FD}" || true
  done
  for pid in "$@"; do
    wait "${pid}" 2>&"${KIT_NULL_FD}" || true
  done
}

kit::stop_background() {
  (( ${#KIT_BG_PIDS[@]} > 0 )) || return 0
  kit::stop "${KIT_BG_PIDS[@]}"
  KIT_BG_PIDS=()
}

# The main process (the srun step, or the command) and the EXIT trap that
# tears everything down. KIT_DRAIN_PIDS end by themselves once the main
# process has (the rank log's writer); they get a moment before being stopped.
KIT_MAIN_PID=
KIT_DRAIN_PIDS=()
kit::cleanup() {
  local -r rc=$?
  local pid tries
  trap - EXIT
  # Only this script tears down. A helper forked with `&` carries the EXIT trap until its
  # first command (kit::helper_traps) runs: a signal in that instant (the teardown's own TERM
  # to a helper just forked by kit::on_signal) made the fork run a second teardown.
  if [[ "${BASHPID}" != "$$" ]]; then exit "${rc}"; fi
  if [[ -n "${KIT_MAIN_PID}" ]] && kit::running "${KIT_MAIN_PID}"; then
    kit::stop "${KIT_MAIN_PID}"
  fi
  kit::stop_background
  # Before the drain: a process the command left behind may hold its output open.
  kit::_sweep
  kit::_sweep_tree
  for pid in "${KIT_DRAIN_PIDS[@]}"; do
    kit::_await_exit 20 "${pid}" || true
    kit::stop "${pid}"
  done
  exit "${rc}"
}

# kit::forward SIG: pass a signal on to the main process.
kit::forward() {
  if [[ -n "${KIT_MAIN_PID}" ]]; then
    kill -s "$1" "${KIT_MAIN_PID}" 2>&"${KIT_NULL_FD}" || true
  fi
}

# Signals: a trap only records the signal (KIT_SIGNALS, append-only) and
# kit::handle_signals acts on it (kit::on_signal, defined by each script)
# outside trap context. bash 5.2 corrupts its function-call stack when a
# trap that calls functions interrupts `wait` inside a function ("pop_var_context:
# head of shell_variables not a function context"), and the signal's action
# was then lost: the warning never reached the command.
KIT_SIGNALS=()
KIT_SIGNALS_DONE=0
kit::trap() {
  local sig
  for sig in "$@"; do
    # shellcheck disable=SC2064  # the signal name is fixed when the trap is set
    trap "KIT_SIGNALS+=(${sig})" "${sig}"
  done
}
kit::handle_signals() {
  while (( KIT_SIGNALS_DONE < ${#KIT_SIGNALS[@]} )); do
    KIT_SIGNALS_DONE=$(( KIT_SIGNALS_DONE + 1 ))
    kit::on_signal "${KIT_SIGNALS[KIT_SIGNALS_DONE - 1]}"
  done
}

# kit::wait_for PID: wait until PID exits, acting on signals as they come;
# the exit status lands in KIT_RC. It polls (kit::nap, which a signal cuts
# short) and calls `wait` only once PID has exited: bash 5.2 loses a child's
# exit status when a trapped signal interrupts the `wait` builtin as that
# child exits, and a later `wait PID` then blocks for good while any other
# child lives (Slurm signals every process of the step at once, so the
# command exiting on the signal that reaches this script is the common
# case: 1 job in 12 ran into its time limit that way). The poll asks
# /proc, so it costs no process. KIT_RC (and KIT_STOPPING below) are read by the scripts that source this.
# shellcheck disable=SC2034
KIT_RC=0
kit::wait_for() {
  local -r pid="$1"
  local tries=0
  while kit::running "${pid}"; do
    kit::nap 0.2
    kit::handle_signals
  done
  # Exited. Once bash has reaped it (its SIGCHLD handler does, at once) `wait` returns the status it kept
  # without blocking; a `wait` that blocked to reap the zombie itself was cut short by a trapped signal
  # arriving just then and returned 128+N (138 for a command that exited 0 on the warning).
  while [[ -e "${KIT_PROC}/${pid}" ]] && (( tries++ < 100 )); do
    kit::nap 0.01
  done
  # shellcheck disable=SC2034
  if wait "${pid}"; then KIT_RC=0; else KIT_RC=$?; fi
  kit::handle_signals
}
# shellcheck disable=SC2034
KIT_STOPPING=0
# ---- end of launch/lib.sh ----
