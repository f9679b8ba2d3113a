"""A checkpoint directory laid out exactly like the published Kimi K2.6 (issue 19, acceptance 2):
nested text_config (kimi_k25 around kimi_k2), `language_model.` tensor prefix, vision tensors
(`vision_tower.*`, `mm_projector.*`) present and skipped, model.safetensors.index.json over three
shards, INT4 routed experts (group 32) as compressed-tensors writes them. It loads and generates
what transformers generates from the dequantized weights; malformed quantized tensors are
refused with one line naming the tensor.
"""
import json
import pathlib
import re
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import run_moeserve  # noqa: E402
from quant_checkpoints import build_quantized  # noqa: E402

PROMPT = [5, 17, 42, 99, 3, 250, 7]
TOKENS = 16
EXPERT = "language_model.model.layers.1.mlp.experts.3.down_proj"


@pytest.fixture(scope="module")
def k26(tmp_path_factory):
    directory = tmp_path_factory.mktemp("k26")
    model = build_quantized("int4_g32_kimi_k25", directory, shards=3)
    return directory, model


def test_layout_is_the_published_one(k26):
    directory, _ = k26
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "kimi_k25" and config["text_config"]["model_type"] == "kimi_k2"
    assert config["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] == 32
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) == 3
    assert {EXPERT + s for s in (".weight_packed", ".weight_scale", ".weight_shape")} <= set(weight_map)
    assert any(n.startswith("vision_tower.") for n in weight_map) and any(n.startswith("mm_projector.") for n in weight_map)
    assert "language_model.model.layers.1.mlp.shared_experts.down_proj.weight" in weight_map  # ignored: bf16


def test_loads_and_generates_like_transformers(k26):
    directory, model = k26
    out = run_moeserve("generate", "--model", directory, "-n", TOKENS, "--ignore-eos", "--prompt-ids",
                       ",".join(map(str, PROMPT)))
    with torch.no_grad():
        ref = model.generate(torch.tensor([PROMPT]), max_new_tokens=TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(PROMPT):].tolist()
    assert list(map(int, out.stdout.strip().split(","))) == ref


def broken_copy(src, dst, tensor, replacement):
    """A copy of `src` whose `tensor` is replaced (None: removed, from its shard and the index)."""
    shutil.copytree(src, dst)
    index_path = dst / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = dst / index["weight_map"][tensor]
    tensors = load_file(str(shard))
    if replacement is None:
        del tensors[tensor]
        del index["weight_map"][tensor]
        index_path.write_text(json.dumps(index))
    else:
        tensors[tensor] = replacement(tensors[tensor])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return dst


def one_line_error(directory, *flags):
    out = run_moeserve("generate", "--model", directory, "-n", 1, "--prompt-ids", "1,2", *flags, check=False)
    assert out.returncode != 0
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.mark.parametrize("suffix, replacement, message", [
    (".weight_packed", lambda t: t[:, :-1].contiguous(), r"has shape \[64, 15\], expected \[64, 16\]"),
    (".weight_scale", lambda t: t[:, :2].contiguous(), r"has shape \[64, 2\], expected \[64, 4\]"),
    (".weight_scale", lambda t: t.float(), r"has dtype F32, expected BF16"),
    (".weight_packed", lambda t: t.to(torch.int64), r"has dtype I64, expected I32"),
    (".weight_shape", None, r"missing tensor"),
    (".weight_shape", lambda t: torch.tensor([64, 64]), r"is \[64, 64\], expected \[64, 128\]"),
])
def test_malformed_tensors_are_named(k26, tmp_path, suffix, replacement, message):
    directory, _ = k26
    broken = broken_copy(directory, tmp_path / "broken", EXPERT + suffix, replacement)
    line = one_line_error(broken)
    assert EXPERT + suffix in line and re.search(message, line), line


def test_a_split_that_cuts_a_group_is_named(k26):
    directory, _ = k26
    # MoE TP 8 (attention DP 8 over 4 heads): 16 of each expert's 128 columns a rank, half a group.
    line = one_line_error(directory, "--tp-size", 8, "--dp-size", 8, "--enable-dp-attention")
    assert re.search(r"tensor 'language_model\.model\.layers\.\d+\.mlp\.experts\.\d+\.down_proj\.weight_packed': "
                     r"rank \d+ holds columns \[\d+, \d+\) of K = 128, which cuts a group of 32", line), line
