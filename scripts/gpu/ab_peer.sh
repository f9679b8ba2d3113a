#!/usr/bin/env bash
# A/B of the peer all-reduce (comm/peer_all_reduce.h) against NCCL's: MOESERVE_PEER_ALL_REDUCE=1
# (default) and =0 alternate, two rounds, tp2 and ep2, 6 layers of synthetic:kimi-k2.6.
#   scripts/gpu/ab_peer.sh [BATCHES]   (default 1,64)
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
batches=${1:-1,64}
for round in 1 2; do for plan in tp2 ep2; do for peer in 1 0; do
  echo "round $round $plan peer=$peer: $(MOESERVE_PEER_ALL_REDUCE=$peer timeout 100 "$BIN" bench-step \
    --model synthetic:kimi-k2.6 --layers 6 --plan $plan --batch "$batches" --context 1024 --iterations 10 2>&1 \
    | grep -E '^ +[0-9]+ ' | awk '{printf "b%s %s ms %s | ", $1, $2, $6}')"
done; done; done
