#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: packages, build, then every test under
# the Khronos validation layer (lavapipe where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh --tests
export TESSERA_VALIDATION=1
# Pipelines compiled by one test are reused by the next through tessera's pipeline cache.
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/build/cache}"
ctest --test-dir build --no-tests=error --output-on-failure --parallel "$(nproc)" --timeout 900
