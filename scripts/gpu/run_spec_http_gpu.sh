#!/usr/bin/env bash
# One H200: output tok/s through HTTP with and without speculative decoding on the default model
# (issue 21, line 2), NGRAM and NEXTN, each with the adaptive draft budget (the default) and with
# --speculative-fixed-drafts, at concurrency 1, 8 and 64. Prompts: 400-character chunks of
# models/default/heldout.txt as a ShareGPT file, 128 output tokens each (8 prompts at c=1, 4C
# otherwise). Every server gets an unmeasured pass at each concurrency first (its CUDA graphs and
# the budget's measurements warm), then the measured one; ROUNDS rounds alternate the configs.
# Usage: scripts/gpu/run_spec_http_gpu.sh BIN_DIR OUT [ROUNDS]   (BIN_DIR: moeserve)
# CHUNK=characters per prompt (400), OUTPUT_LEN=tokens per request (128): the 400-character
# chunks give 69 prompts, one wave at c=64 (about 130 steps); CHUNK=100 OUTPUT_LEN=256 gives
# 276 prompts and four waves, long enough for the draft budget's choice to settle.
set -uo pipefail
bin=${1:?bin dir}; out=${2:?out dir}; rounds=${3:-2}; chunk=${CHUNK:-400}; output_len=${OUTPUT_LEN:-128}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 - "$out/heldout_sharegpt.json" "$chunk" <<'EOF'
import json, sys
text, n = open("models/default/heldout.txt").read(), int(sys.argv[2])
chunks = [text[i:i + n] for i in range(0, len(text) - n, n)]
json.dump([{"conversations": [{"from": "human", "value": c}, {"from": "gpt", "value": c}]} for c in chunks],
          open(sys.argv[1], "w"))
print(f"{len(chunks)} prompts")
EOF
declare -A configs=(
  [plain]=""
  [ngram_fixed]="--speculative-algorithm NGRAM --speculative-num-draft-tokens 5 --speculative-fixed-drafts"
  [ngram_adaptive]="--speculative-algorithm NGRAM --speculative-num-draft-tokens 5"
  [nextn_fixed]="--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-fixed-drafts"
  [nextn_adaptive]="--speculative-algorithm NEXTN --speculative-num-steps 3"
)
port=30611
for round in $(seq 1 "$rounds"); do
  for name in plain ngram_fixed ngram_adaptive nextn_fixed nextn_adaptive; do
    # shellcheck disable=SC2086
    "$bin/moeserve" serve --model models/default --backend cuda --max-running-requests 64 --port $port \
      ${configs[$name]} --log-level debug > "$out/serve_${name}_$round.txt" 2>&1 &
    server=$!
    for _ in $(seq 1 240); do curl -sf "localhost:$port/health" > /dev/null 2>&1 && break; sleep 0.5; done
    for c in 1 8 64; do
      n=$(( c == 1 ? 8 : 4 * c ))
      args=(bench --base-url "http://localhost:$port" --concurrency $c --num-prompts $n --disable-tqdm
            --dataset "sharegpt:$out/heldout_sharegpt.json" --tokenizer models/default --sharegpt-output-len $output_len)
      "$bin/moeserve" "${args[@]}" > /dev/null 2>&1
      "$bin/moeserve" "${args[@]}" --tag "$name c=$c round=$round" --output-file "$out/bench.jsonl" \
        > "$out/bench_${name}_c${c}_$round.txt" 2>&1 || echo "bench $name c=$c failed"
      budget=$(curl -s "localhost:$port/metrics" | sed -n 's/^moeserve_spec_draft_budget \(.*\)$/\1/p')
      echo "$name c=$c round=$round draft_budget=${budget:-none}" | tee -a "$out/budgets.txt"
    done
    kill -TERM $server; wait $server
  done
done
python3 - "$out/bench.jsonl" <<'EOF'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    name, c, _ = r["tag"].split()
    runs[(name, c)].append((r["output_throughput"], r.get("accept_length")))
names = ["plain", "ngram_fixed", "ngram_adaptive", "nextn_fixed", "nextn_adaptive"]
levels = ["c=1", "c=8", "c=64"]
print("| config | " + " | ".join(levels) + " |")
print("|---|" + "---:|" * len(levels))
for name in names:
    cells = []
    for c in levels:
        tps = [t for t, _ in runs[(name, c)]]
        base = statistics.median(t for t, _ in runs[("plain", c)])
        accept = [a for _, a in runs[(name, c)] if a]
        med = statistics.median(tps)
        cell = f"{med:.0f} ({med / base:.2f}x) [{min(tps):.0f}, {max(tps):.0f}]"
        if accept:
            cell += f" al {statistics.median(accept):.2f}"
        cells.append(cell)
    print(f"| {name} | " + " | ".join(cells) + " |")
EOF
