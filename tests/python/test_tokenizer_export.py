"""`moeserve tokenizer export DIR`: the built-in tokenizer of the synthetic models as Hugging Face
files. The `tokenizers` and `transformers` libraries load them and count, encode and decode as
moeserve's own tokenizer does (`moeserve tokenize` / `detokenize` are the reference)."""
import json

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from conftest import run_moeserve

TEXTS = ["hello world", "naïve café — 東京 🙂", "line\nbreak\ttab", " leading and trailing "]


@pytest.fixture(scope="module", params=["synthetic:tiny", "synthetic:kimi-k2.6:layers=1"])
def exported(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    run_moeserve("tokenizer", "export", out, "--model", request.param)
    return request.param, out


def moeserve_ids(text):
    return [int(i) for i in run_moeserve("tokenize", "--tokenizer", "synthetic", "--text", text).stdout.split(",")]


def test_tokenizers_and_transformers_encode_as_moeserve(exported):
    model, out = exported
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "[EOS]" and config["bos_token"] == "[BOS]"
    fast = Tokenizer.from_file(str(out / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(out))
    for text in TEXTS:
        expected = moeserve_ids(text)
        assert fast.encode(text).ids == expected, text
        assert auto.encode(text, add_special_tokens=False) == expected, text
        assert auto.decode(expected) == text
    assert auto.convert_tokens_to_ids("[EOS]") == 257 and auto.convert_tokens_to_ids("<|im_end|>") == 258


def test_vocabulary_is_the_models(exported):
    model, out = exported
    vocab = {"synthetic:tiny": None, "synthetic:kimi-k2.6:layers=1": 163840}[model]
    fast = Tokenizer.from_file(str(out / "tokenizer.json"))
    if vocab is not None:
        assert fast.get_vocab_size(with_added_tokens=True) == vocab
    # Every id decodes as moeserve decodes it (special tokens print their text).
    ids = [0, 65, 200, 255, 256, 257, 263, fast.get_vocab_size(with_added_tokens=True) - 1]
    expected = run_moeserve("detokenize", "--tokenizer", out, "--ids", ",".join(map(str, ids))).stdout
    assert fast.decode(ids, skip_special_tokens=False) == expected


def test_a_model_directory_is_not_exported(tmp_path):
    proc = run_moeserve("tokenizer", "export", tmp_path / "x", "--model", str(tmp_path), check=False)
    assert proc.returncode != 0
