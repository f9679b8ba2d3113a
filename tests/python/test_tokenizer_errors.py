"""Malformed tokenizer files give one-line errors that name the file and the entry at fault."""
import base64
import json
import subprocess

import pytest

import tokenizer_oracle as oracle
from conftest import moeserve_bin


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    oracle.deepseek_like(root / "hf")
    oracle.kimi_like(root / "kimi")
    return root


def tokenize_error(directory):
    proc = subprocess.run([moeserve_bin(), "tokenize", "--tokenizer", str(directory), "--text", "hi"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1, proc.stderr  # exactly one line
    return proc.stderr


def hf_with(tmp_path, good, edit):
    spec = json.loads((good / "hf" / "tokenizer.json").read_text(encoding="utf-8"))
    edit(spec)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return tmp_path


def kimi_with(tmp_path, good, extra_lines=(), config_edit=None):
    lines = (good / "kimi" / "tiktoken.model").read_text().splitlines()
    (tmp_path / "tiktoken.model").write_text("\n".join(lines + list(extra_lines)) + "\n")
    config = json.loads((good / "kimi" / "tokenizer_config.json").read_text(encoding="utf-8"))
    if config_edit:
        config_edit(config)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path, len(lines)


def test_bad_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE",\n  "vocab": {"a": 0,}}}')
    err = tokenize_error(tmp_path)
    assert "tokenizer.json: invalid JSON: parse error at line 2" in err


def test_unknown_model_type(tmp_path, good):
    err = tokenize_error(hf_with(tmp_path, good, lambda s: s["model"].update(type="WordPiece")))
    assert 'tokenizer.json: model type "WordPiece" is not supported' in err


def test_unknown_normalizer(tmp_path, good):
    err = tokenize_error(hf_with(tmp_path, good, lambda s: s.update(normalizer={"type": "NFKC"})))
    assert 'tokenizer.json: normalizer: normalizer type "NFKC" is not supported' in err


def test_unknown_pre_tokenizer(tmp_path, good):
    def edit(spec):
        spec["pre_tokenizer"]["pretokenizers"][1] = {"type": "Whitespace"}
    err = tokenize_error(hf_with(tmp_path, good, edit))
    assert 'tokenizer.json: pre_tokenizer.pretokenizers[1]: pre-tokenizer type "Whitespace"' in err


def test_merge_of_unknown_token(tmp_path, good):
    def edit(spec):
        spec["model"]["merges"][7] = ["zzzq", "q"]
    err = tokenize_error(hf_with(tmp_path, good, edit))
    assert 'tokenizer.json: model.merges[7]: "zzzq" is not in the vocab' in err


def test_duplicate_vocab_id(tmp_path, good):
    def edit(spec):
        spec["model"]["vocab"]["ĠduplicateĠtoken"] = 5
    err = tokenize_error(hf_with(tmp_path, good, edit))
    assert "tokenizer.json: model.vocab: id 5 is used by both" in err and "ĠduplicateĠtoken" in err


def test_bad_base64(tmp_path, good):
    directory, n = kimi_with(tmp_path, good, ["not*base64 5000"])
    err = tokenize_error(directory)
    assert f'tiktoken.model:{n + 1}: invalid base64 token "not*base64"' in err


def test_duplicate_rank(tmp_path, good):
    directory, n = kimi_with(tmp_path, good, [base64.b64encode(b"never seen before").decode() + " 7"])
    err = tokenize_error(directory)
    assert f"tiktoken.model:{n + 1}: rank 7 is already used by line 8" in err


def test_duplicate_token(tmp_path, good):
    directory, n = kimi_with(tmp_path, good, [base64.b64encode(b"a").decode() + " 99999"])
    err = tokenize_error(directory)
    assert f"tiktoken.model:{n + 1}: token \"YQ==\" is already listed on line" in err


def test_bad_rank(tmp_path, good):
    directory, n = kimi_with(tmp_path, good, ["eHl6 -3"])
    err = tokenize_error(directory)
    assert f'tiktoken.model:{n + 1}: rank "-3" is not a non-negative integer' in err


def test_unknown_tiktoken_class(tmp_path, good):
    directory, _ = kimi_with(tmp_path, good, config_edit=lambda c: c.update(tokenizer_class="GPT4Tokenizer"))
    err = tokenize_error(directory)
    assert 'tokenizer_config.json: tokenizer_class "GPT4Tokenizer" is not a known tiktoken tokenizer' in err


def test_bad_added_token_id(tmp_path, good):
    directory, _ = kimi_with(tmp_path, good, config_edit=lambda c: c["added_tokens_decoder"].update({"x1": {"content": "<|x|>"}}))
    err = tokenize_error(directory)
    assert 'tokenizer_config.json: added_tokens_decoder["x1"]: "x1" is not a token id' in err


def test_missing_tokenizer_files(tmp_path):
    assert "no tokenizer.json or tiktoken.model" in tokenize_error(tmp_path)
    assert "not a directory" in tokenize_error(tmp_path / "absent")


@pytest.mark.parametrize("token_id", [2**32 - 1, 2**31 - 1, 2**31 - 2, 2**24, 10**7])
def test_added_token_id_out_of_range(tmp_path, good, token_id):
    # 2^32-1 used to wrap to -1 and write before the token table; INT32_MAX overflowed its size.
    def edit(spec):
        spec["added_tokens"].append({"id": token_id, "content": "<|huge|>", "special": True})
    spec = json.loads((good / "hf" / "tokenizer.json").read_text(encoding="utf-8"))
    err = tokenize_error(hf_with(tmp_path, good, edit))
    assert f"tokenizer.json: added_tokens[{len(spec['added_tokens'])}]: id {token_id} is out of range" in err


@pytest.mark.parametrize("token_id", [2**31 - 1, 10**7])
def test_vocab_id_out_of_range(tmp_path, good, token_id):
    err = tokenize_error(hf_with(tmp_path, good, lambda s: s["model"]["vocab"].update({"Ġhuge": token_id})))
    assert f'tokenizer.json: model.vocab["Ġhuge"]: id {token_id} is out of range' in err


def test_tiktoken_rank_beyond_2_pow_24(tmp_path, good):
    directory, n = kimi_with(tmp_path, good, [base64.b64encode(b"far away").decode() + " 20000000"])
    err = tokenize_error(directory)
    assert f"tiktoken.model:{n + 1}: rank 20000000 is not below 16777216" in err


def test_tiktoken_rank_far_past_the_ranks(tmp_path, good):
    directory, n = kimi_with(tmp_path, good, [base64.b64encode(b"far away").decode() + " 1000000"])
    err = tokenize_error(directory)
    assert f"tiktoken.model:{n + 1}: rank 1000000 is out of range" in err


@pytest.mark.parametrize("token_id, fragment", [
    (2**31 - 1, "token id 2147483647 is not below 16777216"),
    (5 * 10**6, "id 5000000 is out of range"),
])
def test_added_tokens_decoder_id_out_of_range(tmp_path, good, token_id, fragment):
    def edit(config):
        config["added_tokens_decoder"][str(token_id)] = {"content": "<|far|>", "special": True}
    directory, _ = kimi_with(tmp_path, good, config_edit=edit)
    err = tokenize_error(directory)
    assert f'tokenizer_config.json: added_tokens_decoder["{token_id}"]' in err and fragment in err
