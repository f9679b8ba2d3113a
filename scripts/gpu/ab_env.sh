#!/usr/bin/env bash
# A/B of an environment setting on bench-step, alternating, two rounds:
#   scripts/gpu/ab_env.sh VAR "VALUE_A VALUE_B" "PLANS" [BATCHES]
# e.g. scripts/gpu/ab_env.sh MOESERVE_PEER_ALL_REDUCE "1 0" "tp2 ep2" 1,64
# single runs 3 layers of $MOESERVE_MODEL (default synthetic:kimi-k2.6; 3 fit one H200), the others 6.
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
MODEL=${MOESERVE_MODEL:-synthetic:kimi-k2.6}  # e.g. synthetic:moonlight
var=$1 values=$2 plans=$3 batches=${4:-1,64}
for round in 1 2; do for plan in $plans; do for value in $values; do
  layers=6; [[ $plan == single ]] && layers=3
  echo "round $round $plan $var=$value: $(env "$var=$value" timeout 100 "$BIN" bench-step \
    --model "$MODEL" --layers $layers --plan $plan --batch "$batches" --context 1024 --iterations 10 2>&1 \
    | grep -E '^ +[0-9]+ ' | awk '{printf "b%s %s ms %s | ", $1, $2, $6}')"
done; done; done
