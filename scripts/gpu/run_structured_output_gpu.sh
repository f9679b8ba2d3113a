#!/usr/bin/env bash
# Structured output on one H200 (issue 24 line 4): the token-bitmask kernel against the CPU op,
# then decode throughput through HTTP at concurrency 64 with and without a JSON schema
# (synthetic:kimi-k2.6, 3 layers, vocabulary 163840; greedy, 128 requests x 256 tokens, runs
# alternated plain / schema twice in one server), and constrained outputs that must parse.
# Usage: scripts/gpu/run_structured_output_gpu.sh BIN_DIR TESTS_DIR OUT
set -uo pipefail
bin=${1:?moeserve dir}; tests=${2:?tests dir}; out=${3:?out dir}
here=$(cd "$(dirname "$0")" && pwd)  # serve_load.py and structured_output_check.py sit beside it
mkdir -p "$out"
"$tests/cuda_backend_tests" --gtest_filter='CudaTokenBitmask*' > "$out/kernel_test.txt" 2>&1
echo "kernel test rc=$?" | tee -a "$out/summary.txt"
port=30411
"$bin/moeserve" serve --model synthetic:kimi-k2.6:layers=3 --backend cuda --max-running-requests 64 \
  --context-length 1024 --port $port > "$out/server.txt" 2>&1 &
server=$!
for _ in $(seq 1 240); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" \
    2> /dev/null && break
  sleep 0.5
done
schema='{"type":"json_schema","json_schema":{"name":"values","strict":true,"schema":{"type":"object","properties":{"values":{"type":"array","items":{"type":"integer"},"minItems":1000}},"required":["values"]}}}'
for round in 1 2; do
  for mode in plain schema; do
    extra=(); [[ $mode == schema ]] && extra=(--response-format "$schema")
    python3 "$here/serve_load.py" --port $port --concurrency 64 --requests 128 --input-len 128 \
      --output-len 256 "${extra[@]}" > "$out/load_${mode}_$round.json" 2>&1
    echo "$mode round $round: $(cat "$out/load_${mode}_$round.json")" | tee -a "$out/summary.txt"
  done
done
python3 "$here/structured_output_check.py" --port $port > "$out/check.txt" 2>&1
echo "parse check rc=$? $(tail -n 1 "$out/check.txt")" | tee -a "$out/summary.txt"
kill -TERM $server; wait $server
echo "server exit $?" | tee -a "$out/summary.txt"
