#!/usr/bin/env bash
# Batch-invariant mode on two H200s (binaries in carry/): kernel tests (each op's rows alone =
# in a batch, to the bit), whole-model prompts alone = together (scripts/gpu/batch_invariance_gpu.py),
# its cost in the decode step (bench-step K2.6 x3, one GPU, with and without the flag), and a
# sweep of one GPU, tp2 and pp2 under --reduction-plan tp2 --batch-invariant whose outputs must
# equal one GPU's at every concurrency. Logs under $OUT.
set -u
export NCCL_NVLS_ENABLE=0
BIN=${MOESERVE_BIN:-carry/moeserve}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
t0=$(date +%s)
timeout 120 carry/cuda_backend_tests > "$OUT/cuda_tests.txt" 2>&1
echo "cuda tests rc=$?"; grep -E "Failure|FAILED|PASSED" -A2 "$OUT/cuda_tests.txt" | head -30
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scripts/gpu/batch_invariance_gpu.py --moeserve "$BIN" \
  --out "$OUT/batch_invariance.json" 2>&1 | grep -v "Writing model" | cut -c1-400
echo "== generate done at $(( $(date +%s) - t0 )) s"
for flag in "" "--batch-invariant"; do
  CUDA_VISIBLE_DEVICES=0 timeout 200 "$BIN" bench-step --model synthetic:kimi-k2.6 --layers 3 --batch 1,8,32,64,128 \
    --context 1024 --iterations 10 $flag > "$OUT/bench_k26_l3${flag/--/_}.txt" 2>&1
  echo "bench-step $flag rc=$?"; grep -E "^ +[0-9]+ " "$OUT/bench_k26_l3${flag/--/_}.txt" | cut -c1-120
done
echo "== bench done at $(( $(date +%s) - t0 )) s"
PLAIN=0 REDUCTION=0 INVARIANT=1 bash scripts/gpu/run_sweep_two_gpus.sh 2>&1 | cut -c1-300
echo "== sweep done at $(( $(date +%s) - t0 )) s"
