#!/usr/bin/env bash
# One H200, a merged tree's checks in one call (about 5 minutes): every CUDA op test (the
# full-size K2.6 expert check included), `moeserve serve` with no flag but the model (issue 25,
# acceptance 4: on the GPU, KV cache sized from free memory) answering a completion, NEXTN
# speculative decoding on the GPU against plain decoding (greedy, the default model), the
# structured-output parse check, and bench-step of the INT4 and FP8 presets.
# Usage: scripts/gpu/run_merged_check_gpu.sh BIN_DIR OUT   (BIN_DIR: moeserve, cuda_backend_tests)
set -uo pipefail
bin=${1:?bin dir}; out=${2:?out dir}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 "$bin/cuda_backend_tests" > "$out/cuda_tests.txt" 2>&1
echo "cuda tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/cuda_tests.txt" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]" "$out/cuda_tests.txt" | head

port=30501
"$bin/moeserve" serve --model synthetic:kimi-k2.6:layers=3 --port $port > "$out/serve_default.txt" 2>&1 &
server=$!
for _ in $(seq 1 240); do curl -sf "localhost:$port/health" > /dev/null 2>&1 && break; sleep 0.5; done
grep -iE "backend|tokens fit|kv" "$out/serve_default.txt" | head -5
curl -s "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "synthetic:kimi-k2.6:layers=3", "prompt": "Hello", "max_tokens": 8, "temperature": 0}' | cut -c1-300
echo
kill -TERM $server; wait $server; echo "serve exit $?"

prompts=(--prompt "The Python interpreter is" --prompt "In the beginning God created" --prompt "A list is a sequence of")
timeout 120 "$bin/moeserve" generate --model models/default --backend cuda -n 64 --ignore-eos "${prompts[@]}" > "$out/plain.txt" 2> "$out/plain_err.txt"
echo "plain rc=$?"
timeout 120 "$bin/moeserve" generate --model models/default --backend cuda -n 64 --ignore-eos --speculative-algorithm NEXTN \
  --speculative-num-steps 3 "${prompts[@]}" > "$out/nextn.txt" 2> "$out/nextn_err.txt"
echo "nextn rc=$?"; tail -3 "$out/nextn_err.txt"
if cmp -s "$out/plain.txt" "$out/nextn.txt"; then echo "NEXTN greedy output equals plain: yes"; else
  echo "NEXTN greedy output equals plain: NO"; diff "$out/plain.txt" "$out/nextn.txt" | head -8; fi

bash "$here/run_grammar_gpu.sh" "$bin" "$out/grammar" > "$out/grammar.txt" 2>&1
grep -E "parse check|Output token throughput" "$out/grammar.txt" | cut -c1-160

timeout 60 "$bin/moeserve" bench-step --model synthetic:kimi-k2.6 --layers 12 --batch 1,64 --context 1024 \
  > "$out/k26.txt" 2>&1; tail -3 "$out/k26.txt"
timeout 60 "$bin/moeserve" bench-step --model synthetic:deepseek-v3 --layers 10 --batch 1,64 --context 1024 \
  > "$out/dsv3.txt" 2>&1; tail -3 "$out/dsv3.txt"
