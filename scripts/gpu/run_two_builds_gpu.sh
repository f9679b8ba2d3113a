#!/usr/bin/env bash
# A change that must not move the GPU path, checked on one GPU: the new build's kernel tests,
# exactness against transformers and batch invariance, then bench-step of the base and the
# new build interleaved in the same call (base, new, base, new), so both see the same machine.
# Usage (on the GPU machine): scripts/gpu/run_two_builds_gpu.sh [BASE_DIR] [NEW_DIR] [PHASE]
#   each DIR holds moeserve, cuda_backend_tests and nccl_comm_tests; PHASE: checks|bench|all.
set -u
export NCCL_NVLS_ENABLE=0
BASE=${1:-carry/base}
NEW=${2:-carry/new}
phase=${3:-all}
FINAL=${OUT:-/tmp/out}
OUT=$(mktemp -d)  # every log here; one archive of them lands in $FINAL (few files come back)
mkdir -p "$FINAL"
trap 'tar czf "$FINAL/two_builds_logs.tgz" -C "$OUT" .' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
status=0
if [[ $phase == checks || $phase == all ]]; then
  for t in cuda_backend_tests nccl_comm_tests; do
    timeout 180 "$NEW/$t" > "$OUT/$t.txt" 2>&1 || status=1
    tail -3 "$OUT/$t.txt"; grep -E "FAILED|Failure" "$OUT/$t.txt" | head -20
  done
  timeout 300 python3 scripts/gpu/parity_vs_transformers.py --moeserve "$NEW/moeserve" \
    --out "$OUT/parity.json" > "$OUT/parity.txt" 2>&1 || status=1
  grep -v "Writing model" "$OUT/parity.txt" | tail -12
  timeout 300 python3 scripts/gpu/batch_invariance_gpu.py --moeserve "$NEW/moeserve" \
    --out "$OUT/batch_invariance.json" > "$OUT/batch_invariance.txt" 2>&1 || status=1
  tail -12 "$OUT/batch_invariance.txt"
fi
if [[ $phase == bench || $phase == all ]]; then
  for round in 1 2; do
    for build in base new; do
      dir=$BASE; [[ $build == new ]] && dir=$NEW
      echo "== $build, round $round"
      timeout 150 "$dir/moeserve" bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 1,64 --context 1024 \
        --iterations 20 --json "$OUT/bench_${build}_${round}.json" > "$OUT/bench_${build}_${round}.txt" 2>&1
      tail -6 "$OUT/bench_${build}_${round}.txt"
    done
  done
fi
exit $status
