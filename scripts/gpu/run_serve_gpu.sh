#!/usr/bin/env bash
# Issue 6 acceptance 5 on one H200: output tok/s through HTTP at concurrency 64 beside
# bench-step's offline step for the same model and batch; greedy, then sampled requests
# (temperature 0.8 with top_k 50: drawn from device-reduced candidates; with top_p 0.9 alone:
# the flat synthetic distribution sends those rows past their candidates, to the whole-row draw
# on the device). Logs in $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
MODEL=synthetic:kimi-k2.6:layers=3
if [[ -x carry/cuda_backend_tests ]]; then
  timeout 120 carry/cuda_backend_tests > "$OUT/cuda_tests.txt" 2>&1 || { tail -30 "$OUT/cuda_tests.txt"; exit 1; }
  tail -1 "$OUT/cuda_tests.txt"
fi
"$BIN" serve --model $MODEL --backend cuda --port 30000 --max-running-requests 64 --context-length 1024 \
  > "$OUT/serve.log" 2>&1 &
server=$!
for i in $(seq 1 120); do curl -s localhost:30000/health > /dev/null 2>&1 && break; sleep 1; done
head -3 "$OUT/serve.log"
timeout 300 python3 scripts/gpu/serve_load.py --concurrency 64 --requests 128 --input-len 128 --output-len 512 \
  | tee "$OUT/serve_load.json"
timeout 300 python3 scripts/gpu/serve_load.py --concurrency 64 --requests 128 --input-len 128 --output-len 512 \
  --temperature 0.8 --top-k 50 --prompt-seed 1 | tee "$OUT/serve_load_topk50.json"
timeout 300 python3 scripts/gpu/serve_load.py --concurrency 64 --requests 64 --input-len 128 --output-len 128 \
  --temperature 0.8 --top-p 0.9 --prompt-seed 2 | tee "$OUT/serve_load_topp09.json"
kill -TERM $server; wait $server
timeout 200 "$BIN" bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 64 --context 384 --iterations 10 \
  | tee "$OUT/bench_step_b64_c384.txt"
# The previous build beside it (MOESERVE_BASE_BIN, e.g. the last commit's binary): the same
# sampled loads, drawn on the host from full logits there.
if [[ -n "${MOESERVE_BASE_BIN:-}" ]]; then
  "$MOESERVE_BASE_BIN" serve --model $MODEL --backend cuda --port 30001 --max-running-requests 64 --context-length 1024 \
    > "$OUT/serve_base.log" 2>&1 &
  server=$!
  for i in $(seq 1 120); do curl -s localhost:30001/health > /dev/null 2>&1 && break; sleep 1; done
  timeout 300 python3 scripts/gpu/serve_load.py --port 30001 --concurrency 64 --requests 128 --input-len 128 \
    --output-len 512 --temperature 0.8 --top-k 50 --prompt-seed 1 | tee "$OUT/serve_base_topk50.json"
  timeout 300 python3 scripts/gpu/serve_load.py --port 30001 --concurrency 64 --requests 64 --input-len 128 \
    --output-len 128 --temperature 0.8 --top-p 0.9 --prompt-seed 2 | tee "$OUT/serve_base_topp09.json"
  kill -TERM $server; wait $server
fi
