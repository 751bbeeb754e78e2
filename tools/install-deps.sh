#!/usr/bin/env bash
# Installs tessera's build, test and benchmark dependencies from Debian 12's archive.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libvulkan-dev glslc spirv-tools mesa-vulkan-drivers vulkan-validationlayers vulkan-tools
  liblmdb-dev libhdf5-dev hdf5-tools libcli11-dev libtiff-dev libturbojpeg0-dev libjpeg-dev
  libopenslide-dev openslide-tools libvips-dev libdcmtk-dev libsqlite3-dev nlohmann-json3-dev libpng-dev
  libgtest-dev libgmock-dev
  python3-numpy python3-h5py python3-lmdb python3-pil python3-torch python3-torchvision python3-optuna python3-pytest python3-openslide libopenblas0-pthread
  libvips-tools time
  libpq-dev postgresql chromium libopenmpi-dev openmpi-bin python3-sqlalchemy python3-psycopg2
  patchelf xz-utils debootstrap  # bench/gpu/: the GPU bundle and its check in a bare Debian
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
