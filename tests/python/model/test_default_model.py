"""The shipped default model (models/default): moeserve runs it without --model, its greedy
answers are English words, and moeserve equals transformers on it (fp32 CPU): the held-out
perplexity (1e-4 relative) and 32 greedy tokens on 5 prompts. Its MTP layer is stored as
DeepSeek-V3 stores it and loads with the reference module (scripts/deepseek_mtp.py)."""
import json
import math
import pathlib
import re
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "scripts"))
from conftest import run_moeserve  # noqa: E402
from ppl_oracle import hf_sliding_window_ppl  # noqa: E402

MODEL = ROOT / "models" / "default"
HELDOUT = MODEL / "heldout.txt"
WORDS = pathlib.Path("/usr/share/dict/american-english")  # Debian's wamerican
ENGLISH_PROMPT = "The Python interpreter is"
PROMPTS = ["The Python interpreter is", "In the beginning God created", "The kernel provides a way to",
           "A list is a sequence of", "And the LORD said unto Moses,"]
GREEDY_TOKENS = 32


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(MODEL / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_model():
    from transformers import DeepseekV3ForCausalLM
    model = DeepseekV3ForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def english_share(text, words):
    tokens = re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)?", text)
    known = [t for t in tokens if t in words or t.lower() in words]
    return len(known) / max(1, len(tokens)), tokens


def test_default_model_answers_in_english_words():
    # No --model: the shipped default model, found relative to the executable.
    out = run_moeserve("generate", "--prompt", ENGLISH_PROMPT, "-n", 48, "--ignore-eos")
    text = json.loads(out.stdout.strip())
    words = set(WORDS.read_text(encoding="utf-8", errors="replace").split())
    share, tokens = english_share(text, words)
    assert len(tokens) >= 15, f"too few words to judge: {text!r}"
    assert share >= 0.8, f"{share:.0%} of the words are English: {text!r}"


def test_heldout_perplexity_matches_transformers(hf_model, tokenizer):
    ids = torch.tensor(tokenizer.encode(HELDOUT.read_text(encoding="utf-8"), add_special_tokens=False).ids)
    ref, ref_tokens = hf_sliding_window_ppl(hf_model, ids, 512, 256)
    ours = json.loads(run_moeserve("eval-ppl", "--model", MODEL, "--text", HELDOUT, "--context", 512,
                                   "--stride", 256).stdout)
    assert ours["scored_tokens"] == ref_tokens
    assert abs(ours["perplexity"] - ref) / ref <= 1e-4, f"moeserve {ours['perplexity']} vs transformers {ref}"
    # The shipped statistics were measured on these weights and this text.
    recorded = json.loads((MODEL / "router_stats.json").read_text())["heldout_ppl"]
    assert abs(recorded - ref) / ref <= 1e-3, f"router_stats.json records {recorded}, the weights give {ref}"


def test_greedy_tokens_match_transformers(hf_model, tokenizer):
    prompts = [tokenizer.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    args = ["generate", "--model", MODEL, "-n", GREEDY_TOKENS, "--ignore-eos"]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    lines = run_moeserve(*args).stdout.strip().splitlines()
    assert len(lines) == len(prompts)
    for prompt, line in zip(prompts, lines):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                                    use_cache=True, eos_token_id=None, pad_token_id=2)[0, len(prompt):].tolist()
        assert list(map(int, line.split(","))) == ref, f"prompt {tokenizer.decode(prompt)!r}"


def test_mtp_layer_is_stored_as_deepseek_v3_stores_it(tokenizer):
    from safetensors import safe_open

    from deepseek_mtp import MTP_EXTRA, load_mtp
    config = json.loads((MODEL / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    n = config["num_hidden_layers"]
    with safe_open(str(MODEL / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for extra in MTP_EXTRA:
            assert f"model.layers.{n}.{extra}" in names
        assert any(k.startswith(f"model.layers.{n}.mlp.experts.") for k in names), "the MTP block is a MoE layer"
        assert torch.equal(f.get_tensor(f"model.layers.{n}.shared_head.head.weight"), f.get_tensor("lm_head.weight"))
        assert f.get_tensor(f"model.layers.{n}.mlp.gate.e_score_correction_bias").dtype == torch.float32
    # The MTP head predicts two tokens ahead far better than chance (vocab 4096).
    model, mtp = load_mtp(MODEL)
    ids = torch.tensor([tokenizer.encode(HELDOUT.read_text(encoding="utf-8")[:3000], add_special_tokens=False).ids])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = mtp.logits(model, hidden[:, :-2], ids[:, 1:-1])
    nll = torch.nn.functional.cross_entropy(logits[0], ids[0, 2:]).item()
    assert math.exp(nll) < 4096 / 8, f"MTP perplexity {math.exp(nll)}"


def test_model_directory_is_within_budget():
    assert (MODEL / "model.safetensors").stat().st_size <= 16_000_000
    tokenizer_config = json.loads((MODEL / "tokenizer_config.json").read_text())
    template = (ROOT / "tokenizer" / "chat_templates" / "deepseek-v3.jinja").read_text()
    assert tokenizer_config["chat_template"] == template
    assert tokenizer_config["eos_token"] == "<｜end▁of▁sentence｜>"
