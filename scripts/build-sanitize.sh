#!/usr/bin/env bash
# Configures and builds the ASan + UBSan flavour into build-sanitize/ (clang, CPU-only,
# -DMOESERVE_SANITIZE=ON: cmake/Sanitize.cmake): the libraries, the GoogleTest suite and the
# libFuzzer targets of fuzz/. Used by scripts/sanitize-tests.sh and scripts/fuzz.sh; arguments
# are the targets to build (all when none).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${MOESERVE_JOBS:-$(nproc)}"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DMOESERVE_CUDA=OFF \
  -DMOESERVE_SANITIZE=ON -DMOESERVE_BUILD_TESTS=ON >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build-sanitize -j "$jobs" "${targets[@]}"
