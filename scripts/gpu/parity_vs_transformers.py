#!/usr/bin/env python3
"""GPU exactness check, run on the GPU machine (issue 5, acceptance 1 and 2).

For every parity checkpoint (tests/python/checkpoints.py, bf16-conditioned: see its docstring):
  * transformers fp32 on the GPU is the ground truth, transformers bf16 on the GPU the
    reference bf16 implementation;
  * acceptance 2: moeserve's CUDA backend (bf16) agrees with transformers bf16's argmax at >= 99%
    of the prompt positions of all checkpoints together (per checkpoint in the report), and its
    normalised logit error against the fp32 truth (max |diff| / max |logit|) is reported beside
    transformers' own bf16 error (max, p50, p90 over positions);
  * acceptance 1: moeserve CUDA picks the same greedy tokens for 32 steps as the CPU backend with
    the same bf16 numerics (`--backend cpu-bf16`: fp32 arithmetic rounded where the kernels store
    bf16), and its prompt logits are within the kernels' bf16 bound (1e-2, normalised by the largest
    logit) of that CPU run's at 90% of positions (the maximum is reported: a rounding that the fp32
    summation order flips early in a prompt moves its later positions more). Against the fp32
    CPU (`--backend cpu`) the same is reported: there the two differ by all of bf16's rounding, and
    a near-tie decision may go either way (docs/benchmarks.md).
Writes a JSON report and exits non-zero when acceptance 1 or the argmax share fails.
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
from checkpoints import CONFIGS, build_checkpoint  # noqa: E402
from moeserve_cli import generate_tokens  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91, 8, 19, 77, 140, 201, 66, 9, 12, 180, 45, 3],
           [200, 4], [11, 12, 13, 14, 15, 16, 17]]
GREEDY = 32


def moeserve(binary, directory, backend, logits_path):
    tokens, err = generate_tokens(binary, directory, PROMPTS, ["--backend", backend, "--dump-logits", logits_path],
                                  GREEDY)
    if tokens is None:
        raise RuntimeError(f"moeserve generate --backend {backend} failed: {err}")
    return np.load(logits_path), tokens


def normalised_error(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def position_errors(a, b):
    """Per prompt position: max |a - b| over the vocabulary / max |b| over everything."""
    return np.abs(a - b).max(-1) / np.abs(b).max()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--moeserve", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report, line1_ok, agree, positions = {}, True, 0, 0
    for name in sorted(CONFIGS):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            model = build_checkpoint(name, tmp / "ckpt")
            truth, hf_bf16 = [], []
            gpu32 = model.to("cuda").float()
            with torch.no_grad():
                for p in PROMPTS:
                    truth.append(gpu32(torch.tensor([p], device="cuda")).logits[0].float().cpu().numpy())
                gpu16 = gpu32.to(torch.bfloat16)
                for p in PROMPTS:
                    hf_bf16.append(gpu16(torch.tensor([p], device="cuda")).logits[0].float().cpu().numpy())
            truth, hf_bf16 = np.concatenate(truth), np.concatenate(hf_bf16)
            ours, ours_tokens = moeserve(args.moeserve, tmp / "ckpt", "cuda", tmp / "cuda.npy")
            cpu, cpu_tokens = moeserve(args.moeserve, tmp / "ckpt", "cpu", tmp / "cpu.npy")
            emu, emu_tokens = moeserve(args.moeserve, tmp / "ckpt", "cpu-bf16", tmp / "cpu_bf16.npy")
            entry = {
                "hf_bf16_error": normalised_error(hf_bf16, truth),
                "moeserve_bf16_error": normalised_error(ours, truth),
                "moeserve_vs_hf_bf16_error": normalised_error(ours, hf_bf16),
                "argmax_agreement_with_hf_bf16": float((ours.argmax(-1) == hf_bf16.argmax(-1)).mean()),
                "moeserve_argmax_agreement_with_fp32": float((ours.argmax(-1) == truth.argmax(-1)).mean()),
                "hf_bf16_argmax_agreement_with_fp32": float((hf_bf16.argmax(-1) == truth.argmax(-1)).mean()),
                "greedy_cuda_equals_cpu": ours_tokens == cpu_tokens,
                "greedy_steps_equal": [sum(1 for a, b in zip(x, y) if a == b) for x, y in zip(ours_tokens, cpu_tokens)],
                "error_vs_cpu": normalised_error(ours, cpu),
                "greedy_cuda_equals_cpu_bf16": ours_tokens == emu_tokens,
                "greedy_steps_equal_cpu_bf16": [sum(1 for a, b in zip(x, y) if a == b)
                                                for x, y in zip(ours_tokens, emu_tokens)],
                "error_vs_cpu_bf16": normalised_error(ours, emu),
                "cpu_bf16_error_vs_fp32": normalised_error(emu, truth),
                "cpu_bf16_argmax_agreement_with_hf_bf16": float((emu.argmax(-1) == hf_bf16.argmax(-1)).mean()),
            }
            ours_pos, hf_pos = position_errors(ours, truth), position_errors(hf_bf16, truth)
            for q in (50, 90):
                entry[f"moeserve_bf16_error_p{q}"] = float(np.percentile(ours_pos, q))
                entry[f"hf_bf16_error_p{q}"] = float(np.percentile(hf_pos, q))
            # Positions where moeserve's error exceeds transformers' own largest bf16 error.
            entry["positions_over_hf_max"] = [int(i) for i in np.nonzero(ours_pos > hf_pos.max())[0]]
            emu_pos = position_errors(ours, emu)
            entry["error_vs_cpu_bf16_p50"] = float(np.percentile(emu_pos, 50))
            entry["error_vs_cpu_bf16_p90"] = float(np.percentile(emu_pos, 90))
            entry["error_vs_cpu_bf16_positions"] = [float(e) for e in emu_pos]
            entry["acceptance_1"] = entry["greedy_cuda_equals_cpu_bf16"] and entry["error_vs_cpu_bf16_p90"] <= 1e-2
            line1_ok &= entry["acceptance_1"]
            agree += int((ours.argmax(-1) == hf_bf16.argmax(-1)).sum())
            positions += ours.shape[0]
            report[name] = entry
            print(name, json.dumps({k: v for k, v in entry.items() if not k.endswith("_positions")}), flush=True)
    share = agree / positions
    report["argmax_agreement_with_hf_bf16_all"] = share
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"acceptance 1 (CUDA = cpu-bf16: 32 greedy steps, logits within 1e-2 at p90): {'PASS' if line1_ok else 'FAIL'}")
    print(f"acceptance 2 (argmax = transformers bf16): {agree} of {positions} positions = {100 * share:.1f}%: "
          f"{'PASS' if share >= 0.99 else 'FAIL'}")
    print("gpu parity:", "PASS" if line1_ok and share >= 0.99 else "FAIL")
    sys.exit(0 if line1_ok and share >= 0.99 else 1)


if __name__ == "__main__":
    main()
