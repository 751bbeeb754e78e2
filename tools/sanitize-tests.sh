#!/usr/bin/env bash
# The bad-input and fuzz tests again, against a tessera built with AddressSanitizer and
# UndefinedBehaviorSanitizer (build-sanitize/): any report fails the run, whatever the exit code
# of the process that made it. tools/run-tests.sh calls this after the suite. Unoptimised, with
# line tables only: it compiles in about half the time, and these tests run little compute. A
# unity build, as tools/build.sh: 381 s instead of 759 on two cores. At -O1 the tests took
# 119 s instead of 200, but the build 554 s.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DTESSERA_WERROR=ON -DTESSERA_SANITIZE=ON \
  -DBUILD_TESTING=OFF -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build-sanitize --parallel "$(nproc)" --target tessera
reports="$PWD/build-sanitize/reports"
rm -rf "$reports"
mkdir -p "$reports"
# Leaks are not reported: the Vulkan loader, Mesa, GLib and libvips keep what they allocate until
# the process ends. Every other error stops the process and is logged. Signals are left to kill
# the process as they would without the sanitizers: OpenSlide's crashes are contained in a probe
# child that tells them by the signal (data/openslide_probe.cpp), and a signal in tessera itself
# fails the test that sees it.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:handle_segv=0:handle_sigbus=0:handle_sigfpe=0:log_path=$reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
export TESSERA_BINARY="$PWD/build-sanitize/tools/tessera"
# Memory ceilings are the plain run's: the sanitizers' shadow memory adds a few hundred MiB.
export TESSERA_SANITIZED=1
status=0
# Two halves at once, one a core: the slides' tests and the models'.
/usr/bin/python3 -m pytest -p no:cacheprovider -q -rA \
  tests/test_data_bad_input.py tests/test_data_slide_bounds.py tests/test_fuzz_slides.py tests/test_slide_declared.py \
  >"$PWD/build-sanitize/pytest-slides.log" 2>&1 &
slides=$!
/usr/bin/python3 -m pytest -p no:cacheprovider -q -rA \
  tests/test_error_messages.py tests/test_bad_models.py tests/test_fuzz_models.py >"$PWD/build-sanitize/pytest-models.log" 2>&1 ||
  status=1
wait "$slides" || status=1
cat "$PWD/build-sanitize/pytest-slides.log" "$PWD/build-sanitize/pytest-models.log"
if compgen -G "$reports/*" >/dev/null; then
  echo "sanitizer reports:" >&2
  cat "$reports"/* >&2
  status=1
fi
exit $status
