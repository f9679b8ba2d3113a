#!/usr/bin/env bash
# Kernel timeline of a bench-step decode step (CUDA graphs on), recorded through CUPTI by
# tools/kernel_trace.cc (build it into carry/libkernel_trace.so; carry/libcupti.so.13 beside it
# when the machine has none on its library path).
#   scripts/gpu/profile_step.sh PLAN BATCH LAYERS [CONTEXT]   -> $OUT/timeline_PLAN_bBATCH.txt
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
plan=$1 batch=$2 layers=$3 context=${4:-1024}
name=timeline_${plan}_b${batch}${TRACE_TAG:-}
trace=/tmp/${name}.csv
LD_LIBRARY_PATH=$PWD/carry:${LD_LIBRARY_PATH:-} CUDA_INJECTION64_PATH=$PWD/carry/libkernel_trace.so \
  MOESERVE_KERNEL_TRACE=$trace "$BIN" bench-step --model synthetic:kimi-k2.6 --layers "$layers" \
  --plan "$plan" --batch "$batch" --context "$context" --iterations 10 > "$OUT/${name}_bench.txt" 2>&1 \
  || { echo "bench-step rc=$?"; tail -5 "$OUT/${name}_bench.txt"; }
devices=0; [[ $plan != single ]] && devices="0 1"
for device in $devices; do
  python3 scripts/gpu/timeline.py "$trace" --device "$device" ${TIMELINE_ARGS:-}
done > "$OUT/$name.txt" 2>&1
gzip -c "$trace" > "$OUT/$name.csv.gz"
grep -E "^ +(1|64) " "$OUT/${name}_bench.txt" | cut -c1-100
head -50 "$OUT/$name.txt"
