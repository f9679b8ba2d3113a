#!/usr/bin/env bash
# Structured output's cost on one H200 (issue 24, acceptance 4: <= 10% of decode throughput at
# batch 64): `moeserve bench` at concurrency 64 against one server, plain and with a JSON schema
# in --extra-request-body, alternated twice (synthetic:kimi-k2.6 with 3 layers, vocabulary
# 163840, on cuda; greedy, 128 requests x 256 tokens, prompts of 128 random ids). The schema
# ({"values": integers, minItems 1000}) never completes in 256 tokens, so every token of every
# request is drawn under its grammar's mask. scripts/gpu/serve_load.py then reads the server's
# decode step time and host time per step for each mode, and structured_output_check.py checks
# that 32 random-model outputs under a bounded schema parse and validate (the UTF-8 case).
# Run one: about 2 minutes on one H200.
# Usage: scripts/gpu/run_grammar_gpu.sh BIN_DIR OUT [MODEL]
set -uo pipefail
bin=${1:?moeserve dir}; out=${2:?out dir}; model=${3:-synthetic:kimi-k2.6:layers=3}
here=$(cd "$(dirname "$0")" && pwd)  # serve_load.py and structured_output_check.py sit beside it
mkdir -p "$out"
port=30412
# MOESERVE_GRAMMAR_TIMING: the mask fill's time and the last stage's wait for the masks, in server.txt.
MOESERVE_GRAMMAR_TIMING=200 "$bin/moeserve" serve --model "$model" --backend cuda --max-running-requests 64 --context-length 1024 \
  --port $port > "$out/server.txt" 2>&1 &
server=$!
for _ in $(seq 1 240); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" \
    2> /dev/null && break
  sleep 0.5
done
format='{"type":"json_schema","json_schema":{"name":"values","strict":true,"schema":{"type":"object","properties":{"values":{"type":"array","items":{"type":"integer"},"minItems":1000}},"required":["values"]}}}'
for round in 1 2; do
  for mode in plain schema; do
    body='{"temperature": 0}'; [[ $mode == schema ]] && body="{\"temperature\": 0, \"response_format\": $format}"
    "$bin/moeserve" bench --base-url "http://127.0.0.1:$port" --concurrency 64 --num-prompts 128 \
      --dataset random-ids --random-input-len 128 --random-output-len 256 --random-range-ratio 1 \
      --warmup-requests 8 --extra-request-body "$body" --tag "$mode-$round" --output-file "$out/bench.jsonl" \
      --disable-tqdm > "$out/bench_${mode}_$round.txt" 2>&1
    echo "bench $mode round $round rc=$?: $(grep -i 'output token throughput' "$out/bench_${mode}_$round.txt")" |
      tee -a "$out/summary.txt"
  done
done
for mode in plain schema; do
  extra=(); [[ $mode == schema ]] && extra=(--response-format "$format")
  python3 "$here/serve_load.py" --port $port --concurrency 64 --requests 128 --input-len 128 --output-len 256 \
    "${extra[@]}" > "$out/load_$mode.json" 2>&1
  echo "serve_load $mode: $(cat "$out/load_$mode.json")" | tee -a "$out/summary.txt"
done
python3 "$here/structured_output_check.py" --port $port > "$out/check.txt" 2>&1
echo "parse check rc=$? $(tail -n 1 "$out/check.txt")" | tee -a "$out/summary.txt"
kill -TERM $server; wait $server
echo "server exit $?" | tee -a "$out/summary.txt"
grep "grammar timing" "$out/server.txt" | tail -n 4 | tee -a "$out/summary.txt"
