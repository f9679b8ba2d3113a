#!/usr/bin/env bash
# --reduction-plan on two H200s: the CUDA op tests, one GPU = tp2 = pp2 (under tp2) and one
# GPU = ep2 (under ep2) to the bit (plans_bitwise_gpu.py), and what a reduction plan costs per
# decode step (bench-step without and with one: one GPU K2.6 x3, tp2 and ep2 K2.6 x6). Logs in $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 120 carry/cuda_backend_tests > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?"; tail -3 "$OUT/cuda_tests.txt"
timeout 420 python3 scripts/gpu/plans_bitwise_gpu.py --moeserve "$BIN" --out "$OUT/plans_bitwise.json" 2>&1 \
  | grep -v "Writing model" | cut -c1-900
for run in "single 3 tp2" "single 3 ep2" "tp2 6 tp2" "ep2 6 ep2"; do
  set -- $run
  for reduction in single $3; do
    [[ $1 == single && $reduction == single && $3 == ep2 ]] && continue  # measured with tp2's row
    timeout 150 "$BIN" bench-step --model synthetic:kimi-k2.6 --layers $2 --plan $1 --batch 1,64 --context 1024 \
      --iterations 10 --reduction-plan $reduction > "$OUT/bench_${1}_under_${reduction}.txt" 2>&1
    echo "rc=$? $1 layers $2 under $reduction"; grep -E "^ +(1|64) " "$OUT/bench_${1}_under_${reduction}.txt" | cut -c1-160
  done
done
