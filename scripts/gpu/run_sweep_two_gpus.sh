#!/usr/bin/env bash
# Issue 7 acceptance 5 on two H200s: one server driven through tp2, ep2 and pp2 by live
# re-plan, bench at every concurrency; sweep.md records each re-plan's time to ready beside
# the cold start. Output in $OUT/sweep.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 520 "$BIN" sweep --backend cuda --model synthetic:kimi-k2.6:layers=4 --plans tp2,ep2,pp2 \
  --concurrency 1,8,32 --random-input-len 128 --random-output-len 64 --vocab-size 163840 \
  --context-length 512 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
tail -5 "$OUT/sweep.log"
cat "$OUT/sweep/sweep.md" 2>/dev/null
