#!/usr/bin/env bash
# Written by `kit cluster up`: enroot for node1 of kit's local cluster, whose slurmd
# has this directory first on its PATH.
set -euo pipefail
export ENROOT_DATA_PATH=/home/alice/.local/state/kit/cluster/enroot/node1/data
export ENROOT_RUNTIME_PATH=/home/alice/.local/state/kit/cluster/enroot/node1/runtime
export ENROOT_CACHE_PATH=/home/alice/.local/state/kit/cluster/enroot/node1/cache
export PATH=/usr/bin:"${PATH}"
exec /usr/bin/enroot "$@"
