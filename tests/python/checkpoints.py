"""Random DeepSeek-V3-family checkpoints built with transformers (no downloads).

Each named config exercises one feature of the architecture. `build_checkpoint` saves a
model with well-scaled random weights (std 1/sqrt(fan_in), non-zero router bias) so that
logits are O(1) and greedy decoding is not dominated by ties, then rewrites the saved
directory into the published layouts where needed (kimi_k2 model_type, K2.5-style nested
config with `language_model.` tensor prefix, published-style `rope_scaling`).
"""
import json
import math
import pathlib

import torch

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=24,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
            n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=32,
            q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
            first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256,
        "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}

# name -> (overrides, layout); layout in {"hf", "kimi_k2", "kimi_k25", "published_rope"}
CONFIGS = {
    "no_q_lora_dense1": (dict(), "hf"),
    "q_lora_grouped_dense0": (dict(q_lora_rank=48, n_group=4, topk_group=2, first_k_dense_replace=0,
                                   n_routed_experts=16, num_experts_per_tok=4), "hf"),
    "dense3_yarn": (dict(num_hidden_layers=4, first_k_dense_replace=3, rope_parameters=YARN), "published_rope"),
    "kimi_k2_shared2": (dict(q_lora_rank=32, n_shared_experts=2, rope_parameters=YARN, norm_topk_prob=False,
                             routed_scaling_factor=2.827), "kimi_k2"),
    "kimi_k25_nested": (dict(q_lora_rank=32, n_group=2, topk_group=1), "kimi_k25"),
    "yarn_mscale_no_interleave": (dict(rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8),
                                       rope_interleave=False, n_shared_experts=3), "hf"),
}


def _reinit(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))


def make_model(name, seed=0):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    overrides, _ = CONFIGS[name]
    kwargs = dict(BASE)
    kwargs.update(overrides)
    config = DeepseekV3Config(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).float().eval()
    _reinit(model, seed)
    return model


def build_checkpoint(name, directory, seed=0):
    """Saves checkpoint `name` to `directory`; returns the transformers model."""
    directory = pathlib.Path(directory)
    model = make_model(name, seed)
    model.save_pretrained(directory, safe_serialization=True)
    layout = CONFIGS[name][1]
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    if layout == "kimi_k2":
        config["model_type"] = "kimi_k2"
    elif layout == "published_rope":
        rope = dict(config.pop("rope_parameters"))
        config["rope_theta"] = rope.pop("rope_theta")
        rope["type"] = rope.pop("rope_type")
        config["rope_scaling"] = rope
    elif layout == "kimi_k25":
        text = dict(config)
        text["model_type"] = "kimi_k2"
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                  "text_config": text, "vision_config": {"model_type": "moonvit"}}
        _prefix_tensors(directory, "language_model.")
    config_path.write_text(json.dumps(config, indent=2))
    return model


def _prefix_tensors(directory, prefix):
    from safetensors.torch import load_file, save_file
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    save_file({prefix + k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
