#!/usr/bin/env bash
# Sampling on one H200 (binaries in carry/): the kernel tests, then bench-sampling's host
# sampler beside the device's whole-row draw of the same rows (flat and peaked rows, top-p,
# temperature alone, a top-k past the candidates), then serving's greedy / top-k / top-p loads
# (scripts/gpu/run_serve_gpu.sh; MOESERVE_BASE_BIN adds the previous build's sampled loads).
# Logs in $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for args in "--top-p 0.9" "--top-p 1" "--top-p 1 --top-k 300" "--top-p 0.9 --spread 8" "--top-p 0.95 --temperature 1.2"; do
  for rows in 1 64; do
    timeout 120 "$BIN" bench-sampling --backend cuda --rows $rows --repeat 3 $args 2>&1 | tee -a "$OUT/bench_sampling.txt"
  done
done
OUT=$OUT bash scripts/gpu/run_serve_gpu.sh
