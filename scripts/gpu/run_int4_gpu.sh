#!/usr/bin/env bash
# Issue 19, acceptance 4 on one H200: the quantized kernel tests, the kernels' bandwidth
# (CudaQuantBench) and the whole decode step (bench-step) of the INT4 K2.6 and FP8 DeepSeek-V3
# presets, for the new build and (bench-step K2.6 only) a base build, in the same call so that
# both read against the same machine's copy bandwidth.
# Usage (on the GPU machine, repo root): scripts/gpu/run_int4_gpu.sh NEW_DIR [BASE_DIR]
#   NEW_DIR holds moeserve and cuda_backend_tests, BASE_DIR moeserve; logs to $OUT.
set -u
NEW=${1:-carry/int4/new}
BASE=${2:-}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
status=0
timeout 30 "$NEW/cuda_backend_tests" --gtest_filter='CudaQuant*:-CudaQuantMoe.K26*' > "$OUT/quant_tests.txt" 2>&1 ||
  status=1
tail -3 "$OUT/quant_tests.txt"; grep -E "FAILED|Failure" "$OUT/quant_tests.txt" | head -20
timeout 45 "$NEW/cuda_backend_tests" --gtest_also_run_disabled_tests \
  --gtest_filter='CudaQuantBench.*' > "$OUT/quant_bench.txt" 2>&1 || status=1
grep "quant-bench" "$OUT/quant_bench.txt"
k26=(--model synthetic:kimi-k2.6 --layers 12 --batch 1,8,32,64,128 --context 1024)
for build in new base; do
  dir=$NEW; [[ $build == base ]] && dir=$BASE
  [[ -z $dir ]] && continue
  echo "== $build: bench-step K2.6 INT4"
  timeout 40 "$dir/moeserve" bench-step "${k26[@]}" --json "$OUT/k26_$build.json" > "$OUT/k26_$build.txt" 2>&1 ||
    status=1
  tail -8 "$OUT/k26_$build.txt"
done
echo "== new: bench-step DeepSeek-V3 FP8"
timeout 35 "$NEW/moeserve" bench-step --model synthetic:deepseek-v3 --layers 10 --batch 1,64 --context 1024 \
  --json "$OUT/dsv3_new.json" > "$OUT/dsv3_new.txt" 2>&1 || status=1
tail -5 "$OUT/dsv3_new.txt"
# The full-size expert check last: its CPU reference takes about a minute.
timeout 55 "$NEW/cuda_backend_tests" --gtest_filter='CudaQuantMoe.K26*' > "$OUT/quant_tests_k26.txt" 2>&1 || status=1
tail -3 "$OUT/quant_tests_k26.txt"; grep -E "FAILED|Failure" "$OUT/quant_tests_k26.txt" | head -20
exit $status
