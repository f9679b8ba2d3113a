"""moeserve's forward runs the default model's MTP layer (DeepSeek-V3's multi-token prediction,
stored as layer num_hidden_layers) as the reference computation scripts/deepseek_mtp.py does on
transformers' hidden states: `moeserve eval-ppl --head mtp` (fp32 CPU) gives the MTP head's
sliding-window perplexity of the reference to 1e-4, on one rank and under tp2, ep2 and pp2 (the
MTP layer on the last stage, the embedding loaded there too)."""
import json
import math
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(ROOT / "scripts"))
from conftest import run_moeserve  # noqa: E402

MODEL = ROOT / "models" / "default"
HELDOUT = MODEL / "heldout.txt"
CONTEXT, STRIDE = 512, 256


@pytest.fixture(scope="module")
def reference():
    from deepseek_mtp import load_mtp
    model, mtp = load_mtp(MODEL, dtype=torch.float32)
    return model, mtp


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(MODEL / "tokenizer.json"))


def reference_mtp_ppl(reference, ids, context, stride):
    """(perplexity, scored tokens) of the MTP head over HF's sliding windows: in each window,
    row r (the main model's final hidden state at r and the token at r + 1) predicts token
    r + 2, and only tokens past the previous window's end are scored."""
    model, mtp = reference
    nll, scored, prev_end = 0.0, 0, 0
    for begin in range(0, ids.numel(), stride):
        end = min(begin + context, ids.numel())
        window = ids[begin:end].unsqueeze(0)                                       # [1, L]
        first = max(prev_end - begin - 2, 0)                                       # first scored row
        with torch.no_grad():
            hidden = model.model(input_ids=window).last_hidden_state              # [1, L, H]
            logits = mtp.logits(model, hidden[:, :-2], window[:, 1:-1])[0]       # [L - 2, V]
        logp = torch.log_softmax(logits[first:].double(), dim=-1)
        targets = window[0, 2 + first:]
        nll -= logp.gather(1, targets[:, None]).sum().item()
        scored += targets.numel()
        prev_end = end
        if end == ids.numel():
            break
    return math.exp(nll / scored), scored


def moeserve_mtp_ppl(text_path, *flags):
    out = run_moeserve("eval-ppl", "--model", MODEL, "--text", text_path, "--context", CONTEXT, "--stride", STRIDE,
                       "--head", "mtp", *flags, timeout=1200)
    return json.loads(out.stdout)


def test_mtp_heldout_perplexity_matches_reference(reference, tokenizer):
    ids = torch.tensor(tokenizer.encode(HELDOUT.read_text(encoding="utf-8"), add_special_tokens=False).ids)
    ref, scored = reference_mtp_ppl(reference, ids, CONTEXT, STRIDE)
    ours = moeserve_mtp_ppl(HELDOUT)
    assert ours["head"] == "mtp" and ours["scored_tokens"] == scored
    assert abs(ours["perplexity"] - ref) / ref <= 1e-4, f"moeserve {ours['perplexity']} vs reference {ref}"
    # The main head's perplexity is another number: the MTP layer's logits were returned.
    main = json.loads(run_moeserve("eval-ppl", "--model", MODEL, "--text", HELDOUT, "--context", CONTEXT,
                                   "--stride", STRIDE).stdout)
    assert abs(main["perplexity"] - ours["perplexity"]) / ref > 1e-2
    # The shipped statistics (router_stats.json) were measured with the same reference.
    recorded = json.loads((MODEL / "router_stats.json").read_text())["heldout_mtp_ppl"]
    assert abs(recorded - ref) / ref <= 1e-3, f"router_stats.json records {recorded}, the weights give {ref}"


@pytest.mark.parametrize("plan", ["tp2", "ep2", "pp2"])
def test_mtp_perplexity_under_plans(reference, tokenizer, tmp_path, plan):
    # A shorter text (three overlapping windows), so that each plan runs quickly.
    text = HELDOUT.read_text(encoding="utf-8")[:3000]
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False).ids)
    assert ids.numel() > CONTEXT, ids.numel()  # more than one window
    ref, scored = reference_mtp_ppl(reference, ids, CONTEXT, STRIDE)
    ours = moeserve_mtp_ppl(path, "--plan", plan)
    assert ours["scored_tokens"] == scored
    assert abs(ours["perplexity"] - ref) / ref <= 1e-4, f"{plan}: moeserve {ours['perplexity']} vs reference {ref}"
