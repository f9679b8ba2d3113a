#!/usr/bin/env bash
# Issue 5 on one H200: kernel tests, model exactness vs transformers, bench-step with and
# without CUDA graphs, and transformers' decode step on the same shapes. Logs go to $OUT.
# Usage (on the GPU machine, binaries in carry/): scripts/gpu/run_single_gpu.sh PHASE
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
phase=${1:-all}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [[ $phase == kernels || $phase == smoke || $phase == all ]]; then
  timeout 120 carry/cuda_backend_tests > "$OUT/cuda_tests.txt" 2>&1
  tests_rc=$?
  tail -4 "$OUT/cuda_tests.txt"; grep -E "FAILED|Failure|error" "$OUT/cuda_tests.txt" | head -20
  [[ $tests_rc == 0 ]] || exit 1
fi
if [[ $phase == smoke || $phase == all ]]; then
  timeout 300 python3 scripts/gpu/parity_vs_transformers.py --moeserve "$BIN" --out "$OUT/gpu_parity.json" 2>&1 | grep -v "Writing model" | tail -12
fi
if [[ $phase == kernels || $phase == smoke || $phase == all ]]; then
  timeout 240 "$BIN" bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 1,64 --context 256 --iterations 10 \
    --breakdown --json "$OUT/bench_k26_l3_c256.json" 2>&1 | tee "$OUT/bench_k26_l3_c256.txt"
fi
if [[ $phase == kernels || $phase == bench || $phase == all ]]; then
  timeout 240 "$BIN" bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 1,8,32,64,128 --context 1024 \
    --iterations 20 --json "$OUT/bench_k26_l3_c1024.json" 2>&1 | tee "$OUT/bench_k26_l3_c1024.txt"
  timeout 240 "$BIN" bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 1,64 --context 256 --iterations 20 \
    --no-cuda-graph --json "$OUT/bench_k26_l3_c256_nograph.json" 2>&1 | tee "$OUT/bench_k26_l3_c256_nograph.txt"
  timeout 400 python3 scripts/gpu/bench_transformers.py --preset kimi-k2.6 --layers 3 --batch 1,64 --context 256 \
    2>&1 | tail -5 | tee "$OUT/bench_transformers_k26_l3_c256.txt"
fi
