#!/usr/bin/env bash
# Issue 22 acceptance 2 on one H200 (binary in carry/advisor/): bench-step of synthetic:kimi-k2.6
# (2 layers: the dense one and one MoE layer, so that bf16 fits one GPU) in bf16 and as published
# (INT4 routed experts) at batch 1..128 and contexts 1k / 8k / 32k and prefill passes of 256 / 1024 /
# 4096 tokens, then serving through HTTP at
# concurrency 1, 8 and 64 (input 1024, output 256, greedy, ignore_eos); then
# scripts/gpu/advisor_gpu_compare.py calibrates the H200 profile per dtype from the context-1024 steps
# and the prefill passes and prints every held-out point's prediction and error (it needs no GPU: it
# can be re-run anywhere on $OUT with another build's plan advise). Logs and JSON in $OUT. < 4 minutes.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/advisor/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LAYERS=2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
for dtype in bf16 int4; do
  model=synthetic:kimi-k2.6:layers=$LAYERS
  [[ $dtype == bf16 ]] && model=$model:dtype=bf16
  for context in 1024 8192 32768; do
    timeout 60 "$BIN" bench-step --model "$model" --backend cuda --batch 1,8,32,64,128 --context $context \
      --iterations 5 --warmup 2 --json "$OUT/step_${dtype}_c${context}.json" > "$OUT/step_${dtype}_c${context}.txt" 2>&1
    echo "bench-step $dtype context $context rc=$?"; tail -6 "$OUT/step_${dtype}_c${context}.txt" | cut -c1-120
  done
  timeout 60 "$BIN" bench-step --model "$model" --backend cuda --prefill 256,1024,4096 --iterations 8 \
    --json "$OUT/prefill_${dtype}.json" > "$OUT/prefill_${dtype}.txt" 2>&1
  echo "bench-step $dtype prefill rc=$?"; tail -4 "$OUT/prefill_${dtype}.txt" | cut -c1-120
done
"$BIN" serve --model synthetic:kimi-k2.6:layers=$LAYERS --backend cuda --port 30000 --max-running-requests 64 \
  --context-length 1536 > "$OUT/serve.log" 2>&1 &
server=$!
for i in $(seq 1 120); do curl -s localhost:30000/health > /dev/null 2>&1 && break; sleep 1; done
head -3 "$OUT/serve.log"
for c in 1 8 64; do
  timeout 60 python3 scripts/gpu/serve_load.py --concurrency $c --requests $((c > 1 ? 2 * c : 4)) --input-len 1024 \
    --output-len 256 > "$OUT/serve_c$c.json" 2>&1
  echo "serve c=$c rc=$?"; tail -1 "$OUT/serve_c$c.json" | cut -c1-200
done
kill -TERM $server; wait $server
python3 scripts/gpu/advisor_gpu_compare.py --dir "$OUT" --bin "$BIN" --layers $LAYERS --input-len 1024 \
  --output-len 256 2>&1 | tee "$OUT/compare.txt"
