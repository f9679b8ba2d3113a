#!/usr/bin/env bash
# Every GPU measurement of docs/benchmarks.md in one call on a two-H200 machine (binaries in
# carry/): one GPU (kernel tests, parity with transformers, bench-step with and without
# graphs, transformers' step), two GPUs (plans equal one GPU, bench-step per plan with
# communication), serving (greedy and sampled; MOESERVE_BASE_BIN adds the previous build), and
# serving pp2 with and without its groups in flight beside tp2 (~7 minutes in all).
# Logs under $OUT/{single,two,serve,serve_pp}, then one archive $OUT/all.tgz.
set -u
OUT=${OUT:-/tmp/out}
for part in single two serve serve_pp; do mkdir -p "$OUT/$part"; done
t0=$(date +%s)
OUT=$OUT/single bash scripts/gpu/run_single_gpu.sh all 2>&1 | tee "$OUT/single/log.txt" | cut -c1-200
echo "== one GPU done at $(( $(date +%s) - t0 )) s"
OUT=$OUT/two bash scripts/gpu/run_two_gpus.sh plans 2>&1 | tee "$OUT/two/log.txt" | cut -c1-200
echo "== two GPUs done at $(( $(date +%s) - t0 )) s"
OUT=$OUT/serve CUDA_VISIBLE_DEVICES=0 bash scripts/gpu/run_serve_gpu.sh 2>&1 | tee "$OUT/serve/log.txt" | cut -c1-400
echo "== serving done at $(( $(date +%s) - t0 )) s"
OUT=$OUT/serve_pp bash scripts/gpu/run_serve_pp_gpu.sh 2>&1 | tee "$OUT/serve_pp/log.txt" | cut -c1-300
echo "== pipeline-plan serving done at $(( $(date +%s) - t0 )) s"
tar czf "$OUT/all.tgz" -C "$OUT" single two serve serve_pp
