#!/usr/bin/env bash
# README command two: install what is missing (Debian and PyPI), build everything, and run
# every test (GoogleTest suites and the Python oracle suites, through ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
scripts/build.sh -DMOESERVE_BUILD_TESTS=ON
cd build
ctest --output-on-failure -j "${MOESERVE_TEST_JOBS:-2}" "$@"
