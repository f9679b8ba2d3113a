#!/usr/bin/env python3
"""Which feature of a parity checkpoint makes moeserve's bf16 error larger than transformers'?

Takes one checkpoint of tests/python/checkpoints.py and variants of it, each with one feature
changed, over a few seeds (random draws: no bf16 conditioning is needed for a typical-error
statistic), and prints per variant the ratio of moeserve CUDA's per-position logit error to
transformers bf16's on the same GPU (p50 and p90 over the prompt positions; the median over
seeds, since one early routing flip moves a seed's ratio a lot).
A variant whose ratio falls to ~1 names the feature moeserve handles less exactly.

    python3 scripts/gpu/parity_ablation.py --moeserve carry/moeserve [--config q_lora_grouped_dense0]
"""
import argparse
import json
import pathlib
import sys
import tempfile

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "scripts" / "gpu"))
import checkpoints  # noqa: E402
from parity_vs_transformers import PROMPTS, position_errors  # noqa: E402
from moeserve_cli import generate_tokens  # noqa: E402

VARIANTS = {
    "as is": {},
    "no group limit": dict(n_group=1, topk_group=1),
    "q_lora_rank 32": dict(q_lora_rank=32),
    "no q LoRA": dict(q_lora_rank=None),
    "first layer dense": dict(first_k_dense_replace=1),
    "8 experts, top-2": dict(n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1),
}


def ratio(binary, name, seed, device="cuda"):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        model = checkpoints.build_checkpoint(name, tmp / "ckpt", seed=seed)
        gpu32 = model.to(device).float()
        with torch.no_grad():
            truth = np.concatenate([gpu32(torch.tensor([p], device=device)).logits[0].float().cpu().numpy()
                                    for p in PROMPTS])
            gpu16 = gpu32.to(torch.bfloat16)
            hf = np.concatenate([gpu16(torch.tensor([p], device=device)).logits[0].float().cpu().numpy()
                                 for p in PROMPTS])
        tokens, err = generate_tokens(binary, tmp / "ckpt", PROMPTS,
                                      ["--backend", "cuda" if device == "cuda" else "cpu", "--dump-logits", tmp / "cuda.npy"], 1)
        if tokens is None:
            raise RuntimeError(err)
        ours = np.load(tmp / "cuda.npy")
        o, h = position_errors(ours, truth), position_errors(hf, truth)
        return [float(np.percentile(o, q) / np.percentile(h, q)) for q in (50, 90)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--moeserve", required=True)
    parser.add_argument("--config", default="q_lora_grouped_dense0")
    parser.add_argument("--seeds", default="1272,311,5")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of VARIANTS")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (moeserve's fp32 CPU backend)")
    args = parser.parse_args()
    base, layout = checkpoints.CONFIGS[args.config]
    for label in args.variants.split(","):
        change = VARIANTS[label]
        name = f"ablation {label}"
        checkpoints.CONFIGS[name] = (dict(base, **change), layout)
        ratios = [ratio(args.moeserve, name, int(s), args.device) for s in args.seeds.split(",")]
        median = np.median(ratios, axis=0)  # one early flip can move a seed's ratio a lot: the median
        print(json.dumps({"config": args.config, "variant": label, "seeds": len(ratios),
                          "p50_ratio_median": round(float(median[0]), 2), "p90_ratio_median": round(float(median[1]), 2),
                          "per_seed": [[round(x, 2) for x in r] for r in ratios]}), flush=True)


if __name__ == "__main__":
    main()
