"""Random quantized checkpoints written by the formats' own code (no downloads).

Each config is a checkpoints.py model (fp32, bf16-exact weights) whose linears are quantized:
  int4: compressed-tensors pack-quantized W4A16 (symmetric, group strategy), the tensors written by
        compressed-tensors' own PackedQuantizationCompressor.compress (weight_packed int32 [N, K/8],
        weight_scale bf16 [N, K/group], weight_shape [2]); scales max|w| / 7.5 per group.
  fp8:  DeepSeek-V3's block FP8 (e4m3 weight, fp32 weight_scale_inv [ceil(N/bn), ceil(K/bk)]),
        scales max|w| / 448 per block as DeepSeek's fp8 cast writes them.
The reference is the transformers model loaded (from_pretrained, fp32) with the dequantized
weights: compressed-tensors' own decompress (fp32 scales, so every value is exact) and DeepSeek's
reference weight_dequant (inference/kernel.py: y = x * s[row // bn, col // bk]).
The moeserve directory can take the published Kimi K2.6 layout: nested text_config,
`language_model.` prefix, vision tensors (`vision_tower.*`, `mm_projector.*`) and an index over
several shards.
"""
import json
import math
import pathlib
import re

import torch
from safetensors.torch import load_file, save_file

from checkpoints import make_model_from, write_layout

# The published K2.6 quantization_config (tests/data/configs/kimi-k2.6.config.json): routed experts only.
K26_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]

# name -> (overrides of checkpoints.BASE, layout, quantization)
QUANT_CONFIGS = {
    # Kimi K2.6's layout and scheme: INT4 routed experts, group 32; a q LoRA and grouped routing.
    "int4_g32_kimi_k25": (dict(moe_intermediate_size=128, q_lora_rank=32, n_group=2, topk_group=1),
                          "kimi_k25", dict(method="int4", group=32)),
    # Group 128 over wider experts, two shared experts.
    "int4_g128": (dict(hidden_size=128, moe_intermediate_size=512, n_shared_experts=2, routed_scaling_factor=2.827,
                       norm_topk_prob=False), "kimi_k2", dict(method="int4", group=128)),
    # Every linear but the head in FP8 with 16x16 blocks: every TP split up to 4 falls on blocks.
    "fp8_b16": (dict(qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, intermediate_size=128,
                     moe_intermediate_size=64, q_lora_rank=32), "hf", dict(method="fp8", block=[16, 16])),
    # DeepSeek-V3's 128x128 blocks over smaller tensors (partial blocks in attention): plans that
    # split none. The MLPs' gate and up rows are whole blocks (they are stacked into one matrix).
    "fp8_b128": (dict(intermediate_size=128, moe_intermediate_size=128), "hf", dict(method="fp8", block=[128, 128])),
}
SEED = 7
EXPERT = re.compile(r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
LINEAR = re.compile(r"proj(_with_mqa)?\.weight$")


def quantization_config(q):
    if q["method"] == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": q["block"]}
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": q["group"],
               "dynamic": False, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None}},
            "ignore": K26_IGNORE}


def int4_scheme(group):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=4, type="int", symmetric=True,
                                                                            strategy="group", group_size=group))


def quantize_int4(w, group):
    """compressed-tensors' tensors of w [N, K] and the exact weight they decompress to."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    n, k = w.shape
    scale = (w.reshape(n, k // group, group).abs().amax(-1) / 7.5).clamp(min=1e-8).to(torch.bfloat16)
    packed = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, int4_scheme(group))
    exact = dict(packed, weight_scale=packed["weight_scale"].float())
    dequant = PackedQuantizationCompressor.decompress(exact, int4_scheme(group))["weight"]
    return packed, dequant.float()


def weight_dequant(x, s, block):
    """DeepSeek-V3 inference/kernel.py weight_dequant: y[i, j] = x[i, j] * s[i // bn, j // bk] in fp32."""
    bn, bk = block
    rows = torch.arange(x.shape[0]) // bn
    cols = torch.arange(x.shape[1]) // bk
    return x.float() * s[rows][:, cols]


def quantize_fp8(w, block):
    bn, bk = block
    n, k = w.shape
    s = torch.zeros(math.ceil(n / bn), math.ceil(k / bk))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            s[i, j] = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].abs().max().clamp(min=1e-8) / 448.0
    rows, cols = torch.arange(n) // bn, torch.arange(k) // bk
    q = (w / s[rows][:, cols]).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": s}, weight_dequant(q, s, block)


def quantized(name, q):
    return bool(EXPERT.search(name)) if q["method"] == "int4" else bool(LINEAR.search(name))


def vision_tensors():
    gen = torch.Generator().manual_seed(3)
    return {"vision_tower.patch_embed.proj.weight": torch.randn(32, 3, 4, 4, generator=gen).to(torch.bfloat16),
            "vision_tower.encoder.blocks.0.attn.qkv.weight": torch.randn(96, 32, generator=gen).to(torch.bfloat16),
            "mm_projector.proj.0.weight": torch.randn(64, 128, generator=gen).to(torch.bfloat16)}


def save_shards(tensors, directory, shards):
    """model.safetensors, or `shards` files listed by model.safetensors.index.json."""
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def build_quantized(name, directory, shards=1):
    """Writes config `name` quantized to `directory`; returns the transformers reference (fp32,
    dequantized weights)."""
    overrides, layout, q = QUANT_CONFIGS[name]
    directory = pathlib.Path(directory)
    plain = directory.with_name(directory.name + "-reference")
    make_model_from(overrides, SEED).save_pretrained(plain, safe_serialization=True)
    tensors = load_file(str(plain / "model.safetensors"))
    out, reference = {}, {}
    for tensor_name, w in tensors.items():
        module = tensor_name[:-len(".weight")]
        if not quantized(tensor_name, q):
            out[tensor_name] = reference[tensor_name] = w
            continue
        packed, dequant = quantize_int4(w, q["group"]) if q["method"] == "int4" else quantize_fp8(w, q["block"])
        out.update({f"{module}.{k}": v.contiguous() for k, v in packed.items()})
        reference[tensor_name] = dequant.contiguous()
    save_file(reference, str(plain / "model.safetensors"), metadata={"format": "pt"})
    from transformers import DeepseekV3ForCausalLM
    model = DeepseekV3ForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    model.config._attn_implementation = "eager"

    config = json.loads((plain / "config.json").read_text())
    config["quantization_config"] = quantization_config(q)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_layout(directory, layout, prefix_tensors=False)
    if layout == "kimi_k25":
        config = json.loads((directory / "config.json").read_text())
        config["quantization_config"] = config["text_config"]["quantization_config"]  # both, as published
        (directory / "config.json").write_text(json.dumps(config, indent=2))
        out = {"language_model." + k: v for k, v in out.items()}
        out.update(vision_tensors())
    save_shards(out, directory, shards)
    return model
