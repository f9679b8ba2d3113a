"""Malformed configs and checkpoints: non-zero exit and one error line naming the file,
tensor or field at fault."""
import json
import pathlib
import shutil
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import run_moeserve  # noqa: E402

TINY_CONFIG = {
    "model_type": "deepseek_v3", "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16,
    "moe_intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2, "n_shared_experts": 1,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "kv_lora_rank": 4,
    "q_lora_rank": None, "qk_rope_head_dim": 2, "v_head_dim": 2, "qk_nope_head_dim": 2,
    "first_k_dense_replace": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}


def tensors_of(config):
    """name -> shape of every tensor of a dense-only (first_k_dense_replace == layers) model."""
    h, v = config["hidden_size"], config["vocab_size"]
    heads, nope, rope, vd = (config["num_attention_heads"], config["qk_nope_head_dim"],
                             config["qk_rope_head_dim"], config["v_head_dim"])
    lat, inter = config["kv_lora_rank"], config["intermediate_size"]
    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h),
        p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (heads * (nope + rope), h),
        p + "self_attn.kv_a_proj_with_mqa.weight": (lat + rope, h),
        p + "self_attn.kv_a_layernorm.weight": (lat,),
        p + "self_attn.kv_b_proj.weight": (heads * (nope + vd), lat),
        p + "self_attn.o_proj.weight": (h, heads * vd),
        p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
        p + "mlp.down_proj.weight": (h, inter),
    }


def write_safetensors(path, tensors, dtype="F32", header_override=None, truncate=0, header_len_delta=0):
    """Writes {name: ndarray} as safetensors by hand, so tests can corrupt any part."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes() if dtype == "F32" else array
        header[name] = {"dtype": dtype if dtype == "F32" else "F8_E4M3", "shape": list(np.shape(array)) if dtype == "F32" else list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if header_override:
        header_override(header)
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    body = struct.pack("<Q", len(text) + header_len_delta) + text + b"".join(blobs)
    path.write_bytes(body[:len(body) - truncate] if truncate else body)


def make_model_dir(tmp_path, config=None, mutate=None, **kwargs):
    config = dict(TINY_CONFIG if config is None else config)
    directory = tmp_path / "model"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in tensors_of(config).items()}
    if mutate:
        mutate(tensors)
    write_safetensors(directory / "model.safetensors", tensors, **kwargs)
    return directory


def expect_error(args, *fragments):
    proc = run_moeserve(*args, check=False)
    assert proc.returncode != 0, f"expected failure, got success:\n{proc.stdout}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got:\n{proc.stderr}"
    for fragment in fragments:
        assert fragment in lines[0], f"'{fragment}' not in error: {lines[0]}"
    return lines[0]


def generate_args(directory):
    return ["generate", "--model", directory, "--prompt-ids", "1,2", "-n", "2"]


def test_well_formed_dense_model_generates(tmp_path):
    directory = make_model_dir(tmp_path, dict(TINY_CONFIG, first_k_dense_replace=1))
    out = run_moeserve(*generate_args(directory))
    assert len(out.stdout.strip().split(",")) == 2


@pytest.mark.parametrize("change, fragments", [
    (lambda c: c.update(model_type="llama"), ["config.json", "model_type", "llama"]),
    (lambda c: c.pop("kv_lora_rank"), ["config.json", "missing field 'kv_lora_rank'"]),
    (lambda c: c.update(topk_group=3), ["config.json", "topk_group", "n_group"]),
    (lambda c: c.update(hidden_size="big"), ["config.json", "hidden_size", "integer"]),
    (lambda c: c.update(n_group=3), ["config.json", "n_group", "n_routed_experts"]),
    (lambda c: c.update(num_experts_per_tok=9), ["config.json", "num_experts_per_tok"]),
    (lambda c: c.update(scoring_func="softmax"), ["config.json", "scoring_func"]),
    (lambda c: c.update(rope_scaling={"type": "dynamic", "factor": 2.0}), ["config.json", "rope_scaling.type"]),
    (lambda c: c.update(rope_scaling={"type": "yarn", "factor": 2.0}),
     ["config.json", "rope_scaling.original_max_position_embeddings"]),
    (lambda c: c.update(model_type="kimi_k25"), ["config.json", "text_config"]),
    (lambda c: c.update(qk_rope_head_dim=3), ["config.json", "qk_rope_head_dim"]),
    # Integers that do not fit (read as garbage before), negative and non-integral values.
    (lambda c: c.update(hidden_size=1e30), ["config.json", "field 'hidden_size' is 1e+30, out of range"]),
    (lambda c: c.update(num_hidden_layers=4294967297), ["config.json", "'num_hidden_layers' is 4294967297, out of range"]),
    (lambda c: c.update(vocab_size=2**64 - 1), ["config.json", "'vocab_size' is 18446744073709551615, out of range"]),
    (lambda c: c.update(kv_lora_rank=-2**40), ["config.json", "'kv_lora_rank' is -1099511627776, out of range"]),
    (lambda c: c.update(hidden_size=2**21), ["config.json", "'hidden_size' is 2097152, more than the supported maximum"]),
    (lambda c: c.update(n_routed_experts=2**30), ["config.json", "'n_routed_experts' is 1073741824, more than"]),
    (lambda c: c.update(num_hidden_layers=4097), ["config.json", "'num_hidden_layers' is 4097, more than the supported maximum 4096"]),
    (lambda c: c.update(num_nextn_predict_layers=-1), ["config.json", "'num_nextn_predict_layers' must be >= 0"]),
    (lambda c: c.update(hidden_size=-8), ["config.json", "'hidden_size' must be positive"]),
    (lambda c: c.update(num_hidden_layers=7.5), ["config.json", "'num_hidden_layers' must be an integer"]),
])
def test_bad_config_names_the_field(tmp_path, change, fragments):
    config = dict(TINY_CONFIG, num_hidden_layers=2)  # layer 1 is MoE: its fields are validated
    change(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    expect_error(["inspect", path], *fragments)


def test_config_invalid_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{ not json")
    expect_error(["inspect", path], "config.json", "invalid JSON")


def test_truncated_file(tmp_path):
    directory = make_model_dir(tmp_path, truncate=100)
    expect_error(generate_args(directory), "model.safetensors", "outside the data section")


def test_file_shorter_than_header_length(tmp_path):
    directory = make_model_dir(tmp_path)
    (directory / "model.safetensors").write_bytes(b"\x01\x02")
    expect_error(generate_args(directory), "model.safetensors", "truncated")


def test_header_length_past_end_of_file(tmp_path):
    directory = make_model_dir(tmp_path, header_len_delta=10**9)
    expect_error(generate_args(directory), "model.safetensors", "header length")


def test_offsets_outside_data(tmp_path):
    def shift(header):
        header["model.norm.weight"]["data_offsets"] = [10**9, 10**9 + 32]
    directory = make_model_dir(tmp_path, header_override=shift)
    expect_error(generate_args(directory), "model.safetensors", "model.norm.weight", "data_offsets")


def test_overlapping_offsets(tmp_path):
    def overlap(header):  # two (8,) tensors over the same bytes
        norm = "model.layers.0.input_layernorm.weight"
        header[norm]["data_offsets"] = list(header["model.norm.weight"]["data_offsets"])
    directory = make_model_dir(tmp_path, header_override=overlap)
    expect_error(generate_args(directory), "model.safetensors", "model.layers.0.input_layernorm.weight", "overlap",
                 "model.norm.weight")


def test_reversed_offsets(tmp_path):
    def reverse(header):
        header["model.norm.weight"]["data_offsets"] = header["model.norm.weight"]["data_offsets"][::-1]
    directory = make_model_dir(tmp_path, header_override=reverse)
    expect_error(generate_args(directory), "model.safetensors", "model.norm.weight", "out of order")


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**62, 4], [2**63, 2], [2**64 - 1]])
def test_shape_element_count_overflow(tmp_path, shape):
    def add(header):  # wraps to 0 bytes (or a negative dimension) without overflow checks
        end = max(entry["data_offsets"][1] for entry in header.values())
        header["model.extra.weight"] = {"dtype": "F32", "shape": shape, "data_offsets": [end, end]}
    directory = make_model_dir(tmp_path, header_override=add)
    expect_error(generate_args(directory), "model.safetensors", "model.extra.weight")


@pytest.mark.parametrize("tensor", ["model.norm.weight", "model.layers.0.mlp.down_proj.weight"])
@pytest.mark.parametrize("draw", [[], ["--temperature", "0.7", "--seed", "3"], ["--logprobs", "2"]],
                         ids=["greedy", "candidates", "logits"])
def test_nan_weight_is_an_error_not_token_0(tmp_path, tensor, draw):
    # Greedy draws of NaN logits used to give token 0 for ever, with exit code 0.
    def poison(tensors):
        tensors[tensor].flat[3] = np.nan
    directory = make_model_dir(tmp_path, mutate=poison)
    expect_error(generate_args(directory) + draw,
                 f"model {directory} produced non-finite logits (NaN/Inf) at the first step: check its weights")


def test_inf_weight_is_an_error(tmp_path):
    def poison(tensors):
        tensors["model.norm.weight"][:] = np.inf
    directory = make_model_dir(tmp_path, mutate=poison)
    expect_error(generate_args(directory), "non-finite logits (NaN/Inf) at the first step")


def test_absurd_header_length(tmp_path):
    directory = make_model_dir(tmp_path)
    path = directory / "model.safetensors"
    with open(path, "r+b") as f:  # a 200 MB header length in a sparse 300 MB file
        f.write(struct.pack("<Q", 200_000_000))
        f.truncate(300_000_000)
    expect_error(generate_args(directory), "model.safetensors", "header length 200000000", "limit")


def test_wrong_byte_count_for_shape(tmp_path):
    def grow(header):
        header["model.norm.weight"]["shape"] = [9]
    directory = make_model_dir(tmp_path, header_override=grow)
    expect_error(generate_args(directory), "model.safetensors", "model.norm.weight", "bytes")


def test_duplicate_tensor_in_header(tmp_path):
    directory = make_model_dir(tmp_path)
    path = directory / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + n].decode()
    entry = '"model.norm.weight": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}'
    patched = "{" + entry + ", " + header[1:]
    path.write_bytes(struct.pack("<Q", len(patched)) + patched.encode() + raw[8 + n:])
    expect_error(generate_args(directory), "model.safetensors", "duplicate tensor 'model.norm.weight'")


def test_missing_tensor(tmp_path):
    directory = make_model_dir(tmp_path, mutate=lambda t: t.pop("model.layers.0.self_attn.o_proj.weight"))
    expect_error(generate_args(directory), "missing tensor 'model.layers.0.self_attn.o_proj.weight'")


def test_wrong_shape(tmp_path):
    def reshape(tensors):
        tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((15, 8), np.float32)
    directory = make_model_dir(tmp_path, mutate=reshape)
    expect_error(generate_args(directory), "model.safetensors", "model.layers.0.mlp.up_proj.weight",
                 "[15, 8]", "expected [16, 8]")


def test_fp8_weights_refused(tmp_path):
    directory = make_model_dir(tmp_path)
    # Re-write one tensor as F8_E4M3 (1 byte per element).
    config = TINY_CONFIG
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in tensors_of(config).items()}
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        fp8 = name == "model.layers.0.self_attn.o_proj.weight"
        data = np.zeros(array.shape, np.uint8).tobytes() if fp8 else array.tobytes()
        header[name] = {"dtype": "F8_E4M3" if fp8 else "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    expect_error(generate_args(directory), "model.layers.0.self_attn.o_proj.weight", "F8_E4M3", "does not quantize it")


def test_int4_packed_weights_refused(tmp_path):
    def pack(tensors):
        w = tensors.pop("model.layers.0.mlp.down_proj.weight")
        tensors["model.layers.0.mlp.down_proj.weight_packed"] = np.zeros((w.shape[0], w.shape[1] // 8), np.float32)
    directory = make_model_dir(tmp_path, mutate=pack)
    expect_error(generate_args(directory), "model.layers.0.mlp.down_proj.weight", "int4", "does not quantize it")


def test_sharded_checkpoint_loads_and_matches_single_file(tmp_path):
    single = make_model_dir(tmp_path)
    expected = run_moeserve(*generate_args(single)).stdout
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(single / "config.json", sharded / "config.json")
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in tensors_of(TINY_CONFIG).items()}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, shard_names in shards.items():
        write_safetensors(sharded / shard, {n: tensors[n] for n in shard_names})
        weight_map.update({n: shard for n in shard_names})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert run_moeserve(*generate_args(sharded)).stdout == expected

    # A tensor listed for a shard that does not hold it.
    bad = dict(weight_map)
    bad[names[0]] = "model-00002-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": bad}))
    expect_error(generate_args(sharded), "model.safetensors.index.json", names[0], "missing from")

    # The same tensor in two shards.
    write_safetensors(sharded / "model-00002-of-00002.safetensors",
                      {n: tensors[n] for n in shards["model-00002-of-00002.safetensors"] + [names[0]]})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_error(generate_args(sharded), "model-00002-of-00002.safetensors", names[0])


def test_bf16_and_fp16_checkpoints_load(tmp_path):
    """The same weights stored as bf16, fp16 and fp32 (exactly representable values) generate the same ids."""
    import torch
    from safetensors.torch import save_file
    outputs = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        directory = tmp_path / str(dtype)
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
        gen = torch.Generator().manual_seed(0)
        tensors = {}
        for name, shape in tensors_of(TINY_CONFIG).items():
            # Multiples of 1/8 in [-2, 2]: exact in every one of the three dtypes.
            tensors[name] = (torch.randint(-16, 17, shape, generator=gen).float() / 8).to(dtype)
        save_file(tensors, str(directory / "model.safetensors"))
        outputs.append(run_moeserve(*generate_args(directory)).stdout)
    assert outputs[0] == outputs[1] == outputs[2]
