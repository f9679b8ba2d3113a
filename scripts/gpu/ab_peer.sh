# A/B: peer all-reduce on (default) vs off, two rounds, tp2 and ep2 at batch 1 and 64.
export NCCL_NVLS_ENABLE=0
for round in 1 2; do for plan in tp2 ep2; do for peer in 1 0; do
  echo "round $round $plan peer=$peer: $(MOESERVE_PEER_ALL_REDUCE=$peer timeout 100 carry/moeserve bench-step --model synthetic:kimi-k2.6 --layers 6 --plan $plan --batch 1,64 --context 1024 --iterations 10 2>&1 | grep -E '^ +(1|64) ' | awk '{printf "b%s %s ms %s | ", $1, $2, $6}')"
done; done; done
