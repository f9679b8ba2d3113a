#!/usr/bin/env bash
# Bounded fuzzing: builds the libFuzzer targets (scripts/build-sanitize.sh) and runs each for
# SECONDS (default 60) from its seed corpus fuzz/corpus/<target>/ (with fuzz/<target>.dict when
# there is one). Fails when any target crashes, leaks, hangs (-timeout), runs out of memory
# (-rss_limit_mb) or trips a sanitizer; the input that did it is saved as
# build-sanitize/fuzz-artifacts/<target>-<kind>-<hash>. New inputs the runs find go to
# build-sanitize/fuzz-corpus/<target>/ (kept between runs, never into the repository).
# An input counts as a hang past 30 s: the real Kimi K2.6 config takes 0.4 s of CPU in the
# config target under ASan, and a 10 s limit flagged it on a machine loaded 15-fold.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     e.g. scripts/fuzz.sh 600 config
# See docs/fuzzing.md (runs of hours, reproducing an artifact, adding a regression seed).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
mapfile -t all_targets < <(sed -n 's/^moeserve_add_fuzz_target(\([a-z_]*\).*/\1/p' fuzz/CMakeLists.txt)
targets=("$@")
(( ${#targets[@]} )) || targets=("${all_targets[@]}")
scripts/build-sanitize.sh "${targets[@]/%/_fuzz}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
mkdir -p build-sanitize/fuzz-artifacts
failed=()
for target in "${targets[@]}"; do
  work="build-sanitize/fuzz-corpus/$target"
  mkdir -p "$work"
  args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1
        -artifact_prefix="build-sanitize/fuzz-artifacts/$target-")
  [[ -f "fuzz/$target.dict" ]] && args+=(-dict="fuzz/$target.dict")
  log="build-sanitize/fuzz-artifacts/$target.log"
  echo "[fuzz] $target: ${seconds} s"
  if "build-sanitize/fuzz/${target}_fuzz" "${args[@]}" "$work" "fuzz/corpus/$target" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$log" | tr '\n' ' ' | sed 's/^/[fuzz]   /'
    echo
  else
    echo "[fuzz] $target FAILED; the report (last lines of $log):"
    tail -n 40 "$log"
    failed+=("$target")
  fi
done
if (( ${#failed[@]} )); then
  echo "[fuzz] failed: ${failed[*]} (inputs under build-sanitize/fuzz-artifacts/)" >&2
  exit 1
fi
echo "[fuzz] ${#targets[@]} targets ran ${seconds} s each: no crash, leak, hang or sanitizer report"
