#!/usr/bin/env bash
# Serving a pipeline plan on two H200s: pp2 with its two groups of requests in flight (the
# default, --pp-groups 2) against one step at a time (--pp-groups 1), and tp2 beside them;
# greedy streaming completions at concurrency 64 (scripts/gpu/serve_load.py). Logs in $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
MODEL=synthetic:kimi-k2.6:layers=6
port=30100
for variant in "pp2 2" "pp2 1" "tp2 0"; do
  read -r plan groups <<< "$variant"
  name=${plan}_groups${groups}
  "$BIN" serve --model $MODEL --backend cuda --plan $plan --pp-groups $groups --port $port \
    --max-running-requests 64 --context-length 1024 > "$OUT/serve_$name.log" 2>&1 &
  server=$!
  for i in $(seq 1 180); do curl -s localhost:$port/health > /dev/null 2>&1 && break; sleep 1; done
  echo "== $plan --pp-groups $groups"
  timeout 300 python3 scripts/gpu/serve_load.py --port $port --concurrency 64 --requests 128 --input-len 128 \
    --output-len 256 | tee "$OUT/serve_load_$name.json"
  kill -TERM $server; wait $server
  port=$((port + 1))
done
