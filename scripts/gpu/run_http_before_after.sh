#!/usr/bin/env bash
# Issue 23 acceptance 4 on one H200: output tok/s through HTTP with the hand-written server
# (BASE_BIN, a build before Boost.Beast) and the Beast server (NEW_BIN), the same model and the
# same load from NEW_BIN's bench client, in alternating rounds so that drift hits both.
#   scripts/gpu/run_http_before_after.sh BASE_BIN NEW_BIN [ROUNDS]
# The bf16 preset in both: builds before the quantized checkpoints knew no :dtype, and their
# synthetic:kimi-k2.6 is bf16. Logs and one JSON line per run in $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BASE_BIN=$1 NEW_BIN=$2 ROUNDS=${3:-2}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
serve_and_bench() {  # label binary model port
  local label=$1 bin=$2 model=$3 port=$4
  "$bin" serve --model "$model" --backend "${BACKEND:-cuda}" --port "$port" --max-running-requests 64 --context-length 1024 \
    > "$OUT/serve_$label.log" 2>&1 &
  local server=$! up=0
  for i in $(seq 1 300); do
    curl -sf "localhost:$port/health" > /dev/null 2>&1 && { up=1; break; }
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  echo "[$label] up=$up after ${i} s: $(head -2 "$OUT/serve_$label.log" | tr '\n' ' ')"
  if (( up )); then
    timeout 100 "$NEW_BIN" bench --base-url "http://127.0.0.1:$port" --concurrency 1 --num-prompts 8 \
      --random-input-len 128 --random-output-len 128 --random-range-ratio 1 --vocab-size 163840 \
      --disable-tqdm --output-file "$OUT/bench_$label.jsonl" > "$OUT/bench_$label.txt" 2>&1
    timeout 200 "$NEW_BIN" bench --base-url "http://127.0.0.1:$port" --concurrency 8,64 --num-prompts 128 \
      --random-input-len 128 --random-output-len 128 --random-range-ratio 1 --vocab-size 163840 \
      --disable-tqdm --output-file "$OUT/bench_$label.jsonl" >> "$OUT/bench_$label.txt" 2>&1
    tail -n 30 "$OUT/bench_$label.txt"
  else
    tail -20 "$OUT/serve_$label.log"
  fi
  kill -TERM $server 2>/dev/null; wait $server
}
for r in $(seq 1 "$ROUNDS"); do
  serve_and_bench "base_r$r" "$BASE_BIN" "${BASE_MODEL:-synthetic:kimi-k2.6:layers=3}" 30000
  serve_and_bench "new_r$r" "$NEW_BIN" "${NEW_MODEL:-synthetic:kimi-k2.6:layers=3:dtype=bf16}" 30001
done
