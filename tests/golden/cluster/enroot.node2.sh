#!/usr/bin/env bash
# Written by `kit cluster up`: enroot for node2 of kit's local cluster, whose slurmd
# has this directory first on its PATH; the directories are the user's own (the prolog's).
set -euo pipefail
base=/home/alice/.local/state/kit/cluster/enroot/node2/user-"${UID}"
export ENROOT_CACHE_PATH="${base}/cache"
export ENROOT_DATA_PATH="${base}/data"
export ENROOT_RUNTIME_PATH="${base}/runtime"
export PATH='/opt/enroot 4/bin':"${PATH}"
exec '/opt/enroot 4/bin/enroot' "$@"
