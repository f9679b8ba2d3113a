#!/usr/bin/env bash
# Trains the default model twice at once on one GPU (runs A and B: same seed, same data order,
# same step count, deterministic kernels) and checks that B reproduces A: the same weights
# (SHA-256) and the same held-out perplexity. A is what models/default ships.
#
# The step count is chosen so that the whole command fits TOTAL_SECONDS: both runs first train
# MEASURE_STEPS steps side by side (--measure-only), which gives the speed of one run while the
# other shares the GPU; the count is what the remaining time allows at that speed (rounded down
# to hundreds, at most MAX_STEPS), the same for both runs. Each run also stops by time (then
# the log says so), so the command ends in time even if the speed estimate was wrong.
# If a kernel without a deterministic implementation stops the strict probe, the runs use
# --deterministic warn (the logs name the op) and the summary says so.
#
# Environment: OUT (output folder, default ./train_twice_out), DATA (prepare_data.py's output,
# default build/default_model_data), TEMPLATE (the DeepSeek-V3 chat template), SCRIPTS (the
# folder of train_default_model.py, default this script's parent folder), TOTAL_SECONDS (540),
# EXTRA_ARGS (more arguments of both runs, e.g. "--tiny --device cpu" for a smoke test).
set -u
here=$(cd "$(dirname "$0")" && pwd)
scripts=${SCRIPTS:-$(dirname "$here")}
out=${OUT:-train_twice_out}
data=${DATA:-build/default_model_data}
template=${TEMPLATE:-tokenizer/chat_templates/deepseek-v3.jinja}
total=${TOTAL_SECONDS:-540}
max_steps=${MAX_STEPS:-6000}
measure_steps=${MEASURE_STEPS:-110}
export CUBLAS_WORKSPACE_CONFIG=:4096:8 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
start=$(date +%s)
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

trainer() { # run-name extra-args...: one training process, its output in $out/run-name
  local name=$1
  shift
  python3 "$scripts/train_default_model.py" --data "$data" --chat-template "$template" \
    --out "$out/$name" --seed 20 ${EXTRA_ARGS:-} "$@" >"$out/$name.stdout" 2>&1
}

probe() { # mode: both probes side by side; prints the slower one's seconds per step
  trainer probe_a --measure-only --measure-steps "$measure_steps" --deterministic "$1" &
  local a=$!
  trainer probe_b --measure-only --measure-steps "$measure_steps" --deterministic "$1" &
  local b=$!
  wait $a
  local rc_a=$?
  wait $b
  [ $rc_a -eq 0 ] && [ $? -eq 0 ] || return 1
  python3 -c 'import json, sys; print(max(json.load(open(f))["seconds_per_step"] for f in sys.argv[1:]))' \
    "$out/probe_a/measure.json" "$out/probe_b/measure.json"
}

mode=strict
if ! per_step=$(probe strict); then
  say "the strict probe failed (see $out/probe_a.stdout); running with --deterministic warn"
  mode=warn
  per_step=$(probe warn) || { say "the probe failed again"; exit 1; }
fi
startup=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["startup_seconds"])' \
  "$out/probe_a/measure.json")
# Time left for training: the total less what has passed, each run's start-up (as in the
# probe), ~40 s of validation, saving and CPU evaluation, and 25 s of margin.
left=$(python3 -c "import time; print($total - (time.time() - $start) - $startup - 65)")
steps=$(python3 -c "print(max(100, min($max_steps, int($left / ($per_step * 1.10)) // 100 * 100)))")
say "probe ($mode): $per_step s/step with two runs on the GPU; $left s left for training: --steps $steps"

trainer a --steps "$steps" --deterministic "$mode" --budget "$left" --grace 0 &
pid_a=$!
trainer b --steps "$steps" --deterministic "$mode" --budget "$left" --grace 0 &
pid_b=$!
wait $pid_a
rc_a=$?
wait $pid_b
rc_b=$?
say "run A exit $rc_a, run B exit $rc_b, $(($(date +%s) - start)) s in all"
for run in a b; do
  grep -h -E "trained|stopped by time|held-out perplexity|sha256" "$out/$run/train_log.txt" |
    sed "s/^/run $run: /" | tee -a "$summary"
done
sha() { sha256sum "$out/$1/model.safetensors" 2>/dev/null | cut -d' ' -f1; }
if [ -n "$(sha a)" ] && [ "$(sha a)" = "$(sha b)" ]; then
  say "REPRODUCED: runs A and B wrote bit-identical weights ($(sha a))"
else
  say "NOT REPRODUCED: the weights differ (A $(sha a), B $(sha b))"
fi
# What comes back (at most 8 files, 16 MiB each): run A's model directory without the
# tokenizer files (prepare_data.py's, unchanged) as one tar, run B's log and router stats.
tar -C "$out" -cf "$out/run_a_model.tar" --exclude 'tokenizer*' a
cp "$out/b/train_log.txt" "$out/run_b_train_log.txt"
cp "$out/b/router_stats.json" "$out/run_b_router_stats.json"
rm -rf "$out/a" "$out/b" "$out/probe_a" "$out/probe_b" "$out/probe_b.stdout"
