#!/usr/bin/env bash
# Long-context decode and prefill round on one H200 (issue 27), binaries in $1 (default
# carry/longctx): the MLA and fp8-cache kernel tests against the CPU reference, then bench-step
# (K2.6 x3) at contexts 1024, 32768 and 131072 with each MLA decode kernel (MOESERVE_MLA_DECODE:
# split = the per-16-heads kernels of before, tiled = all heads per block with the balanced
# schedule, tiled-bf16p = the same with bf16 softmax weights), bf16 and fp8_e4m3 KV caches, the
# prefill of 1024 / 8192 / 32768-token prompts, and a per-op breakdown. Runs in priority order
# and skips what would pass 225 s. Logs in $OUT.
set -u
D=${1:-carry/longctx}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
timeout 80 $D/cuda_backend_tests --gtest_filter='CudaOps.Mla*:CudaOps.KvWrite*:CudaFp8Cache.*' > $OUT/tests.txt 2>&1
echo "tests rc=$? (${SECONDS}s)"; grep -E "^\[  (PASSED|FAILED) |Failure|error" $OUT/tests.txt | head -20
bench() {  # name kernel context batches [extra flags]
  local name=$1 kernel=$2 context=$3 batches=$4; shift 4
  if ((SECONDS > 200)); then echo "== $name skipped (${SECONDS}s)"; return; fi
  MOESERVE_MLA_DECODE=$kernel timeout 40 $D/moeserve bench-step --model synthetic:kimi-k2.6 --layers 3 \
    --batch $batches --context $context --iterations 10 --warmup 2 "$@" > $OUT/$name.txt 2>&1
  echo "== $name rc=$? (${SECONDS}s)"; grep -E "^ +[0-9]+ +[0-9.]+ |ceiling|rror" $OUT/$name.txt | cut -c1-110
}
bench tiled_c32768 tiled 32768 1,8,32
bench split_c32768 split 32768 1,8,32
bench tiled_c32768_fp8 tiled 32768 1,8,32 --kv-cache-dtype fp8_e4m3
bench tiled_c131072 tiled 131072 1,8
bench tiled_c1024 tiled 1024 1,8,32
bench split_c1024 split 1024 1,8,32
bench prefill tiled 1024 1 --prefill 1024,8192,32768
bench bf16p_c32768 tiled-bf16p 32768 1,8,32
bench tiled_c131072_fp8 tiled 131072 1,8 --kv-cache-dtype fp8_e4m3
bench tiled_c1024_fp8 tiled 1024 1,8,32 --kv-cache-dtype fp8_e4m3
bench split_c131072 split 131072 1,8
bench tiled_c32768_breakdown tiled 32768 8 --breakdown
grep -A2 "per op" $OUT/tiled_c32768_breakdown.txt 2>/dev/null | cut -c1-600
