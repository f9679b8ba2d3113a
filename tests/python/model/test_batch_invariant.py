"""Batch invariance through the whole model: a prompt's logits and greedy tokens are the same
run alone and in a batch with others of other lengths (one prefill of all, then decode steps of
the whole batch). CPU ranks are batch-invariant by construction (every row's sums run in one
order); `--batch-invariant` asks the same of GPU kernels (tested on the GPU machine by
scripts/gpu/batch_invariance_gpu.py) and is accepted, and changes nothing, on CPU ranks."""
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import generate_with_logits  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64], [200, 4], [11, 12, 13, 14, 15]]


def generate(tmp_path, name, prompts, *flags):
    return generate_with_logits("synthetic:tiny", prompts, tmp_path / f"{name}.npy", *flags)


@pytest.mark.parametrize("backend", ["cpu", "cpu-bf16"])
@pytest.mark.parametrize("plan", [["--plan", "single"], ["--plan", "tp2", "--reduction-plan", "tp2"]])
def test_prompts_alone_and_together_give_the_same_bits(tmp_path, backend, plan):
    flags = ["--backend", backend, *plan]
    together, logits = generate(tmp_path, "together", PROMPTS, *flags)
    alone = [generate(tmp_path, f"alone{i}", [p], *flags) for i, p in enumerate(PROMPTS)]
    assert together == [a[0][0] for a in alone]
    assert np.array_equal(logits, np.concatenate([a[1] for a in alone]))
    flagged, flagged_logits = generate(tmp_path, "flagged", PROMPTS, *flags, "--batch-invariant")
    assert flagged == together and np.array_equal(flagged_logits, logits)
