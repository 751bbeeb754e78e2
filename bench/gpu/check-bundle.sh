#!/usr/bin/env bash
# Checks the GPU bundle where none of tessera's dependencies are installed: a minimal Debian 12
# made by debootstrap (from the mirror apt uses here), given only what the bundle does not carry
# and the GPU machine has: a Vulkan driver (lavapipe from mesa-vulkan-drivers stands in for the
# GPU's) and Python 3 with numpy, h5py and pytest (no torch, lmdb or openslide: the tests that
# import them are skipped with the reason). Checks that every library tessera loads there comes
# from the bundle or is the C/C++ runtime, then runs run-on-gpu.sh (--quick benchmarks, the
# suite on lavapipe) and leaves its output in OUT_DIR.
#
# Usage (root): bash bench/gpu/check-bundle.sh [BUNDLE] [OUT_DIR] [run-on-gpu.sh options]
#   defaults .gpu-bundle/tessera-bundle.tar.xz and .gpu-bundle/check; the Debian tree is kept in
#   /var/tmp/tessera-bundle-root for the next check (delete it to start over).
set -euo pipefail
cd "$(dirname "$0")/../.."
archive=$(realpath "${1:-.gpu-bundle/tessera-bundle.tar.xz}")
out=$(mkdir -p "${2:-.gpu-bundle/check}" && realpath "${2:-.gpu-bundle/check}")
shift $(($# < 2 ? $# : 2))
root=/var/tmp/tessera-bundle-root
mirror=$(grep -rhoE '^(deb|URIs:) *https?://[^ ]+/debian' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
  head -1 | grep -oE 'https?://[^ ]+')
if [[ ! -e $root/.ready ]]; then
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
  cp /etc/resolv.conf "$root"/etc/resolv.conf
  chroot "$root" apt-get install -y -qq --no-install-recommends \
    mesa-vulkan-drivers python3 python3-numpy python3-h5py python3-pytest >/dev/null
  touch "$root"/.ready
fi

mounts=()
cleanup() { for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}"; done; }
trap cleanup EXIT
for fs in proc sys dev; do
  mount --bind "/$fs" "$root/$fs"
  mounts+=("$root/$fs")
done
mkdir -p "$root"/check
rm -rf "$root"/check/*
cp "$archive" "$root"/check/bundle.tar.xz
cp bench/gpu/run-on-gpu.sh "$root"/check/

# Every library tessera loads resolves into the bundle, but the C and C++ runtimes.
chroot "$root" sh -c 'mkdir -p /tmp/unpacked && tar -C /tmp/unpacked -xJf /check/bundle.tar.xz &&
  ldd /tmp/unpacked/tessera-bundle/tessera/build/tools/tessera' >"$out"/ldd.txt
outside=$(grep '=>' "$out"/ldd.txt | grep -v '/tmp/unpacked/tessera-bundle/lib/' |
  grep -vE '^\s*(libc|libm|libstdc\+\+|libgcc_s)\.so' || true)
if [[ -n $outside ]]; then
  echo "check-bundle: libraries from outside the bundle:" >&2
  echo "$outside" >&2
  exit 1
fi
echo "check-bundle: $(grep -c '/tmp/unpacked/tessera-bundle/lib/' "$out"/ldd.txt) libraries from the bundle, the rest the C/C++ runtime"

chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root TMPDIR=/tmp \
  bash /check/run-on-gpu.sh /check/bundle.tar.xz /check/out --quick --minutes 60 "$@" || status=$?
cp -r "$root"/check/out/. "$out"/
echo "check-bundle: run-on-gpu.sh exit ${status:-0}; output in $out"
exit "${status:-0}"
