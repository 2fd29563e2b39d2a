# shellcheck shell=bash
# ---- prelaunch_step.sh (sourced by prelaunch.sh): the step — where the rendezvous is,
# the code as submitted restored, srun running launcher.sh on every node.
[[ -z "${KIT_PRELAUNCH_STEP_SH-}" ]] || return 0  # sourced once
readonly KIT_PRELAUNCH_STEP_SH=1
# kit::_master_addr: this node's address for the rendezvous, never a Slurm
# NodeName (often not resolvable). --master-interface pins an interface.
kit::_master_addr() {
  local addr
  local -a candidates=()
  if [[ -n "${KIT_MASTER_IFACE}" ]]; then
    addr="$(ip -o -4 addr show dev "${KIT_MASTER_IFACE}" 2>/dev/null | awk '!found { split($4, a, "/"); print a[1]; found = 1 }')" || addr=""
    [[ -n "${addr}" ]] || kit::die "--master-interface ${KIT_MASTER_IFACE}: no IPv4 address on $(hostname)"
    printf '%s\n' "${addr}"
    return 0
  fi
  local -a here=()
  # The name's address when it is one of this node's own (a name can resolve to an address
  # this node does not have: a node in a network namespace of its own), else the node's first.
  mapfile -t here < <(hostname -I 2>/dev/null | tr ' ' '\n')
  mapfile -t candidates < <(getent ahostsv4 "$(hostname)" 2>/dev/null | awk '{ print $1 }'; printf '%s\n' "${here[@]}")
  for addr in "${candidates[@]}"; do
    case "${addr}" in
      "" | 127.* | *:*) ;;
      *)
        if (( ${#here[@]} == 0 )) || [[ " ${here[*]} " == *" ${addr} "* ]]; then
          printf '%s\n' "${addr}"
          return 0
        fi
        ;;
    esac
  done
  printf '127.0.0.1\n'
}

# kit::_port_free PORT: can a server bind PORT on this node right now? With python3 the port is also claimed
# machine-wide (every user's and every local cluster's jobs on this host: an abstract socket, kit-port-PORT, no
# file anyone can plant) by a holder below this shell, whose pid goes to KIT_PORT_CLAIM_PID; it holds the claim
# until kit::_release_port (the step's end) or this shell's end. Without python3: /proc/net/tcp only.
kit::_port_free() {
  local -r port="$1"
  local said="" fd
  if command -v python3 >/dev/null 2>&1; then
    exec {fd}< <(exec python3 - "${port}" 2>/dev/null <<'PY'
import os, signal, socket, sys, time
port = int(sys.argv[1])
for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        continue
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))  # an error (exit 1) when the port is taken
    s.close()
claim = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
claim.bind(b"\0kit-port-%d" % port)  # an error (exit 1) when another job here claimed it
print("claimed", flush=True)
os.close(1)
parent = os.getppid()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while os.getppid() == parent:  # held while the shell that claimed it lives
    time.sleep(1)
PY
    )
    KIT_PORT_CLAIM_PID="$!"
    read -r -t 30 -u "${fd}" said || true
    exec {fd}<&-
    if [[ "${said}" == claimed ]]; then return 0; fi
    wait "${KIT_PORT_CLAIM_PID}" 2>/dev/null || true
    KIT_PORT_CLAIM_PID=""
    return 1
  else
    if awk -v p="$(printf ':%04X' "${port}")" '$2 ~ p"$" && $4 == "0A" { found = 1 } END { exit !found }' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      return 1
    fi
  fi
}

# kit::_release_port: the machine-wide claim and this user's lock on MASTER_PORT given back (the step ended).
kit::_release_port() {
  if [[ -n "${KIT_PORT_CLAIM_PID}" ]]; then
    kit::stop "${KIT_PORT_CLAIM_PID}"
    KIT_PORT_CLAIM_PID=""
  fi
  if [[ -n "${KIT_PORT_LOCK_FD}" ]]; then exec {KIT_PORT_LOCK_FD}>&-; fi
  KIT_PORT_LOCK_FD=""
}

# kit::_port_lock_dir: this user's private directory of port locks
# (${TMPDIR}/kit-ports-UID, mode 0700), printed when it is safe to use: a
# directory, not a symlink, owned by this user and writable by no one else.
# Anything else (another user planted it) is not used at all.
kit::_port_lock_dir() {
  local -r dir="${TMPDIR:-/tmp}/kit-ports-${EUID}"
  local mode
  mkdir -m 0700 "${dir}" 2>/dev/null || true
  if [[ -d "${dir}" && ! -L "${dir}" && -O "${dir}" ]] && mode="$(stat -c %a "${dir}" 2>/dev/null)" \
    && (( (8#${mode} & 8#022) == 0 )); then
    printf '%s\n' "${dir}"
    return 0
  fi
  kit::log "warning: ${dir} is not a private directory of this user (owner, mode or symlink): choosing the port without a lock"
  return 1
}

# kit::pick_port: a MASTER_PORT in the range that binds now. The scan starts at a point drawn from the job id,
# the run, the user and the cluster (every local cluster numbers its jobs from 1: job N of two clusters on one
# machine started at one port), and the port is claimed until the step ends — machine-wide (kit::_port_free)
# and by a lock file of this user's (inherited by the job's processes) — so two jobs starting together on one
# node cannot both take it in the seconds before the rendezvous binds (10-40 s under real pyxis's create mode).
# A claimed or locked port is skipped.
kit::pick_port() {
  local -r span=$(( KIT_PORT_HIGH - KIT_PORT_LOW + 1 ))
  local seed
  seed="$(printf '%s %s %s' "${EUID}" "${SLURM_WORKING_CLUSTER-}" "${SLURM_CONF-}" | cksum)"
  local -r start=$(( (SLURM_JOB_ID * 7919 + KIT_RESTART * 104729 + ${seed%% *}) % span ))
  local i port fd lock_dir
  lock_dir="$(kit::_port_lock_dir)" || lock_dir=""
  for (( i = 0; i < span; i++ )); do
    port=$(( KIT_PORT_LOW + (start + i) % span ))
    fd=""
    if [[ -n "${lock_dir}" ]]; then
      { exec {fd}>>"${lock_dir}/${port}"; } 2>/dev/null || continue
      if ! flock -n "${fd}" 2>/dev/null; then exec {fd}>&-; continue; fi
    fi
    if kit::_port_free "${port}"; then
      KIT_PORT_LOCK_FD="${fd}"
      MASTER_PORT="${port}"
      return 0
    fi
    if [[ -n "${fd}" ]]; then exec {fd}>&-; fi
  done
  kit::die "no free port in ${KIT_PORT_LOW}-${KIT_PORT_HIGH} on $(hostname); widen --port-range"
}

# kit::master_probe: run by srun on the allocation's first node when prelaunch itself is
# not on it (salloc): that node's address and a port free there.
kit::master_probe() {
  kit::pick_port
  printf '%s %s\n' "$(kit::_master_addr)" "${MASTER_PORT}"
}

# kit::prepare: checks and settings before anything runs: inside an allocation, the
# debug toggles and --env, and nothing to run when the work is done or the budget spent.
kit::prepare() {
  [[ -n "${SLURM_JOB_ID-}" ]] \
    || kit::die "prelaunch.sh runs inside a Slurm allocation: submit it with sbatch, or run it under salloc"
  mkdir -p "${KIT_LOG_DIR}"

  if [[ "${ENVIRONMENT-}" == BATCH ]]; then KIT_BATCH=1; fi

  # Debug toggles: --debug when the job was made, or DEBUG=1 at submission.
  export PYTHONFAULTHANDLER=1
  if kit::truthy "${DEBUG:-${KIT_DEBUG}}"; then
    export DEBUG=1
    export NCCL_DEBUG="${NCCL_DEBUG:-INFO}"
    # INFO, not DETAIL: with DETAIL every DDP job segfaults (torch 2.13 + gloo).
    export TORCH_DISTRIBUTED_DEBUG="${TORCH_DISTRIBUTED_DEBUG:-INFO}"
    export CUDA_LAUNCH_BLOCKING="${CUDA_LAUNCH_BLOCKING:-1}"
    set -x
  else
    export DEBUG=0
  fi

  # The job's own variables (--env), exported after the debug toggles: --env beats each.
  for kit_kv in "${KIT_ENV[@]}"; do export "${kit_kv%%=*}=${kit_kv#*=}"; done

  if [[ -e "${KIT_FINISHED_FILE}" ]]; then
    kit::log "${KIT_FINISHED_FILE} exists: the work is done, not running it again"
    exit 0
  fi
  # Slurm requeues by itself too (node failure, scontrol requeue, preemption):
  # the budget counts every run, whoever requeued it.
  if (( KIT_RESTART > KIT_MAX_RESTARTS )); then
    kit::log "run ${KIT_RESTART}: requeued more often than --max-restarts ${KIT_MAX_RESTARTS}; retry budget spent, not running"
    exit "${KIT_EXIT_BUDGET_SPENT}"
  fi
}

# kit::tracker_env: the job's one tracker run, the same in every run and requeue (kit.train.trackers):
# W&B's run id, resume mode, name and directory, TensorBoard's directory (KIT_TRACKER_DIR), the MLflow
# run the first run made, and the checkpoint step this run resumes from (-1: none); W&B writes its
# transaction log every second (it loses what it holds on Slurm's SIGTERM: kit.train.wandb_log). A value
# the job's environment has (--env, or the shell kit launch ran in) is kept.
kit::tracker_env() {
  local id="${KIT_SCRIPTS_DIR##*/}" line=""
  if [[ "${KIT_JOB_DIR}" != "${KIT_SCRIPTS_DIR}" ]]; then id+="-t${KIT_JOB_DIR##*/}"; fi
  export KIT_TRACKER_DIR="${KIT_JOB_DIR}/tracker"
  mkdir -p "${KIT_TRACKER_DIR}"
  export WANDB_RUN_ID="${WANDB_RUN_ID:-${id}}" WANDB_RESUME="${WANDB_RESUME:-allow}"
  export WANDB_NAME="${WANDB_NAME:-${id}}" WANDB_DIR="${WANDB_DIR:-${KIT_TRACKER_DIR}}"
  export WANDB__TRANSACTION_LOG_FLUSH_INTERVAL="${WANDB__TRANSACTION_LOG_FLUSH_INTERVAL:-1}"
  if [[ -z "${MLFLOW_RUN_ID-}" && -r "${KIT_TRACKER_DIR}/mlflow.json" ]]; then
    read -r line <"${KIT_TRACKER_DIR}/mlflow.json" || true
    # json.dumps's text, as kit.train.trackers writes it (a test pins the pair).
    if [[ "${line}" =~ ^\{\"run_id\":\ \"([0-9a-f]{32})\" ]]; then export MLFLOW_RUN_ID="${BASH_REMATCH[1]}"; fi
  fi
  # MLflow 3 refuses a file store unless told (its "maintenance mode"): a job that names one gets it.
  if [[ -z "${MLFLOW_ALLOW_FILE_STORE+set}" && ( "${MLFLOW_TRACKING_URI-}" == file:* || "${MLFLOW_TRACKING_URI-}" == /* ) ]]; then
    export MLFLOW_ALLOW_FILE_STORE=true
  fi
  export KIT_RESUME_STEP="${KIT_START_STEP}"
}

# kit::restore_code: every run runs the code as submitted. Whatever in the
# snapshot's view (code/) a run, or anyone, wrote to, truncated, chmod-ed,
# removed or replaced since the view was made (its ctime is newer than
# code.list's) is put back: a file from its object in the store, checked
# against its name; a link as it was. Files a run added (__pycache__) stay,
# and so do the links to the work tree's ignored entries (not the snapshot's).
kit::restore_code() {
  local -r list="${KIT_SCRIPTS_DIR}/code.list" view="${KIT_SCRIPTS_DIR}/code"
  local path kind source rel
  local -A changed=()
  local -a restored=()
  [[ -f "${list}" ]] || return 0
  while IFS= read -r -d '' path; do changed["${path}"]=1; done \
    < <(find "${view}" -mindepth 1 -cnewer "${list}" -print0 2>/dev/null)
  while IFS= read -r -d '' kind && IFS= read -r -d '' source && IFS= read -r -d '' rel; do
    path="${view}/${rel}"
    if [[ -z "${changed["${path}"]-}" ]] && [[ -L "${path}" || -e "${path}" ]]; then continue; fi
    kit::_restore_entry "${kind}" "${source}" "${view}" "${rel}"
    restored+=("${rel}")
  done <"${list}"
  if (( ${#restored[@]} > 0 )); then
    touch "${list}"
    kit::log "code/: put back ${#restored[@]} path(s) changed since the job was submitted: ${restored[*]:0:8}"
  fi
}

# kit::_owned_store OBJECT: the store holding OBJECT (its objects/ and the store itself) is a
# directory of this user's own that no one else can write, as kit launch checks (kit.files.owned);
# else the run stops. A store renamed away after this check is caught by kit::_restore_entry's hash
# of what it copied.
kit::_owned_store() {
  local -r objects="${1%/*}"
  local dir owner mode
  for dir in "${objects}" "${objects%/*}"; do
    owner="" mode=""
    if [[ ! -L "${dir}" && -d "${dir}" ]]; then read -r owner mode < <(stat -c '%u %a' -- "${dir}"); fi
    if [[ "${owner}" != "${EUID}" ]] || (( 8#${mode:-22} & 8#022 )); then
      kit::die "code/: the code store ${dir} is not a directory of this user's own that only its owner can write: not run"
    fi
  done
}

# kit::_restore_entry KIND SOURCE VIEW REL: put VIEW/REL back (KIND f or x: a copy of the
# object SOURCE, read-only, executable for x; l: a symlink to SOURCE), through a new
# name renamed over it; a directory on its way that is no longer one is made again. What is
# hashed is the copy that runs, never the object opened a second time.
kit::_restore_entry() {
  local -r kind="$1" source="$2" view="$3" rel="$4"
  local dir="${view}" part sum new
  local -a parts=()
  IFS=/ read -r -a parts <<<"${rel}"
  for part in "${parts[@]:0:${#parts[@]}-1}"; do
    dir+="/${part}"
    if [[ -L "${dir}" || ( -e "${dir}" && ! -d "${dir}" ) ]]; then rm -f "${dir}"; fi
    if [[ ! -d "${dir}" ]]; then mkdir "${dir}"; fi
  done
  new="${dir}/.kit-restore.$$"
  rm -rf "${new}"
  if [[ "${kind}" == l ]]; then
    ln -s "${source}" "${new}"
  else
    kit::_owned_store "${source}"
    (umask 077 && cat -- "${source}" >"${new}") 2>/dev/null || kit::die "code/${rel}: cannot read its object ${source}"
    sum="$(sha256sum <"${new}")"
    local -r want="${source##*/}"
    if [[ "${sum%% *}" != "${want%.x}" ]]; then
      rm -f "${new}"
      kit::die "code/${rel}: its object ${source} does not hold what its name says: not run"
    fi
    if [[ "${kind}" == x ]]; then chmod 0555 "${new}"; else chmod 0444 "${new}"; fi
  fi
  if [[ -d "${view}/${rel}" && ! -L "${view}/${rel}" ]]; then  # a run's directory: kept, beside
    mv -T "${view}/${rel}" "${view}/${rel}.kit-moved-r${KIT_RESTART}-$$"
    kit::log "code/${rel}: a directory stood where the snapshot has a file: moved to ${rel}.kit-moved-r${KIT_RESTART}-$$"
  fi
  mv -fT "${new}" "${view}/${rel}"
}

# kit::step_nodes: with spare nodes (an allocation larger than --nodes), the step's: the allocation's first
# KIT_STEP_NODES that runs have not left out (kit::leave_out), in KIT_STEP_NODELIST; without spares, ''.
kit::step_nodes() {
  local -a kept=()
  KIT_STEP_NODELIST=""
  (( ${SLURM_JOB_NUM_NODES:-0} > KIT_STEP_NODES )) || return 0
  mapfile -t kept < <(kit::kept_nodes "${KIT_LEFT_OUT}")
  KIT_STEP_NODELIST="$(IFS=,; printf '%s' "${kept[*]:0:KIT_STEP_NODES}")"
}

# kit::kept_nodes LEFT_OUT: the allocation's nodes, in order, but those of LEFT_OUT (comma-separated), one a line.
kit::kept_nodes() {
  local node
  local -a all=()
  mapfile -t all < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")
  for node in "${all[@]}"; do
    if [[ ",$1," != *",${node},"* ]]; then printf '%s\n' "${node}"; fi
  done
}

# The rendezvous address and port, decided on the step's first node (or given by --env): here, or through a
# probe step there (inside salloc, or when a restart left this node out of the step).
kit::decide_master() {
  local kit_name
  local -r first="${KIT_STEP_NODELIST%%,*}"
  for kit_name in MASTER_ADDR MASTER_PORT; do
    if ! kit::given_env "${kit_name}"; then unset "${kit_name}"; fi
  done
  if [[ -z "${MASTER_ADDR-}" || -z "${MASTER_PORT-}" ]]; then
    if [[ -z "${first}" || "${first}" == "${SLURMD_NODENAME-}" ]] && { (( KIT_BATCH )) || [[ -n "${SLURMD_NODENAME-}" ]]; }; then
      if [[ -z "${MASTER_ADDR-}" ]]; then MASTER_ADDR="$(kit::_master_addr)"; fi
      if [[ -z "${MASTER_PORT-}" ]]; then kit::pick_port; fi
    else
      KIT_FIRST_NODE="${first:-$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | awk 'NR == 1')}"
      KIT_PROBE="$(srun --nodes=1 --ntasks=1 --overlap --nodelist="${KIT_FIRST_NODE}" bash "${KIT_SCRIPTS_DIR}/prelaunch.sh" "${KIT_SCRIPTS_DIR}" --master-probe)"
      kit::log "the rendezvous is on ${KIT_FIRST_NODE}, the step's first node: ${KIT_PROBE/ /:} (a probe step there)"
      if [[ -z "${MASTER_ADDR-}" ]]; then MASTER_ADDR="${KIT_PROBE% *}"; fi
      if [[ -z "${MASTER_PORT-}" ]]; then MASTER_PORT="${KIT_PROBE#* }"; fi
    fi
  fi
  export MASTER_ADDR MASTER_PORT
}

# kit::start_heartbeat: a line in the batch log every --heartbeat seconds (batch mode).
kit::start_heartbeat() {
  if (( KIT_BATCH && KIT_HEARTBEAT_SECONDS > 0 )); then
    # shellcheck disable=SC2016  # expanded by the heartbeat's own bash
    kit::spawn heartbeat bash -c 'while sleep "$1"; do printf "[kit %s prelaunch] heartbeat\n" "$(date +%Y-%m-%dT%H:%M:%S%z)"; done' \
      heartbeat "${KIT_HEARTBEAT_SECONDS}"
  fi
}

# kit::start_notify: --notify's watcher, sending the job's events as they happen, each once (kit.notify.deliver;
# from / : never a kit of the code's). A node without that Python leaves them to the next kit command that looks.
kit::start_notify() {
  [[ -n "${KIT_NOTIFY_PYTHON}" ]] || return 0
  if [[ ! -x "${KIT_NOTIFY_PYTHON}" ]]; then
    kit::log "--notify: ${KIT_NOTIFY_PYTHON} is not on this node: the events wait for the next kit command that sees the job"
    return 0
  fi
  kit::spawn notify env -C / "${KIT_NOTIFY_PYTHON}" -m kit.notify watch "${KIT_JOB_DIR}"
}

# kit::notify_last: the watcher stopped, what it did not send, within seconds (the batch script's end).
kit::notify_last() {
  [[ -n "${KIT_NOTIFY_PYTHON}" && -x "${KIT_NOTIFY_PYTHON}" ]] || return 0
  kit::stop_background
  timeout -k 1 10 env -C / "${KIT_NOTIFY_PYTHON}" -m kit.notify last "${KIT_JOB_DIR}" <&"${KIT_NULL_FD}" || true
}

# kit::run_step: the srun step of launcher.sh, watched for hangs; its exit code in
# KIT_STEP_RC (the first failing rank's, when srun reports another).
kit::run_step() {
  local name
  KIT_STEP_ARGS=("${KIT_SRUN_ARGS[@]}")
  if (( ${#KIT_CONTAINER_ENV[@]} > 0 )); then
    KIT_SET_NAMES=()
    for name in "${KIT_CONTAINER_ENV[@]}"; do
      if [[ -v "${name}" ]]; then KIT_SET_NAMES+=("${name}"); fi
    done
    KIT_STEP_ARGS+=("--container-env=$(IFS=,; printf '%s' "${KIT_SET_NAMES[*]}")")
  fi
  if [[ -n "${KIT_STEP_NODELIST}" ]]; then KIT_STEP_ARGS+=("--nodelist=${KIT_STEP_NODELIST}"); fi
  kit::handle_signals
  if (( KIT_STOPPING )); then
    kit::log "stopped before the job step started"
    exit 143
  fi
  mkdir -p "${KIT_PROGRESS_DIR}"
  kit::log "job ${SLURM_JOB_ID} run ${KIT_RESTART}: ${KIT_STEP_NODELIST:-${SLURM_JOB_NUM_NODES:-?} node(s)}, MASTER_ADDR=${MASTER_ADDR} MASTER_PORT=${MASTER_PORT}"
  # The step's start, for the time to each node's first task (the container's start: kit report, kit ps).
  printf '%s\n' "${EPOCHREALTIME/,/.}" >"${KIT_PROGRESS_DIR}/step-start"
  srun "${KIT_STEP_ARGS[@]}" "${KIT_SCRIPTS_DIR}/launcher.sh" &
  KIT_MAIN_PID=$!
  KIT_RUN_PIDS=()  # this run's watchers: stopped before the next run in this allocation (kit::next_run)
  if (( KIT_HANG_TIMEOUT > 0 )); then
    kit::watch_progress "${KIT_MAIN_PID}" &
    KIT_RUN_PIDS+=("$!")
  fi
  if [[ "${KIT_ON_STRAGGLER}" != tell ]] && (( KIT_RESTART < KIT_MAX_RESTARTS )); then
    kit::watch_stragglers "${KIT_MAIN_PID}" &
    KIT_RUN_PIDS+=("$!")
  fi
  KIT_BG_PIDS+=("${KIT_RUN_PIDS[@]}")
  kit::wait_for "${KIT_MAIN_PID}"
  KIT_MAIN_PID=
  KIT_STEP_RC="${KIT_RC}"
  # srun turns a TERM of its own (every process of the batch step gets one when
  # the job is cancelled, requeued or out of time) into SIGKILL for the tasks, so
  # their sidecars may not have cleaned up: no exporter target of this run may
  # outlive it.
  if [[ -n "${KIT_PROMETHEUS_TARGETS-}" ]]; then
    rm -f "${KIT_PROMETHEUS_TARGETS}/kit-${SLURM_JOB_ID}-"*.json
  fi
  if (( KIT_STEP_RC != 0 )) && KIT_FIRST_RC="$(kit::first_failure)" && [[ "${KIT_FIRST_RC}" != "${KIT_STEP_RC}" ]]; then
    kit::log "srun exited ${KIT_STEP_RC}; the first rank to fail exited ${KIT_FIRST_RC}"
    KIT_STEP_RC="${KIT_FIRST_RC}"
  fi
  kit::_release_port
}
