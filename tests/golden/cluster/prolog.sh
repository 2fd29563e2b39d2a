#!/usr/bin/env bash
# Written by `kit cluster up`: the job's user's own directories (theirs), made as root before its first step.
set -uo pipefail
[[ "${SLURM_JOB_UID:-}" =~ ^[0-9]+$ ]] || exit 0
gid="${SLURM_JOB_GID:-$(id -g "${SLURM_JOB_UID}")}"
own() {  # DIR NAME MODE: DIR/NAME, the job user's, where DIR exists and it does not
  local new
  [[ -d "$1" && ! -e "$1/$2" ]] || return 0
  new=$(mktemp -d "$1/.$2.XXXXXX") || return 0
  chmod "$3" "${new}"
  if (( EUID == 0 )); then chown "${SLURM_JOB_UID}:${gid}" "${new}"; fi
  mv -T "${new}" "$1/$2" 2>/dev/null || rmdir "${new}"
}
user="${SLURM_JOB_USER:-$(id -nu "${SLURM_JOB_UID}")}"
targets=/home/alice/.local/state/kit/cluster/prometheus-targets
if [[ "${user}" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ && -d "${targets}" && ! -e "${targets}/${user}" ]]; then
  own "${targets}" "${user}" 0755
  if [[ -x /home/alice/.local/state/kit/cluster/prometheus/regen ]]; then /home/alice/.local/state/kit/cluster/prometheus/regen || true; fi
fi
if [[ "${SLURMD_NODENAME:-}" =~ ^[A-Za-z0-9_-]+$ ]]; then
  own /home/alice/.local/state/kit/cluster/enroot/"${SLURMD_NODENAME}" "user-${SLURM_JOB_UID}" 0700
fi
exit 0
