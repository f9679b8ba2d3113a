#!/usr/bin/env bash
# README command one: install what is missing, build, and run moeserve on the embedded
# default model (synthetic:tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
MOESERVE_BUILD_TESTS=OFF scripts/build.sh -DMOESERVE_BUILD_TESTS=OFF
echo "[quickstart] build/bin/moeserve generate --model synthetic:tiny --prompt-ids 1,2,3,4 -n 16"
build/bin/moeserve generate --model synthetic:tiny --prompt-ids 1,2,3,4 -n 16
