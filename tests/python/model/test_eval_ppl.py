"""`moeserve eval-ppl` against transformers on random checkpoints (fp32 CPU, 1e-4 relative).

Each checkpoint of tests/python/checkpoints.py gets a byte-level tokenizer whose 256 ids are
the 256 bytes (BPE without merges, trained with HF `tokenizers`), so any text is a valid
token sequence of the 256-entry vocabulary; the oracle is HF's perplexity guide computed with
transformers' own loss (ppl_oracle.py)."""
import json
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from checkpoints import build_checkpoint  # noqa: E402
from conftest import run_moeserve  # noqa: E402
from ppl_oracle import hf_sliding_window_ppl  # noqa: E402

TEXT = ("Perplexity is the exponentiated average negative log-likelihood of a sequence. "
        "A sliding window keeps some history for every scored token. ") * 3


def write_byte_tokenizer(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["x"], trainer=trainer)
    assert tok.get_vocab_size() == 256
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return tok


@pytest.fixture(scope="module", params=["no_q_lora_dense1", "dense3_yarn"])
def checkpoint(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model = build_checkpoint(request.param, directory)
    tok = write_byte_tokenizer(directory)
    text_path = directory / "text.txt"
    text_path.write_text(TEXT)
    ids = torch.tensor(tok.encode(TEXT, add_special_tokens=False).ids)
    return directory, model, text_path, ids


# (context, stride): overlapping windows with a partial last one, windows without overlap
# (each window's first token goes unscored, as in HF's guide), a small stride (many windows,
# long history), one window holding the whole text.
@pytest.mark.parametrize("context,stride", [(128, 48), (100, 100), (40, 7), (4096, 2048)])
def test_eval_ppl_matches_transformers(checkpoint, context, stride):
    directory, model, text_path, ids = checkpoint
    ref, ref_tokens = hf_sliding_window_ppl(model, ids, context, stride)
    out = run_moeserve("eval-ppl", "--model", directory, "--text", text_path, "--context", context,
                       "--stride", stride)
    ours = json.loads(out.stdout)
    assert ours["tokens"] == ids.numel()
    assert ours["scored_tokens"] == ref_tokens
    windows = -(-max(ids.numel() - context, 0) // stride) + 1
    assert ref_tokens == ids.numel() - (windows if stride == context else 1)
    assert abs(ours["perplexity"] - ref) / ref <= 1e-4, f"moeserve {ours['perplexity']} vs transformers {ref}"


def test_eval_ppl_errors_name_the_option(checkpoint, tmp_path):
    directory, _, text_path, _ = checkpoint
    proc = run_moeserve("eval-ppl", "--model", directory, "--text", text_path, "--context", 8, "--stride", 9,
                        check=False)
    assert proc.returncode != 0 and "--stride 9" in proc.stderr
    proc = run_moeserve("eval-ppl", "--model", directory, "--text", tmp_path / "missing.txt", check=False)
    assert proc.returncode != 0 and "missing.txt" in proc.stderr
    proc = run_moeserve("eval-ppl", "--model", "synthetic:tiny", "--text", text_path, check=False)
    assert proc.returncode != 0 and "synthetic:tiny" in proc.stderr
