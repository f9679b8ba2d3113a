#!/usr/bin/env python3
"""Batch-invariant mode on the GPU (`--batch-invariant`): a prompt's logits and greedy tokens do
not depend on the batch it runs in. For each model, `moeserve generate --backend cuda` runs
prompts of different lengths together (one prefill of all of them, then decode steps of the
whole batch) and each prompt alone, with and without --batch-invariant, and compares every
prompt-position logit (to the bit) and the 32 greedy tokens. Models: the parity checkpoints of
tests/python/checkpoints.py and random synthetic ones (near-ties at almost every step, so any
difference in arithmetic shows). On two GPUs (PLANS=tp2 or pp2, REDUCTION=tp2) the same
comparison runs under that plan and reduction plan. Writes a JSON report; exits non-zero when
batch-invariant mode gives any prompt other bits together than alone."""
import argparse
import json
import os
import pathlib
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
from checkpoints import CONFIGS, build_checkpoint  # noqa: E402
from moeserve_cli import generate_tokens  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91, 8, 19, 77, 140], [200, 4], [11, 12, 13, 14, 15, 16, 17],
           [9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
GREEDY = 32


def generate(binary, model, prompts, flags, logits_path):
    tokens, err = generate_tokens(binary, model, prompts,
                                  ["--backend", "cuda", "--dump-logits", logits_path, *flags], GREEDY)
    if tokens is None:
        raise RuntimeError(f"moeserve generate {' '.join(map(str, flags))} on {model}: {err}")
    return tokens, np.load(logits_path)


def compare(binary, model, flags, tmp):
    together, logits = generate(binary, model, PROMPTS, flags, tmp / "together.npy")
    alone_tokens, alone_logits = [], []
    for i, p in enumerate(PROMPTS):
        tokens, own = generate(binary, model, [p], flags, tmp / f"alone{i}.npy")
        alone_tokens += tokens
        alone_logits.append(own)
    alone_logits = np.concatenate(alone_logits)
    assert logits.shape == alone_logits.shape, (logits.shape, alone_logits.shape)
    return {"tokens_equal": together == alone_tokens,
            "tokens_agreeing": sum(a == b for x, y in zip(together, alone_tokens) for a, b in zip(x, y)),
            "tokens": GREEDY * len(PROMPTS),
            "logits_differing": int((logits != alone_logits).sum()), "logits": int(logits.size)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--moeserve", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    plan = ["--plan", os.environ.get("PLAN", "single"), "--reduction-plan", os.environ.get("REDUCTION", "single")]
    report, ok = {}, True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        models = {}
        for name in sorted(CONFIGS):
            build_checkpoint(name, tmp / name)
            models[name] = tmp / name
        models["synthetic:small"] = "synthetic:small"
        for name, model in models.items():
            entry = {"default": compare(args.moeserve, model, plan, tmp),
                     "batch_invariant": compare(args.moeserve, model, plan + ["--batch-invariant"], tmp)}
            inv = entry["batch_invariant"]
            entry["pass"] = inv["tokens_equal"] and inv["logits_differing"] == 0
            ok &= entry["pass"]
            report[name] = entry
            print(name, json.dumps(entry), flush=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"batch invariance ({' '.join(plan)}):", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
