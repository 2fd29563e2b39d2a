#!/usr/bin/env bash
# Written by `kit cluster up`: enroot for node2 of kit's local cluster, whose slurmd
# has this directory first on its PATH.
set -euo pipefail
export ENROOT_DATA_PATH=/home/alice/.local/state/kit/cluster/enroot/node2/data
export ENROOT_RUNTIME_PATH=/home/alice/.local/state/kit/cluster/enroot/node2/runtime
export ENROOT_CACHE_PATH=/home/alice/.local/state/kit/cluster/enroot/node2/cache
export PATH='/opt/enroot 4/bin':"${PATH}"
exec '/opt/enroot 4/bin/enroot' "$@"
