#!/usr/bin/env python3
"""Held-out perplexity of the default model (models/default) with quantized weights, as
docs/benchmarks.md records it beside bf16:

  int4: the routed experts (main layers and the MTP layer) in compressed-tensors pack-quantized
        W4A16, symmetric, group 32, round to nearest (scale max|w| / 7.5 per group), written by
        compressed-tensors' own compressor (tests/python/quant_checkpoints.py), the Kimi K2.6
        scheme: every other linear stays bf16;
  fp8:  DeepSeek-V3's block FP8 (e4m3, fp32 weight_scale_inv per 128 x 128 block) of the
        projections whose stacked gate/up rows are whole blocks: attention, the dense MLP and the
        MTP layer's eh_proj; the experts (64 rows, half a block) and the head stay bf16.

For each: the checkpoint directory, `moeserve eval-ppl` over heldout.txt (fp32 CPU, context 512,
stride 256), and the same windows in transformers on the dequantized weights (the exact values
moeserve computes with), printed as one JSON line per format.
"""
import argparse
import json
import math
import pathlib
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "python" / "model"))
from ppl_oracle import hf_sliding_window_ppl  # noqa: E402
from quant_checkpoints import K26_IGNORE, LINEAR, quantization_config, quantize_fp8, quantize_int4  # noqa: E402

FP8_KEEP = ["re:.*mlp\\.experts\\..*", "re:.*shared_experts.*"]
FORMATS = {
    "int4": dict(method="int4", group=32),
    "fp8": dict(method="fp8", block=[128, 128]),
}


def quantized_here(name, q):
    """Whether tensor `name` is quantized in format q (see the module docstring)."""
    if not LINEAR.search(name):
        return False
    if q["method"] == "int4":
        return ".mlp.experts." in name
    return ".mlp.experts." not in name and ".shared_experts." not in name


def write_checkpoint(model, out, fmt):
    """Writes `out` (the quantized checkpoint) and out-reference (fp32, dequantized values)."""
    q = FORMATS[fmt]
    tensors = load_file(str(model / "model.safetensors"))
    packed, reference = {}, {}
    for name, w in tensors.items():
        if not quantized_here(name, q):
            packed[name], reference[name] = w, w.float()
            continue
        parts, dequant = quantize_int4(w.float(), q["group"]) if fmt == "int4" else quantize_fp8(w.float(), q["block"])
        module = name[:-len(".weight")]
        packed.update({f"{module}.{k}": v.contiguous() for k, v in parts.items()})
        reference[name] = dequant.contiguous()
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = quantization_config(q)
    if fmt == "int4":
        config["quantization_config"]["ignore"] = K26_IGNORE
    else:
        config["quantization_config"]["modules_to_not_convert"] = FP8_KEEP
    ref_dir = out.with_name(out.name + "-reference")
    for directory, weights, cfg in ((out, packed, config), (ref_dir, reference, json.loads((model / "config.json").read_text()))):
        directory.mkdir(parents=True, exist_ok=True)
        for extra in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(model / extra, directory / extra)
        (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return ref_dir


def transformers_ppl(directory, text, context, stride):
    from tokenizers import Tokenizer
    from transformers import DeepseekV3ForCausalLM
    model = DeepseekV3ForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor(Tokenizer.from_file(str(directory / "tokenizer.json")).encode(
        text.read_text(encoding="utf-8"), add_special_tokens=False).ids)
    return hf_sliding_window_ppl(model, ids, context, stride)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "models" / "default"))
    parser.add_argument("--out", default=str(ROOT / "build" / "default_model_quantized"))
    parser.add_argument("--moeserve", default=str(ROOT / "build" / "bin" / "moeserve"))
    parser.add_argument("--formats", default="int4,fp8")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--stride", type=int, default=256)
    args = parser.parse_args()
    model, out = pathlib.Path(args.model), pathlib.Path(args.out)
    text = model / "heldout.txt"
    for fmt in args.formats.split(","):
        directory = out / fmt
        ref_dir = write_checkpoint(model, directory, fmt)
        run = subprocess.run([args.moeserve, "eval-ppl", "--model", str(directory), "--text", str(text), "--context",
                              str(args.context), "--stride", str(args.stride)], capture_output=True, text=True, check=True)
        ours = json.loads(run.stdout)
        ref, scored = transformers_ppl(ref_dir, text, args.context, args.stride)
        size = (directory / "model.safetensors").stat().st_size
        print(json.dumps({"format": fmt, "moeserve_ppl": round(ours["perplexity"], 4), "transformers_dequantized_ppl":
                          round(ref, 4), "relative_difference": abs(ours["perplexity"] - ref) / ref,
                          "scored_tokens": ours["scored_tokens"], "transformers_scored_tokens": scored,
                          "safetensors_bytes": size, "checkpoint": str(directory)}), flush=True)
        assert math.isfinite(ours["perplexity"])


if __name__ == "__main__":
    main()
