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
from conftest import generate_with_logits, run_moeserve  # noqa: E402

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


def generate(model, plan, out_dir, reduction_plan="single"):
    logits_path = pathlib.Path(out_dir) / f"logits-{plan}-{reduction_plan}.npy"
    tokens, logits = generate_with_logits(model, PROMPTS, logits_path, "--plan", plan, "--pp-max-micro-batch-size", 1,
                                          "--pp-async-batch-depth", 1, "--reduction-plan", reduction_plan,
                                          new_tokens=GREEDY_TOKENS)
    assert len(tokens) == len(PROMPTS) and all(len(t) == GREEDY_TOKENS for t in tokens)
    return tokens, logits


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


# --reduction-plan R: every plan whose split nests in R's computes R's parts with R's kernel
# calls and adds them in the same tree, so its logits are the single rank's to the bit (no
# tolerance: any difference is a defect), and so are its tokens.
REDUCTION_FAMILIES = [
    ("synthetic:tiny", "tp8", ["tp2", "tp4", "tp8", "pp2", "tp2pp2", "tp4pp2", "tp2pp4"]),
    ("synthetic:tiny", "ep8", ["ep2", "ep4", "ep8", "ep2pp2", "ep4pp2"]),
    ("synthetic:tiny", "ep4tp2", ["ep2", "ep4", "ep4tp2", "ep2pp2"]),
    (CHECKPOINT, "tp4", ["tp2", "tp4", "pp2", "tp2pp2", "tp4pp2"]),
    (CHECKPOINT, "ep4", ["ep2", "ep4", "ep2pp2", "ep4pp2"]),
]


@pytest.mark.parametrize("model,reduction_plan,plans", REDUCTION_FAMILIES,
                         ids=[f"{m}-{r}" for m, r, _ in REDUCTION_FAMILIES])
def test_reduction_plan_gives_identical_logits(model, reduction_plan, plans, checkpoint_dir, tmp_path):
    model = checkpoint_dir if model == CHECKPOINT else model
    ref_tokens, ref_logits = generate(model, "single", tmp_path, reduction_plan)
    for plan in plans:
        tokens, logits = generate(model, plan, tmp_path, reduction_plan)
        assert tokens == ref_tokens, f"{model} {plan} --reduction-plan {reduction_plan}: tokens differ"
        differing = int(np.count_nonzero(logits != ref_logits))
        assert differing == 0, (f"{model} {plan} --reduction-plan {reduction_plan}: {differing} of {logits.size} "
                                f"logits differ from the single rank's (max {np.abs(logits - ref_logits).max():.3g})")


def test_reduction_plan_changes_only_the_order_of_sums(tiny_reference, tmp_path):
    """A reduction plan is the same model: within the plans' fp32 tolerance of the plain run."""
    for reduction_plan in ("tp8", "ep8"):
        tokens, logits = generate("synthetic:tiny", "single", tmp_path, reduction_plan)
        rel = np.abs(logits - tiny_reference[1]).max() / np.abs(tiny_reference[1]).max()
        assert 0 < rel <= REL_TOLERANCE and tokens == tiny_reference[0], reduction_plan


@pytest.mark.parametrize("plan,reduction_plan,fault", [
    ("ep2", "tp2", "do not nest in its 1 x 2"),
    ("tp2", "ep2", "do not nest in its 2 x 1"),
    ("ep2tp2", "ep4tp2", "do not nest in its 4 x 2"),
    ("ep2-dp", "ep2", "attention DP 2"),
    ("tp4", "tp2", "the 4 ranks per stage of plan 'tp4' do not divide its 2"),
    ("single", "tp2pp2", "name a plan of one stage"),
    ("single", "ep2-dp", "name a plan of one stage"),
    ("single", "tp16", "model attention heads = 8 is not divisible by attention TP size = 16"),
    ("single", "tpx", "--reduction-plan tpx:"),
])
def test_reduction_plan_rejects_what_it_cannot_make_exact(plan, reduction_plan, fault):
    out = run_moeserve("generate", "--model", "synthetic:tiny", "--plan", plan, "--reduction-plan", reduction_plan,
                       "--prompt-ids", "1,2", check=False)
    assert out.returncode != 0 and f"--reduction-plan {reduction_plan}" in out.stderr and fault in out.stderr, \
        out.stderr
