"""DeepSeek-V3-shaped safetensors checkpoints of random bytes, for the load and re-plan benchmarks
(scripts/bench_replan_cpu.py, scripts/gpu/replan_k26_gpu.py): the tensor list the loader reads,
the safetensors framing and the tokenizer files. What the bytes are is the caller's: a `write_data`
callback writes each tensor's.

A routed expert is either bf16 `weight`s or compressed-tensors pack-quantized INT4 (group 32):
int32 `weight_packed` [N, K/8], bf16 `weight_scale` [N, K/32] and `weight_shape`, whose value
[N, K] is carried in place of its shape ([2]) by the tensor list.
"""
import json
import pathlib
import shutil
import struct

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DTYPE_BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8}


def head_tensors(c):
    """name -> (shape, dtype) of the embedding, the final norm and the LM head."""
    h = c["hidden_size"]
    return {"model.embed_tokens.weight": ([c["vocab_size"], h], "BF16"), "model.norm.weight": ([h], "BF16"),
            "lm_head.weight": ([c["vocab_size"], h], "BF16")}


def layer_tensors(c, layer, int4_experts=False):
    """name -> (shape, dtype) of decoder layer `layer`, in the order the benchmarks write them."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qk, kv, rope = c["qk_nope_head_dim"] + c["qk_rope_head_dim"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    p = f"model.layers.{layer}."
    out = {p + "input_layernorm.weight": ([h], "BF16"), p + "post_attention_layernorm.weight": ([h], "BF16"),
           p + "self_attn.q_a_proj.weight": ([c["q_lora_rank"], h], "BF16"),
           p + "self_attn.q_a_layernorm.weight": ([c["q_lora_rank"]], "BF16"),
           p + "self_attn.q_b_proj.weight": ([heads * qk, c["q_lora_rank"]], "BF16"),
           p + "self_attn.kv_a_proj_with_mqa.weight": ([kv + rope, h], "BF16"),
           p + "self_attn.kv_a_layernorm.weight": ([kv], "BF16"),
           p + "self_attn.kv_b_proj.weight": ([heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), kv], "BF16"),
           p + "self_attn.o_proj.weight": ([h, heads * c["v_head_dim"]], "BF16")}
    if layer < c["first_k_dense_replace"]:
        bf16_mlps, routed = [(p + "mlp.", c["intermediate_size"])], []
    else:
        out[p + "mlp.gate.weight"] = ([c["n_routed_experts"], h], "BF16")
        out[p + "mlp.gate.e_score_correction_bias"] = ([c["n_routed_experts"]], "F32")
        bf16_mlps = [(p + "mlp.shared_experts.", c["moe_intermediate_size"] * c["n_shared_experts"])]
        routed = [p + f"mlp.experts.{e}." for e in range(c["n_routed_experts"])]
        if not int4_experts:
            bf16_mlps += [(prefix, c["moe_intermediate_size"]) for prefix in routed]
            routed = []
    for prefix, inter in bf16_mlps:
        out.update({prefix + "gate_proj.weight": ([inter, h], "BF16"), prefix + "up_proj.weight": ([inter, h], "BF16"),
                    prefix + "down_proj.weight": ([h, inter], "BF16")})
    inter = c["moe_intermediate_size"]
    for prefix in routed:
        for proj, (n, k) in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
            out[f"{prefix}{proj}.weight_packed"] = ([n, k // 8], "I32")
            out[f"{prefix}{proj}.weight_scale"] = ([n, k // 32], "BF16")
            out[f"{prefix}{proj}.weight_shape"] = ([n, k], "I64")  # its value, not its shape ([2])
    return out


def stored_shape(name, shape):
    """The shape the header gives: a weight_shape tensor holds [N, K] as two int64 values."""
    return [2] if name.endswith(".weight_shape") else shape


def write_safetensors(path, tensors, write_data):
    """Writes `tensors` (name -> (shape, dtype)) to `path` through `path`.part, each tensor's bytes
    by write_data(file, name, shape, dtype); returns the bytes of tensor data."""
    header, offset = {}, 0
    for name, (shape, dtype) in tensors.items():
        size = int(np.prod(stored_shape(name, shape))) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": stored_shape(name, shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    part = pathlib.Path(str(path) + ".part")
    with open(part, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, (shape, dtype) in tensors.items():
            if name.endswith(".weight_shape"):
                f.write(struct.pack("<qq", *shape))
            else:
                write_data(f, name, shape, dtype)
    part.rename(path)
    return offset


def copy_tokenizer(directory):
    """The default model's tokenizer files, so that the server can start on the checkpoint."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "models/default" / name, directory / name)
