#!/usr/bin/env bash
# Makes the base of containers/cpu-lightning.toml: a minimal Debian bookworm
# root filesystem with Python 3.11, from Debian's packages (debootstrap).
#   containers/bases/debian-bookworm.sh [DEST]   (default: containers/bases/debian-bookworm)
set -euo pipefail
readonly dest="${1:-$(dirname "$0")/debian-bookworm}"
readonly mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install -y debootstrap" >&2; exit 2; }
# Two callers at once (two test sessions) make it one after the other: the second finds it there.
exec 9>"${dest}.lock"
flock 9
if [[ -x "${dest}/usr/bin/python3" ]]; then
  echo "${dest}: already there" >&2
  exit 0
fi
tmp="${dest}.tmp.$$"
trap 'rm -rf "${tmp}"' EXIT
log="${dest}.debootstrap.log"
echo "debootstrap: a minimal Debian bookworm with Python 3.11 from ${mirror} (~45 s; every line in ${log})" >&2
# Each phase once (debootstrap says one line per package: ~570), its errors and warnings as they come.
status=0
debootstrap --variant=minbase --include=python3-minimal,python3-venv bookworm "${tmp}" "${mirror}" 2>&1 \
  | tee "${log}" \
  | awk 'BEGIN { said["Retrieving"] = "retrieving and checking packages…"; said["Extracting"] = "extracting…"
               said["Unpacking"] = "unpacking…"; said["Configuring"] = "configuring…"; said["Base"] = "done" }
         /^I: (Retrieving|Validating|Extracting|Unpacking|Configuring|Base system)/ {
           phase = $2 == "Validating" ? "Retrieving" : $2
           if (phase != last) { print "  " said[phase]; fflush(); last = phase } }
         /^[EW]: / { print; fflush() }' >&2 || status=$?
if (( status != 0 )); then
  echo "debootstrap failed (exit ${status}): the end of ${log}:" >&2
  tail -n 20 "${log}" >&2
  exit "${status}"
fi
# Keep the base small and free of per-build state.
rm -rf "${tmp}/var/cache/apt/archives/"*.deb "${tmp}/var/lib/apt/lists/"*
mv "${tmp}" "${dest}"
trap - EXIT
echo "${dest}" >&2
