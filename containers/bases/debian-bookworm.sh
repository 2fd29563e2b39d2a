#!/usr/bin/env bash
# Makes the base of containers/cpu-lightning.toml: a minimal Debian bookworm
# root filesystem with Python 3.11, from Debian's packages (debootstrap).
#   containers/bases/debian-bookworm.sh [DEST]   (default: containers/bases/debian-bookworm)
set -euo pipefail
readonly dest="${1:-$(dirname "$0")/debian-bookworm}"
readonly mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install -y debootstrap" >&2; exit 2; }
if [[ -x "${dest}/usr/bin/python3" ]]; then
  echo "${dest}: already there" >&2
  exit 0
fi
tmp="${dest}.tmp.$$"
trap 'rm -rf "${tmp}"' EXIT
debootstrap --variant=minbase --include=python3-minimal,python3-venv bookworm "${tmp}" "${mirror}" >&2
# Keep the base small and free of per-build state.
rm -rf "${tmp}/var/cache/apt/archives/"*.deb "${tmp}/var/lib/apt/lists/"*
mv "${tmp}" "${dest}"
trap - EXIT
echo "${dest}" >&2
