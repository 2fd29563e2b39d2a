#!/usr/bin/env bash
# prelaunch.sh: the batch script of a kit job, as kit ships it; the job's values are in job.env beside it.
#
# sbatch runs it on the first node of the allocation as `prelaunch.sh JOB_DIR` (Slurm runs a copy
# of the script, so the job directory comes as its argument); inside an salloc allocation, run
# `bash JOB_DIR/prelaunch.sh`. It decides MASTER_ADDR and MASTER_PORT, starts a heartbeat (batch
# mode), runs one srun step of launcher.sh (one per task) and waits for it, and on the warning
# signal forwards it to the step and then requeues the job within its retry budget.
# Its exit code is the step's.
# shellcheck disable=SC2317  # functions run from traps look unreachable to shellcheck
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
KIT_RUN_START_US="${EPOCHREALTIME//[.,]/}"  # this run's start (runs.jsonl's start_ms): its first line
# The warning signal can come as the script starts (Slurm sends it from a periodic check: a
# short limit's requeued run was warned 33 ms after it started, another killed by it 70 ms after,
# before job.env said which signal it is): either warning signal is noted from the first line,
# the job's own kept once job.env names it, not left to kill the script before kit::batch sets
# its traps, which act on it then (kit::early_warning).
KIT_EARLY_SIGNALS=""
trap 'KIT_EARLY_SIGNALS+=" USR1"' USR1
trap 'KIT_EARLY_SIGNALS+=" USR2"' USR2
KIT_EARLY_WARNING=0
# The scripts' directory: the argument sbatch passes, else where this file lies (by hand).
if [[ "${1-}" == /* ]]; then
  KIT_SCRIPTS_DIR="$1"
  shift
else
  KIT_SCRIPTS_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
fi
readonly KIT_SCRIPTS_DIR
# kit::_foreign DIR STICKY_OK: DIR is a symlink, or not this user's (nor root's), or others can write it (unless
# sticky, where STICKY_OK): whoever can, could have put their own job.env and scripts where this one reads them.
kit::_foreign() {
  local -r dir="$1" sticky_ok="$2"
  local owner=-1 mode=0
  if [[ -L "${dir}" ]]; then return 0; fi
  read -r owner mode < <(stat -L -c '%u %a' -- "${dir}" 2>/dev/null || echo "-1 0")
  if (( owner != EUID && owner != 0 )); then return 0; fi
  (( (8#${mode} & 8#022) != 0 && !(sticky_ok && (8#${mode} & 8#1000)) ))
}
# kit::_refuse_foreign DIR: exit 84 (kit.core.outcome.UNTRUSTED_DIR), nothing run, unless the job directory DIR
# and the one it sits in (by expansion: $(dirname …) would drop a trailing newline of its name) are this user's.
kit::_refuse_foreign() {
  local -r dir="$1" parent="${1%/*}"
  if kit::_foreign "${dir}" 0 || kit::_foreign "${parent:-/}" 1; then
    printf "kit: error: %s, or the directory it sits in, is not this user's alone (a symlink, another user's, or others can write it): nothing in it was run\n" "${dir}" >&2
    exit 84
  fi
}
# Checked before anything in the job directory is read.
kit::_refuse_foreign "${KIT_SCRIPTS_DIR}"
# shellcheck source=job.env
source "${KIT_SCRIPTS_DIR}/job.env"
trap 'KIT_EARLY_WARNING=1' "${KIT_WARNING_SIGNAL}"
if [[ "${KIT_EARLY_SIGNALS}" == *" ${KIT_WARNING_SIGNAL}"* ]]; then KIT_EARLY_WARNING=1; fi
if [[ "${KIT_WARNING_SIGNAL}" == USR1 ]]; then trap - USR2; else trap - USR1; fi  # the other: as it was
source "${KIT_SCRIPTS_DIR}/lib.sh"
kit::lib_init

# KIT_JOB_DIR is the unit of work's directory: the scripts', or an array task's own
# (its logs, checkpoints, runs, FINISHED).
if [[ -n "${SLURM_ARRAY_TASK_ID-}" && -d "${KIT_SCRIPTS_DIR}/tasks/${SLURM_ARRAY_TASK_ID}" ]]; then
  KIT_JOB_DIR="${KIT_SCRIPTS_DIR}/tasks/${SLURM_ARRAY_TASK_ID}"
else
  KIT_JOB_DIR="${KIT_SCRIPTS_DIR}"
fi
readonly KIT_JOB_DIR
readonly KIT_MAX_RESTARTS
readonly KIT_ON_STRAGGLER  # --on-straggler: tell, requeue or restart (kit::watch_stragglers)
readonly KIT_ON_FAILURE  # --on-failure: stop or restart (kit::conclude)
readonly KIT_STEP_NODES  # --nodes: the step's, of an allocation --spare-nodes larger (kit::step_nodes)
# The time-limit warning comes KIT_SIGNAL_LEAD s before the limit (or up to a
# minute earlier); with a restart left, a step still running KIT_LIMIT_MARGIN s
# before the limit is stopped and the job requeued (kit::stop_before_limit).
readonly KIT_SIGNAL_LEAD KIT_STOP_GRACE
readonly KIT_LIMIT_MARGIN=$(( KIT_STOP_GRACE + 15 ))
readonly KIT_REQUEUE_DELAY=5
readonly KIT_WORLD_SIZE
# Exit codes prelaunch decides itself (kit.core.outcome; the README's table): KIT_EXIT_<NAME>.
readonly -a KIT_EXIT_CODES
for kit_kv in "${KIT_EXIT_CODES[@]}"; do declare -r "KIT_EXIT_${kit_kv%%=*}=${kit_kv#*=}"; done
# How a run ends: kit.core.ending's table, rows in order (when|end|code|flags|requeue|says);
# kit::conclude applies the first whose facts hold.
readonly -a KIT_ENDINGS
readonly KIT_HEARTBEAT_SECONDS KIT_PORT_LOW KIT_PORT_HIGH KIT_MASTER_IFACE
readonly -a KIT_SRUN_ARGS
# With an image: the variables whose job values must win over the image's
# (pyxis --container-env); the flag lists those that are set when srun starts.
readonly -a KIT_CONTAINER_ENV
export KIT_CONTAINER
# The exporter sidecar: its port range, where Prometheus finds targets (none: ''), and
# outside a container the Python that has kit ('' in a container: the image's).
export KIT_EXPORTER_PORTS
readonly KIT_TARGETS_DIR
if [[ -n "${KIT_TARGETS_DIR}" ]]; then export KIT_PROMETHEUS_TARGETS="${KIT_TARGETS_DIR}"; fi
readonly KIT_HOST_PYTHON
readonly KIT_NOTIFY_PYTHON  # --notify: the Python with kit that sends the job's events ('' : none)
if [[ -n "${KIT_HOST_PYTHON}" ]]; then export KIT_PYTHON="${KIT_HOST_PYTHON}"; fi
# The job's own variables (--env), KEY=VALUE each; their values are literal by design.
readonly -a KIT_ENV
# kit::given_env NAME: whether --env gave NAME.
kit::given_env() {
  local kv
  for kv in "${KIT_ENV[@]}"; do if [[ "${kv%%=*}" == "$1" ]]; then return 0; fi; done
  return 1
}
export KIT_WARNING_SIGNAL
export KIT_JOB_DIR
# A sweep task's parameter values, as KIT_SWEEP_<NAME> (names checked by kit).
if [[ -r "${KIT_JOB_DIR}/sweep" ]]; then
  while IFS= read -r -d '' kit_kv; do export "KIT_SWEEP_${kit_kv%%=*}=${kit_kv#*=}"; done <"${KIT_JOB_DIR}/sweep"
fi
export KIT_FINISHED_FILE="${KIT_JOB_DIR}/FINISHED"
readonly KIT_RUNS_FILE="${KIT_JOB_DIR}/runs.jsonl"
export KIT_LOG_DIR="${KIT_JOB_DIR}/logs"
export KIT_CHECKPOINT_STEP_FILE="${KIT_JOB_DIR}/checkpoint_step"
# Hang detection: each rank's progress file lives in KIT_PROGRESS_DIR.
export KIT_HANG_TIMEOUT KIT_FIRST_PROGRESS_TIMEOUT
# The run: its number (KIT_RESTART: every run before it, requeued by Slurm or restarted in its allocation) and
# its directories, progress/r<K> and hang/r<K> (kit::begin_run; Slurm's count until kit::batch knows better).
kit::begin_run() {
  export KIT_RESTART="$1"
  export KIT_PROGRESS_DIR="${KIT_JOB_DIR}/progress/r${KIT_RESTART}"
  export KIT_HANG_DIR="${KIT_JOB_DIR}/hang/r${KIT_RESTART}"
}
kit::begin_run "${SLURM_RESTART_COUNT:-0}"
KIT_WHO=prelaunch

# ---------------------------------------------------------------- state
KIT_PORT_LOCK_FD=  # the lock that claims MASTER_PORT (kit::pick_port)
KIT_PORT_CLAIM_PID=  # the holder of MASTER_PORT's machine-wide claim (kit::pick_port)
# What reached the job, remembered for the rest of the script: a stop
# (TERM/INT: cancel, requeue, preemption, time limit) or the warning signal.
# Either one means the work is not known to be finished.
KIT_WARNED=0
KIT_BATCH=0  # 1: run by sbatch (ENVIRONMENT=BATCH), 0: by hand inside salloc
# The runs so far (kit::catch_up_runs): the last one runs.jsonl records, the run
# being caught up, the checkpoint step this run starts from, whether the step
# advanced past the last run's (a run that did not is not a restart spent well).
declare MASTER_ADDR MASTER_PORT  # the rendezvous (kit::decide_master), unless --env gave them
KIT_LAST_RUN=
KIT_RUN=
KIT_START_STEP=
KIT_RUN_ADVANCED=true
KIT_END_CODE=  # the job's exit code once a requeue was refused (kit::requeue)
KIT_FIRST_NODE=  # the allocation's first node, and what its probe said (kit::decide_master)
KIT_PROBE=
KIT_STEP_ARGS=()  # srun's arguments, the --container-env names set here
KIT_SET_NAMES=()
KIT_RUN_PIDS=()  # the run's watchers (kit::run_step), among KIT_BG_PIDS
KIT_LEFT_OUT=""  # the allocation's nodes that runs restarted in it leave out (kit::leave_out), comma-separated
KIT_STEP_NODELIST=""  # with spare nodes, the step's (kit::step_nodes); '' without: all of them
KIT_STEP_RC=0  # the step's exit code: the first failing rank's (kit::run_step), then the job's (kit::conclude)
KIT_FIRST_RC=
KIT_SUSPECT_NODE=  # the node a hang report names
declare -A KIT_RECORD=()  # a runs.jsonl record's fields (kit::read_run)
# The hang watchdog's (kit::watch_progress, in a background subshell of its own): each rank's
# progress time (µs) and who joined the rendezvous, the rank it suspects, since when and why.
declare -A KIT_TOUCHED=() KIT_JOINED=()
KIT_SUSPECT=
KIT_SUSPECT_LAST=0
KIT_WHY=

# ---------------------------------------------------------------- functions, by concern
source "${KIT_SCRIPTS_DIR}/prelaunch_step.sh"
source "${KIT_SCRIPTS_DIR}/prelaunch_watchdog.sh"
source "${KIT_SCRIPTS_DIR}/prelaunch_ending.sh"

# ---------------------------------------------------------------- main
kit::batch() {
  kit::begin_run "$(( ${SLURM_RESTART_COUNT:-0} + $(kit::restarted_here) ))"
  kit::prepare
  trap kit::cleanup EXIT
  kit::trap TERM INT "${KIT_WARNING_SIGNAL}"
  kit::early_warning
  kit::catch_up_runs
  kit::start_heartbeat
  kit::start_notify
  while :; do  # kit::conclude returns only when the next run starts in this allocation
    kit::tracker_env
    kit::restore_code
    kit::step_nodes
    kit::decide_master
    kit::run_step
    kit::conclude
    kit::next_run
  done
}

kit::main() {
  case "${1-}" in
    --master-probe) kit::master_probe ;;
    *) kit::batch ;;
  esac
}

kit::main "$@"
