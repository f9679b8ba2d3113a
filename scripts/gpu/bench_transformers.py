#!/usr/bin/env python3
"""transformers' decode step on the GPU, for the side-by-side in docs/benchmarks.md
(issue 5, acceptance 5). Builds a DeepseekV3ForCausalLM with the shapes of a moeserve
synthetic preset (default kimi-k2.6 with 3 layers) directly on the GPU in bf16, with the
same weight distribution as moeserve's synthetic weights (uniform, amplitude
sqrt(3 / fan_in); norms near 1; router bias near 0), prefills `--context` tokens per
sequence, then times a warmed-up decode loop with transformers' KV cache.

Prints one JSON line per batch size: {"batch", "step_ms", "tokens_per_s", "experts_impl"}.
"""
import argparse
import json
import math
import time

import torch

PRESETS = {
    # name: DeepseekV3Config kwargs (from tests/data/configs, copies of ../shared/reference/configs)
    "kimi-k2.6": dict(vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                      num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1, n_routed_experts=384,
                      routed_scaling_factor=2.827, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                      v_head_dim=128, qk_nope_head_dim=128, n_group=1, topk_group=1, num_experts_per_tok=8,
                      first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=262144,
                      rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "yarn", "factor": 64.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "mscale": 1.0, "mscale_all_dim": 1.0,
                                       "original_max_position_embeddings": 4096, "rope_theta": 50000.0}),
}


def build(preset, layers):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    config = DeepseekV3Config(num_hidden_layers=layers, **PRESETS[preset])
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM._from_config(config, torch_dtype=torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * (2 * torch.rand(p.shape, generator=gen, device="cuda") - 1))
            elif p.dim() >= 2:
                a = math.sqrt(3.0 / p.shape[-1])
                if name.endswith(("o_proj.weight", "down_proj")) or "down_proj" in name:
                    a *= 0.5
                if "embed_tokens" in name:
                    a = 1.0
                for chunk in p.view(-1, p.shape[-1]).split(4096):  # bounded temporaries
                    chunk.copy_(a * (2 * torch.rand(chunk.shape, generator=gen, device="cuda") - 1))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * (2 * torch.rand(b.shape, generator=gen, device="cuda") - 1))
    return model.eval()


def time_decode(model, batch, context, steps, warmup):
    from transformers import DynamicCache
    ids = torch.randint(0, model.config.vocab_size, (batch, context), device="cuda")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        next_ids = out.logits[:, -1:].argmax(-1)
        times = []
        for step in range(warmup + steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=next_ids, past_key_values=cache, use_cache=True)
            next_ids = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            if step >= warmup:
                times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="kimi-k2.6")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", default="1,64")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    model = build(args.preset, args.layers)
    impl = getattr(model.config, "_experts_implementation", None) or "default"
    for batch in map(int, args.batch.split(",")):
        ms = time_decode(model, batch, args.context, args.steps, args.warmup)
        print(json.dumps({"engine": "transformers", "preset": args.preset, "layers": args.layers, "batch": batch,
                          "context": args.context, "step_ms": round(ms, 3),
                          "tokens_per_s": round(batch / ms * 1e3, 1), "experts_impl": impl,
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
