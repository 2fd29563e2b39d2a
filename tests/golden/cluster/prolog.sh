#!/usr/bin/env bash
# Written by `kit cluster up`: the job's user's enroot directory on this node (theirs, 0700).
set -euo pipefail
[[ "${SLURM_JOB_UID:-}" =~ ^[0-9]+$ && "${SLURMD_NODENAME:-}" =~ ^[A-Za-z0-9_-]+$ ]] || exit 0
dir=/home/alice/.local/state/kit/cluster/enroot/"${SLURMD_NODENAME}"
[[ -d "${dir}/user-${SLURM_JOB_UID}" ]] && exit 0
new=$(mktemp -d "${dir}/.user-${SLURM_JOB_UID}.XXXXXX")
if (( EUID == 0 )); then
    chown "${SLURM_JOB_UID}:${SLURM_JOB_GID:-$(id -g "${SLURM_JOB_UID}")}" "${new}"
fi
mv -T "${new}" "${dir}/user-${SLURM_JOB_UID}" 2>/dev/null || rmdir "${new}"
