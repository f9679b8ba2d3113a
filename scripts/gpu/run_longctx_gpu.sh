#!/usr/bin/env bash
# Long-context decode and prefill round on one H200 (issue 27), binaries in $1 (default
# carry/longctx): the MLA and fp8-cache kernel tests against the CPU reference, then bench-step
# (K2.6 x3, bf16 experts as the issue measured, and the INT4 preset) at contexts 1024, 32768
# and 131072 with bf16 and fp8_e4m3 KV caches, prefill of 1024 / 8192 / 32768-token prompts,
# per-op breakdowns. (The split, tiled and bf16-weights kernels were compared side by side at
# 91a32c1, docs/benchmarks.md "Long contexts"; the serving choice is fixed since.) Table lines
# go to stdout; logs: $OUT/tests.txt, $OUT/bench.txt.
set -u
D=${1:-carry/longctx}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 100 $D/cuda_backend_tests --gtest_filter='CudaOps.Mla*:CudaOps.KvWrite*:CudaMlaDecode.*' > $OUT/tests.txt 2>&1
echo "tests rc=$? (${SECONDS}s)"; grep -E "^\[  (PASSED|FAILED) |Failure|error|Which is|max diff|elements beyond" $OUT/tests.txt | head -30
bench() {  # name model context batches [extra flags]
  local name=$1 model=$2 context=$3 batches=$4; shift 4
  if ((SECONDS > 215)); then echo "== $name skipped (${SECONDS}s)"; return; fi
  echo "== $name: $model context $context $*" >> $OUT/bench.txt
  timeout 40 $D/moeserve bench-step --model $model --layers 3 \
    --batch $batches --context $context --iterations 10 --warmup 2 "$@" >> $OUT/bench.txt 2>&1
  local rc=$?
  echo "== $name rc=$rc (${SECONDS}s)"
  tac $OUT/bench.txt | sed -n '1,/^== /p' | tac | grep -E "^ +[0-9]+ +[0-9.]+ |ceiling|rror|what|per op" | cut -c1-700
}
BF=synthetic:kimi-k2.6:dtype=bf16
I4=synthetic:kimi-k2.6
for M in BF I4; do
  model=${!M}
  bench ${M}_c32768 $model 32768 1,8,32
  bench ${M}_c32768_fp8 $model 32768 1,8,32 --kv-cache-dtype fp8_e4m3
  bench ${M}_c131072 $model 131072 1,8
  bench ${M}_c131072_fp8 $model 131072 1,8 --kv-cache-dtype fp8_e4m3
  bench ${M}_c1024 $model 1024 1,8,32
  bench ${M}_c1024_fp8 $model 1024 1,8,32 --kv-cache-dtype fp8_e4m3
  bench ${M}_prefill $model 1024 1 --prefill 1024,8192,32768
done
bench BF_c32768_breakdown $BF 32768 8 --breakdown
bench BF_c131072_b1_breakdown $BF 131072 1 --breakdown
