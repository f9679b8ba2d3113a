#!/usr/bin/env python3
"""--reduction-plan on GPUs (run on two): under reduction plan tp2, one GPU, tp2 and pp2, and
under ep2, one GPU and ep2, must give the same prompt logits to the bit and the same 32
greedy tokens, on every parity checkpoint (tests/python/checkpoints.py), on synthetic:small
and on a 3-layer K2.6-shaped model (64 heads, 384 experts: the tensor-core attention and the
real expert kernels). For contrast it also records how far the plain tp2 and ep2 are from one
GPU. Writes a JSON report; exits non-zero when a plan differs from one GPU in any bit under
its reduction plan."""
import argparse
import json
import pathlib
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
from checkpoints import CONFIGS, build_checkpoint  # noqa: E402
from moeserve_cli import generate_tokens  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91], [200, 4], [11, 12, 13, 14, 15, 16, 17], [9, 9, 9]]
# (plan, reduction plan): the runs; then (plan, reduction plan) compared with one GPU under it.
RUNS = [("single", "tp2"), ("tp2", "tp2"), ("pp2", "tp2"), ("single", "ep2"), ("ep2", "ep2"), ("single", "single"),
        ("tp2", "single"), ("ep2", "single")]
EXACT = [("tp2", "tp2"), ("pp2", "tp2"), ("ep2", "ep2")]
PLAIN = [("tp2", "single"), ("ep2", "single")]


def generate(binary, model, plan, reduction_plan, logits_path):
    tokens, err = generate_tokens(binary, model, PROMPTS, ["--backend", "cuda", "--plan", plan, "--reduction-plan",
                                                           reduction_plan, "--dump-logits", logits_path])
    if tokens is None:
        return None, None, err[-400:]
    return tokens, np.load(logits_path), ""


def compare(single, other):
    (tokens_a, logits_a), (tokens_b, logits_b) = single, other
    agree = sum(a == b for x, y in zip(tokens_a, tokens_b) for a, b in zip(x, y))
    differing = int(np.count_nonzero(logits_a != logits_b))
    scale = float(np.abs(logits_a).max())
    return {"tokens_equal": tokens_a == tokens_b, "tokens_agreeing": agree, "tokens": 32 * len(PROMPTS),
            "logits_differing": differing, "logits": int(logits_a.size),
            "max_rel_diff": float(np.abs(logits_a - logits_b).max()) / scale}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--moeserve", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report, ok = {}, True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        models = {}
        for name in sorted(CONFIGS):
            build_checkpoint(name, tmp / name)
            models[name] = tmp / name
        models["synthetic:small"] = "synthetic:small"
        models["synthetic:kimi-k2.6 x3"] = "synthetic:kimi-k2.6:layers=3"
        for name, model in models.items():
            runs, entry = {}, {}
            for plan, reduction in RUNS:
                tokens, logits, err = generate(args.moeserve, model, plan, reduction, tmp / "logits.npy")
                if tokens is None:
                    entry[f"{plan} under {reduction}"] = {"error": err}
                else:
                    runs[(plan, reduction)] = (tokens, logits)
            for plan, reduction in EXACT + PLAIN:
                key = f"{plan} vs single, both under {reduction}"
                if (plan, reduction) in runs and ("single", reduction) in runs:
                    entry[key] = compare(runs[("single", reduction)], runs[(plan, reduction)])
                    if (plan, reduction) in EXACT:
                        ok &= entry[key]["tokens_equal"] and entry[key]["logits_differing"] == 0
                elif (plan, reduction) in EXACT:
                    ok = False
            report[name] = entry
            print(name, json.dumps(entry), flush=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2))
    print("under their reduction plans, tp2, pp2 and ep2 on two GPUs = one GPU to the bit:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
