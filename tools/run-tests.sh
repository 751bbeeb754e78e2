#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: packages, build, then every test under
# the Khronos validation layer (lavapipe where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, so that a CI log shows where its minutes went.
phase_started=$SECONDS
phase_done() { echo "run-tests: $1 took $((SECONDS - phase_started)) s" >&2; phase_started=$SECONDS; }
bash tools/build.sh --tests
phase_done "packages and build"
export TESSERA_VALIDATION=1
# Shaders compiled by one test are reused by the next through the driver's caches there (on
# lavapipe, Mesa's shader cache: its VkPipelineCache keeps nothing; some kernels still miss
# it, compute/README.md).
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/build/cache}"
status=0
ctest --test-dir build --no-tests=error --output-on-failure --parallel "$(nproc)" --timeout 900 || status=1
phase_done "the suite"
# Again, the tests that move data between host and device (label discrete-gpu), with lavapipe
# presented as a discrete GPU by tests/support/discrete_gpu: device memory the host cannot map,
# host memory that is not coherent. The validation layer sits above it, so it checks against that GPU.
VK_ADD_LAYER_PATH="$PWD/build/tests/support/discrete_gpu" \
  VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation:VK_LAYER_TESSERA_discrete_gpu \
  ctest --test-dir build --no-tests=error --output-on-failure --parallel "$(nproc)" --timeout 900 -L discrete-gpu ||
  status=1
phase_done "the discrete-GPU tests"
# The bad-input and fuzz tests under AddressSanitizer and UndefinedBehaviorSanitizer.
# Beside it, the Debian package, installed with `apt install` into a fresh Debian 12 (debootstrap)
# where it runs the demo: about 2.5 minutes, mostly waiting on the mirror and dpkg, so it overlaps
# the sanitizer's build. Skipped, saying so, only where no mirror answers.
sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" bash tools/check-package.sh --skip-offline >build/package-check.log 2>&1 &
package_check=$!
bash tools/sanitize-tests.sh || status=1
wait "$package_check" || status=1
phase_done "the sanitizers' build and tests, beside the package check"
cat build/package-check.log
exit $status
