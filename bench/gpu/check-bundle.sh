#!/usr/bin/env bash
# Checks the GPU bundle where none of tessera's dependencies are installed: a minimal Debian 12
# made by debootstrap (tools/debian-chroot.sh, from the mirrors apt uses here), given only what the
# bundle does not carry and the GPU machine has: a Vulkan driver (lavapipe from mesa-vulkan-drivers
# stands in for the GPU's) and Python 3 with numpy, h5py, pytest, Pillow and tifffile (no torch,
# lmdb or openslide: the tests that import them are skipped with the reason). Checks that every library
# tessera loads there comes from the bundle or is the C/C++ runtime, then runs run-on-gpu.sh
# (--quick benchmarks, the suite on lavapipe) and leaves its output in OUT_DIR.
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
source tools/debian-chroot.sh
# The GPU machine's Python has these (and torch), not python3-lmdb or python3-openslide.
packages="mesa-vulkan-drivers python3 python3-numpy python3-h5py python3-pytest python3-pil python3-tifffile"
[[ -e $root/.ready ]] || fresh_debian12 "$root" "$out"/debootstrap.log
if [[ "$(cat "$root"/.ready 2>/dev/null)" != "$packages" ]]; then
  chroot "$root" apt-get update -qq
  # shellcheck disable=SC2086  # one word per package
  chroot "$root" apt-get install -y -qq --no-install-recommends $packages >/dev/null
  echo "$packages" >"$root"/.ready
fi

trap unmount_system_dirs EXIT
mount_system_dirs "$root"
mkdir -p "$root"/check
rm -rf "$root"/check/*
cp "$archive" "$root"/check/bundle.tar.xz
cp bench/gpu/run-on-gpu.sh "$root"/check/

# Every library tessera loads resolves into the bundle, but the C and C++ runtimes.
chroot "$root" sh -c 'rm -rf /tmp/unpacked && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  /check/bundle.tar.xz /tmp/unpacked && ldd /tmp/unpacked/tessera-bundle/tessera/build/tools/tessera' >"$out"/ldd.txt
runtime='^\s*(ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libanl|libstdc\+\+|libgcc_s)\.so'
outside=$(grep '=>' "$out"/ldd.txt | grep -v '=> /tmp/unpacked/tessera-bundle/' | grep -vE "$runtime" || true)
if [[ -n $outside ]]; then
  echo "check-bundle: libraries from outside the bundle:" >&2
  echo "$outside" >&2
  exit 1
fi
echo "check-bundle: $(grep -c '=> /tmp/unpacked/tessera-bundle/' "$out"/ldd.txt) libraries from the bundle, the rest the C/C++ runtime"

chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root TMPDIR=/tmp \
  bash /check/run-on-gpu.sh /check/bundle.tar.xz /check/out --quick --minutes 60 "$@" || status=$?
cp -r "$root"/check/out/. "$out"/
echo "check-bundle: run-on-gpu.sh exit ${status:-0}; output in $out"
exit "${status:-0}"
