#!/usr/bin/env bash
# Installs tessera's dependencies from Debian 12's archive (as root, or with sudo).
#   bash tools/install-deps.sh           what building and running tessera needs (tools/demo.sh)
#   bash tools/install-deps.sh --tests   that, and what the test suite and the benchmarks add
#   bash tools/install-deps.sh [--tests] --list   prints the package names and installs nothing
set -euo pipefail
tests=0 list=0
for argument in "$@"; do
  case "$argument" in
    --tests) tests=1 ;;
    --list) list=1 ;;
    *) echo "install-deps.sh: unknown option '$argument' (--tests, --list)" >&2; exit 2 ;;
  esac
done

# Building tessera, and running it on any Vulkan device (lavapipe, Mesa's CPU device, included).
main_packages=(
  build-essential cmake ninja-build pkg-config
  libvulkan-dev glslc mesa-vulkan-drivers
  liblmdb-dev libhdf5-dev libcli11-dev libtiff-dev libturbojpeg0-dev libpng-dev
  libopenslide-dev libvips-dev libdcmtk-dev libsqlite3-dev libpq-dev nlohmann-json3-dev
  libopenmpi-dev openmpi-bin libssl-dev
)
# The test suite and the benchmarks: GoogleTest, the validation layer, the independent readers and
# references (h5py, python3-lmdb, OpenSlide, PyTorch), the real services the tests start
# (PostgreSQL, Chromium for the sweep's HTML export, a Slurm cluster with munge), peers (vips).
test_packages=(
  libgtest-dev libgmock-dev vulkan-validationlayers vulkan-tools spirv-tools hdf5-tools
  openslide-tools libvips-tools time
  python3-numpy python3-h5py python3-lmdb python3-pil python3-torch python3-torchvision python3-optuna
  python3-pytest python3-openslide python3-tifffile libopenblas0-pthread python3-sqlalchemy python3-psycopg2
  postgresql chromium
  slurmctld slurmd slurm-client munge
  patchelf xz-utils debootstrap  # bench/gpu/: the GPU bundle and its check in a bare Debian
)
packages=("${main_packages[@]}")
((tests)) && packages+=("${test_packages[@]}")
if ((list)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
what=$( ((tests)) && echo "tessera's build, tests and benchmarks" || echo "building and running tessera")
if ((${#missing[@]} == 0)); then
  echo "install-deps.sh: the ${#packages[@]} Debian packages for $what are installed"
  exit 0
fi
sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
# What apt will fetch for them (their dependencies included), from its own plan.
read -r count bytes < <(apt-get install -qq --print-uris --no-install-recommends "${missing[@]}" |
                        awk '/^\x27/ {n++; s += $3} END {print n + 0, s + 0}')
echo "install-deps.sh: for $what, installing ${missing[*]}" \
     "($count packages with their dependencies, $((bytes / 1000000)) MB to download)"
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
