#!/usr/bin/env bash
# Fails when a tracked C++ / CUDA file differs from what clang-format makes of it (.clang-format:
# Google's style at 120 columns). `scripts/check-format.sh --fix` rewrites them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run --Werror "${files[@]}"
  echo "[check-format] ${#files[@]} files formatted as .clang-format says"
fi
