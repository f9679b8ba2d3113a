#!/usr/bin/env bash
# Issue 5 on two H200s: plans equal one GPU (greedy), and bench-step for tp2, ep2, ep2-dp and
# pp2 on a 6-layer K2.6-shaped model with communication time beside NCCL alone. Logs in $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; head -5 "$OUT/topo.txt"
phase=${1:-all}  # all | exact (tests, parity, plans equal, tp2 bench) | plans (plans equal, every bench)
if [[ $phase == all || $phase == exact ]]; then
timeout 120 carry/cuda_backend_tests > "$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?"; tail -3 "$OUT/cuda_tests.txt"
timeout 300 python3 scripts/gpu/parity_vs_transformers.py --moeserve "$BIN" --out "$OUT/gpu_parity.json" 2>&1 \
  | grep -v "Writing model" | tail -12
fi
if [[ $phase == all || $phase == exact || $phase == plans ]]; then
timeout 120 carry/nccl_comm_tests > "$OUT/nccl_tests.txt" 2>&1; echo "nccl tests rc=$?"; tail -1 "$OUT/nccl_tests.txt"
timeout 240 python3 scripts/gpu/plans_equal_single_gpu.py --moeserve "$BIN" --out "$OUT/plans_2gpu.json" 2>&1 | tail -9
fi
plans="tp2 ep2 ep2-dp pp2"
[[ $phase == exact ]] && plans="tp2"
for plan in $plans; do
  timeout 150 "$BIN" bench-step --model synthetic:kimi-k2.6 --layers 6 --plan $plan --batch 1,64 --context 1024 \
    --iterations 10 --json "$OUT/bench2_${plan}.json" > "$OUT/bench2_${plan}.txt" 2>&1
  echo "rc=$? $plan"; cat "$OUT/bench2_${plan}.txt" | cut -c1-160
done
# Kernel timeline of one tp2 step at batch 1 (tools/kernel_trace.cc), when the tracer is carried.
if [[ -f carry/libkernel_trace.so ]]; then
  TIMELINE_ARGS=--sequence timeout 120 bash scripts/gpu/profile_step.sh tp2 1 6 > /dev/null 2>&1
  head -3 "$OUT/timeline_tp2_b1.txt"
fi
