#!/usr/bin/env bash
# Issue 7 acceptance 5 on two H200s: one server driven through tp2, ep2 and pp2 by live
# re-plan, bench at every concurrency; sweep.md records each re-plan's time to ready beside
# the cold start, and how many greedy outputs equal the first plan's. Then the same under
# --reduction-plan tp2 for one GPU, tp2 and pp2 (REDUCTION=0 skips it), and with INVARIANT=1
# also with --batch-invariant (outputs equal one GPU's under any load). PLAIN=0 skips the first.
# Output in $OUT/sweep, $OUT/sweep_reduction_tp2 and $OUT/sweep_invariant_tp2.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
sweep() {  # name plans extra-flags...
  local name=$1 plans=$2
  shift 2
  timeout 400 "$BIN" sweep --backend cuda --model synthetic:kimi-k2.6:layers=4 --plans "$plans" \
    --concurrency 1,8,32 --random-input-len 128 --random-output-len 64 --vocab-size 163840 \
    --context-length 512 --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"
  tail -3 "$OUT/$name.log"
  cat "$OUT/$name/sweep.md" 2>/dev/null
}
[[ ${PLAIN:-1} == 1 ]] && sweep sweep tp2,ep2,pp2
[[ ${REDUCTION:-1} == 1 ]] && sweep sweep_reduction_tp2 single,tp2,pp2 --reduction-plan tp2
[[ ${INVARIANT:-0} == 1 ]] && sweep sweep_invariant_tp2 single,tp2,pp2 --reduction-plan tp2 --batch-invariant
