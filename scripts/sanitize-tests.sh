#!/usr/bin/env bash
# The sanitizer job: builds build-sanitize/ (scripts/build-sanitize.sh: ASan + UBSan, any UB
# report fatal) and runs the C++ tests there: every GoogleTest suite and the replay of each fuzz
# target's corpus (label fuzz), not the Python suites (label python) or the GPU checks. A leak,
# an out-of-bounds access or undefined behaviour fails the test that hit it.
# Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-sanitize.sh
cd build-sanitize
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
ctest --output-on-failure -j "${MOESERVE_TEST_JOBS:-2}" -LE 'python|gpu' "$@"
