#!/usr/bin/env bash
# Long-context decode and prefill round on one H200 (issue 27), binaries in $1 (default
# carry/longctx): the MLA and fp8-cache kernel tests against the CPU reference, then bench-step
# (K2.6 x3, bf16 experts as the issue measured, and the INT4 preset) at contexts 1024, 32768
# and 131072 with each MLA decode kernel (MOESERVE_MLA_DECODE: split = the per-16-heads kernels
# of before, tiled = all heads per block with the balanced schedule, tiled-bf16p = the same with
# bf16 softmax weights), bf16 and fp8_e4m3 KV caches, prefill of 1024 / 8192 / 32768-token
# prompts, per-op breakdowns. Table lines go to stdout; logs: $OUT/tests.txt, $OUT/bench.txt.
set -u
D=${1:-carry/longctx}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 100 $D/cuda_backend_tests --gtest_filter='CudaOps.Mla*:CudaOps.KvWrite*:CudaMlaDecode.*' > $OUT/tests.txt 2>&1
echo "tests rc=$? (${SECONDS}s)"; grep -E "^\[  (PASSED|FAILED) |Failure|error|Which is|max diff|elements beyond" $OUT/tests.txt | head -30
bench() {  # name model kernel context batches [extra flags]
  local name=$1 model=$2 kernel=$3 context=$4 batches=$5; shift 5
  if ((SECONDS > 215)); then echo "== $name skipped (${SECONDS}s)"; return; fi
  echo "== $name: $model $kernel context $context $*" >> $OUT/bench.txt
  MOESERVE_MLA_DECODE=$kernel timeout 40 $D/moeserve bench-step --model $model --layers 3 \
    --batch $batches --context $context --iterations 10 --warmup 2 "$@" >> $OUT/bench.txt 2>&1
  local rc=$?
  echo "== $name rc=$rc (${SECONDS}s)"
  tac $OUT/bench.txt | sed -n '1,/^== /p' | tac | grep -E "^ +[0-9]+ +[0-9.]+ |ceiling|rror|what|per op" | cut -c1-700
}
BF=synthetic:kimi-k2.6:dtype=bf16
I4=synthetic:kimi-k2.6
for M in BF I4; do
  model=${!M}
  bench ${M}_split_c32768 $model split 32768 1,8,32
  bench ${M}_tiled_c32768 $model tiled 32768 1,8,32
  bench ${M}_tiled_c32768_fp8 $model tiled 32768 1,8,32 --kv-cache-dtype fp8_e4m3
  bench ${M}_split_c131072 $model split 131072 1,8
  bench ${M}_tiled_c131072 $model tiled 131072 1,8
  bench ${M}_tiled_c131072_fp8 $model tiled 131072 1,8 --kv-cache-dtype fp8_e4m3
  bench ${M}_split_c1024 $model split 1024 1,8,32
  bench ${M}_tiled_c1024 $model tiled 1024 1,8,32
  bench ${M}_tiled_c1024_fp8 $model tiled 1024 1,8,32 --kv-cache-dtype fp8_e4m3
  bench ${M}_prefill $model auto 1024 1 --prefill 1024,8192,32768
done
bench BF_bf16p_c32768 $BF tiled-bf16p 32768 1,8,32
bench BF_tiled_c32768_breakdown $BF tiled 32768 8 --breakdown
bench BF_split_c32768_breakdown $BF split 32768 8 --breakdown
bench BF_tiled_c131072_b1_breakdown $BF tiled 131072 1 --breakdown
