"""`--backend cpu-bf16`: the CPU ranks with the CUDA engine's bf16 rounding (the op-level rounding
points are tested bit for bit in tests/backend/cpu_bf16_numerics_test.cc; the GPU against it in
cuda_ops_test.cc and scripts/gpu/parity_vs_transformers.py). Here, through the whole model:
it rounds (its logits are not the fp32 backend's), and a reduction plan keeps its bits under
every plan that nests in it, as on the fp32 backend."""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import generate_with_logits, run_moeserve  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250], [7, 8]]


def logits(tmp_path, name, *flags):
    return generate_with_logits("synthetic:tiny", PROMPTS, tmp_path / f"{name}.npy", *flags, new_tokens=4)[1]


def test_bf16_numerics_round_and_keep_their_bits_under_nested_plans(tmp_path):
    fp32 = logits(tmp_path, "fp32", "--backend", "cpu")
    one = logits(tmp_path, "one", "--backend", "cpu-bf16", "--reduction-plan", "tp2")
    assert fp32.shape == one.shape
    # bf16 rounding of every activation moves the logits by far more than fp32 summation order.
    assert np.abs(one - fp32).max() > 1e-3 * np.abs(fp32).max()
    for plan in ("tp2", "pp2"):
        under = logits(tmp_path, plan, "--backend", "cpu-bf16", "--plan", plan, "--reduction-plan", "tp2")
        assert np.array_equal(under, one), f"{plan} under tp2 differs from one rank under tp2 (cpu-bf16)"


def test_unknown_backend_lists_the_backends():
    proc = run_moeserve("generate", "--model", "synthetic:tiny", "--backend", "gpu", "--prompt-ids", "1", check=False)
    assert proc.returncode != 0
    assert "--backend 'gpu'" in proc.stderr and "cpu-bf16" in proc.stderr
