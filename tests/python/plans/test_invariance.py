"""Plan invariance (issue 4, acceptance 1): under every preset a model admits at 1-8 ranks,
the prompts' fp32 logits match the single-rank run within 1e-5 relative
(max |diff| / max |logit|) and 32 greedy tokens are identical.

Models: synthetic:tiny (8 layers, 8 heads, 16 experts, vocab 512: every preset up to 8 ranks
divides it) and the parity checkpoint `kimi_k2_shared2` (4 heads, 8 experts, 3 layers, a dense
layer, 2 shared experts, YaRN): tensor parallelism up to 4 ranks, pipelines of 2 stages.
Pipeline plans run with one sequence per micro-batch so that several are in flight.

Tolerance: the plans sum the same fp32 products in a different order (partial sums per rank,
then a rank-ordered all-reduce), which moves each logit by a few ulps per layer; 1e-5 of the
largest logit is ~100 ulps of headroom over that, and any real sharding bug (a wrong slice,
a missing partial) moves logits by O(1e-2) or more.
"""
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from checkpoints import build_checkpoint  # noqa: E402
from conftest import run_moeserve  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91], [200, 4], [11, 12, 13, 14, 15, 16, 17]]
GREEDY_TOKENS = 32
REL_TOLERANCE = 1e-5

# Every preset of `moeserve plan list` (powers of two up to 8 ranks) each model admits;
# test_plan_lists_are_complete checks these lists against the binary.
TINY_PLANS = ["pp2", "pp4", "pp8", "tp2", "tp2pp2", "tp2pp4", "tp4", "tp4pp2", "tp8", "ep2", "ep2-dp", "ep2pp2",
              "ep2pp2-dp", "ep2pp4", "ep2pp4-dp", "ep2tp2", "ep2tp2-dp", "ep2tp2pp2", "ep2tp2pp2-dp", "ep2tp4",
              "ep2tp4-dp", "ep4", "ep4-dp", "ep4pp2", "ep4pp2-dp", "ep4tp2", "ep4tp2-dp", "ep8", "ep8-dp"]
CHECKPOINT = "kimi_k2_shared2"
CHECKPOINT_PLANS = ["pp2", "tp2", "tp2pp2", "tp4", "tp4pp2", "ep2", "ep2-dp", "ep2pp2", "ep2pp2-dp", "ep2tp2",
                    "ep2tp2-dp", "ep2tp2pp2", "ep2tp2pp2-dp", "ep2tp4-dp", "ep4", "ep4-dp", "ep4pp2", "ep4pp2-dp",
                    "ep4tp2-dp", "ep8-dp"]
REQUIRED = {"tp2", "tp4", "tp8", "pp2", "pp4", "pp8", "ep2", "ep4", "ep8", "ep4-dp", "ep8-dp", "ep4tp2", "tp2pp4",
            "ep2pp2"}


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp(CHECKPOINT)
    build_checkpoint(CHECKPOINT, directory)
    return str(directory)


def generate(model, plan, out_dir):
    logits_path = pathlib.Path(out_dir) / f"logits-{plan}.npy"
    args = ["generate", "--model", model, "--plan", plan, "-n", GREEDY_TOKENS, "--ignore-eos",
            "--dump-logits", logits_path, "--pp-max-micro-batch-size", 1, "--pp-async-batch-depth", 1]
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    out = run_moeserve(*args)
    tokens = [list(map(int, line.split(","))) for line in out.stdout.strip().splitlines()]
    assert len(tokens) == len(PROMPTS) and all(len(t) == GREEDY_TOKENS for t in tokens)
    return tokens, np.load(logits_path)


def check_plan(model, plan, reference, out_dir):
    tokens, logits = generate(model, plan, out_dir)
    ref_tokens, ref_logits = reference
    assert logits.shape == ref_logits.shape
    rel = np.abs(logits - ref_logits).max() / np.abs(ref_logits).max()
    assert rel <= REL_TOLERANCE, f"{model} {plan}: max |logit diff| / max |logit| = {rel:.3g}"
    for i, (got, want) in enumerate(zip(tokens, ref_tokens)):
        assert got == want, f"{model} {plan}: greedy tokens of prompt {i} differ\nplan   {got}\nsingle {want}"


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory):
    return generate("synthetic:tiny", "single", tmp_path_factory.mktemp("tiny-single"))


@pytest.fixture(scope="module")
def checkpoint_reference(checkpoint_dir, tmp_path_factory):
    return generate(checkpoint_dir, "single", tmp_path_factory.mktemp("ckpt-single"))


def test_plan_lists_are_complete(checkpoint_dir):
    for model, plans in (("synthetic:tiny", TINY_PLANS), (checkpoint_dir, CHECKPOINT_PLANS)):
        listed = run_moeserve("plan", "list", "--model", model, "--max-world", 8).stdout.split()
        assert listed == ["single"] + plans, model
    assert REQUIRED <= set(TINY_PLANS)


@pytest.mark.parametrize("plan", TINY_PLANS)
def test_synthetic_tiny(plan, tiny_reference, tmp_path):
    check_plan("synthetic:tiny", plan, tiny_reference, tmp_path)


@pytest.mark.parametrize("plan", CHECKPOINT_PLANS)
def test_parity_checkpoint(plan, checkpoint_dir, checkpoint_reference, tmp_path):
    check_plan(checkpoint_dir, plan, checkpoint_reference, tmp_path)
