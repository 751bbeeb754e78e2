#!/usr/bin/env bash
# Installs the Debian packages tessera needs and builds it in build/ (Release with debug info),
# warnings as errors as in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_WERROR=ON >/dev/null
cmake --build build --parallel "$(nproc)"
