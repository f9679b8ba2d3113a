#!/usr/bin/env bash
# Sampled requests served by pp2 on two H200s with its two groups of requests in flight (each
# sampled row drawn on the device right after its micro-batch), tp2 beside it; top_k 50 and top_p 0.9 (flat synthetic rows: a whole-row draw) at
# concurrency 64 (scripts/gpu/serve_load.py). Logs in $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
MODEL=synthetic:kimi-k2.6:layers=6
port=30200
for plan in pp2 tp2; do
  name=$plan
  "$BIN" serve --model $MODEL --backend cuda --plan $plan --port $port \
    --max-running-requests 64 --context-length 1024 > "$OUT/serve_$name.log" 2>&1 &
  server=$!
  for i in $(seq 1 180); do curl -s localhost:$port/health > /dev/null 2>&1 && break; sleep 1; done
  echo "== $plan"
  timeout 200 python3 scripts/gpu/serve_load.py --port $port --concurrency 64 --requests 128 --input-len 128 \
    --output-len 256 --temperature 0.8 --top-k 50 --prompt-seed 1 | tee "$OUT/serve_load_${name}_topk50.json"
  timeout 200 python3 scripts/gpu/serve_load.py --port $port --concurrency 64 --requests 64 --input-len 128 \
    --output-len 128 --temperature 0.8 --top-p 0.9 --prompt-seed 2 | tee "$OUT/serve_load_${name}_topp09.json"
  curl -s localhost:$port/metrics | grep -E "^moeserve_(device_drawn_rows|sampled_rows|sampling_fallbacks)_total"
  kill -TERM $server; wait $server
  port=$((port + 1))
done
