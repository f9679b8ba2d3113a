#!/usr/bin/env bash
# Decode-step performance round on two H200s (binaries in carry/): the gpu kernel tests, then
# bench-step on one GPU (K2.6 x3, context 1024, batch 1, 64 and 128, per-op breakdown) and on two GPUs (K2.6 x6,
# tp2 / ep2 / pp2 at batch 1 and 64, and tp2's per-op and per-collective breakdown at batch 1).
# Logs in $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B=carry/moeserve
timeout 120 carry/cuda_backend_tests > $OUT/cuda_tests.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/cuda_tests.txt; grep -E "FAILED|Failure" $OUT/cuda_tests.txt | head
timeout 200 $B bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 1,64,128 --context 1024 --iterations 10 --breakdown > $OUT/b1_c1024.txt 2>&1; cut -c1-150 $OUT/b1_c1024.txt
timeout 200 $B bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 64 --context 384 --page-size 16 --iterations 10 > $OUT/b1_c384_page16.txt 2>&1; tail -1 $OUT/b1_c384_page16.txt
timeout 200 $B bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 64 --context 384 --iterations 10 > $OUT/b1_c384_page64.txt 2>&1; tail -1 $OUT/b1_c384_page64.txt
for plan in tp2 ep2 pp2; do
  timeout 150 $B bench-step --model synthetic:kimi-k2.6 --layers 6 --plan $plan --batch 1,64 --context 1024 --iterations 10 > $OUT/b2_$plan.txt 2>&1
  echo "rc=$? $plan"; grep -E "^ +(1|64) " $OUT/b2_$plan.txt | cut -c1-120
done
timeout 150 $B bench-step --model synthetic:kimi-k2.6 --layers 6 --plan tp2 --batch 1 --context 1024 --iterations 10 --breakdown > $OUT/b2_tp2_breakdown.txt 2>&1
grep -A30 -i "breakdown\|op " $OUT/b2_tp2_breakdown.txt | head -40
