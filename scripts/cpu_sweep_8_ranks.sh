#!/usr/bin/env bash
# Issue 8's campaign on 8 CPU ranks (what runs without the 8-GPU machine): the sweep of the
# six 8-way plans on synthetic:small, then one live re-plan from the slowest plan to the
# fastest (at the largest concurrency) while `moeserve bench` keeps 64 requests in flight.
# Usage: scripts/cpu_sweep_8_ranks.sh OUT_DIR   (binary: $MOESERVE_BIN or build/bin/moeserve)
set -eu
BIN=${MOESERVE_BIN:-build/bin/moeserve}
OUT=${1:?usage: $0 OUT_DIR}
mkdir -p "$OUT"
MODEL=synthetic:small
"$BIN" sweep --model $MODEL --plans tp8,pp8,ep8,ep8-dp,ep4tp2,tp2pp4 --concurrency 1,8,32,64 \
  --random-input-len 64 --random-output-len 32 --vocab-size 4096 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
read -r slowest fastest < <(python3 - "$OUT/sweep/sweep.json" <<'PY'
import json, sys
points = json.load(open(sys.argv[1]))["points"]
top = max(p["max_concurrency"] for p in points)
at_top = sorted((p["output_throughput"], p["plan"]) for p in points if p["max_concurrency"] == top)
print(at_top[0][1], at_top[-1][1])
PY
)
echo "slowest at the top concurrency: $slowest; fastest: $fastest"
port=30777
"$BIN" serve --model $MODEL --plan "$slowest" --port $port --max-running-requests 64 > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do curl -sf localhost:$port/health > /dev/null && break; sleep 0.5; done
"$BIN" bench --base-url http://127.0.0.1:$port --concurrency 64 --num-prompts 640 --dataset random-ids \
  --random-input-len 64 --random-output-len 32 --vocab-size 4096 --random-range-ratio 1 --disable-tqdm \
  --output-file "$OUT/replan_bench.jsonl" > "$OUT/replan_bench.log" 2>&1 &
bench=$!
sleep 3
"$BIN" restart --plan "$fastest" --url http://127.0.0.1:$port | tee "$OUT/replan.txt"
wait $bench && echo "bench under re-plan: ok" || echo "bench under re-plan: FAILED (see $OUT/replan_bench.log)"
python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readlines()[-1]); print('completed', r['completed'], 'failed', r['failed'], 'output tok/s', round(r['output_throughput'],1))" "$OUT/replan_bench.jsonl"
grep -E "cold|ready|Switch" "$OUT/sweep/sweep.md" | head -12
