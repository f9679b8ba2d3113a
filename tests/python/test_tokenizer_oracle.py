"""moeserve's tokenizers against Hugging Face `tokenizers` and `tiktoken` on the shared corpus:
identical ids, decode(encode(x)) == x, special tokens only where allowed, and streaming
detokenization that concatenates to the full decode without ever emitting broken UTF-8."""
import json
import random
import subprocess

import pytest

import tokenizer_oracle as oracle
from conftest import moeserve_bin

CORPUS = oracle.corpus()


def run_bytes(*args):
    proc = subprocess.run([moeserve_bin(), *map(str, args)], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    hf = {
        "deepseek": oracle.deepseek_like(root / "deepseek"),
        "deepseek-string-merges": oracle.deepseek_like(root / "deepseek-string-merges", merges_as_strings=True),
        "gpt2": oracle.gpt2_like(root / "gpt2"),
    }
    hf["ignore-merges"] = oracle.variant(root / "deepseek", root / "ignore-merges", ignore_merges=True)
    hf["split-behaviors"] = oracle.variant(root / "gpt2", root / "split-behaviors", odd_pre_tokenizer=True)
    kimi = oracle.kimi_like(root / "kimi")
    corpus_file = root / "corpus.jsonl"
    corpus_file.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in CORPUS), encoding="utf-8")
    return {"root": root, "hf": hf, "kimi": kimi, "corpus": corpus_file}


def moeserve_encode(directory, corpus_file, allow_special):
    args = ["tokenize", "--tokenizer", directory, "--jsonl", corpus_file]
    if allow_special:
        args.append("--allow-special")
    lines = run_bytes(*args).decode().split("\n")[:-1]
    return [[int(x) for x in line.split(",")] if line else [] for line in lines]


def moeserve_decode(directory, id_lists, tmp_path, stream):
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("".join(",".join(map(str, ids)) + "\n" for ids in id_lists))
    args = ["detokenize", "--tokenizer", directory, "--ids-file", ids_file]
    if stream:
        args.append("--stream")
    # json.loads on bytes decodes UTF-8 strictly: a broken chunk would raise here.
    return [json.loads(line) for line in run_bytes(*args).split(b"\n")[:-1]]


def hf_reference(tok, allow_special):
    tok.encode_special_tokens = not allow_special
    return [tok.encode(x, add_special_tokens=False).ids for x in CORPUS]


HF_NAMES = ["deepseek", "deepseek-string-merges", "gpt2", "ignore-merges", "split-behaviors"]


@pytest.mark.parametrize("name", HF_NAMES)
@pytest.mark.parametrize("allow_special", [True, False])
def test_hf_ids_identical(tokenizers, name, allow_special):
    ours = moeserve_encode(tokenizers["root"] / name, tokenizers["corpus"], allow_special)
    reference = hf_reference(tokenizers["hf"][name], allow_special)
    assert len(ours) == len(CORPUS)
    for text, got, want in zip(CORPUS, ours, reference):
        assert got == want, f"ids differ for {text!r}"


@pytest.mark.parametrize("allow_special", [True, False])
def test_tiktoken_ids_identical(tokenizers, allow_special):
    enc = tokenizers["kimi"]
    ours = moeserve_encode(tokenizers["root"] / "kimi", tokenizers["corpus"], allow_special)
    for text, got in zip(CORPUS, ours):
        want = enc.encode(text, allowed_special="all") if allow_special else enc.encode_ordinary(text)
        assert got == want, f"ids differ for {text!r}"


def special_ids(name, tokenizers):
    if name == "kimi":
        return set(tokenizers["kimi"]._special_tokens.values())
    tok = tokenizers["hf"][name]
    return {tok.token_to_id(t) for t in oracle.DEEPSEEK_SPECIALS if tok.token_to_id(t) is not None}


@pytest.mark.parametrize("name", ["deepseek", "kimi"])
def test_special_tokens_only_where_allowed(tokenizers, name):
    specials = special_ids(name, tokenizers)
    directory = tokenizers["root"] / name
    denied = moeserve_encode(directory, tokenizers["corpus"], allow_special=False)
    allowed = moeserve_encode(directory, tokenizers["corpus"], allow_special=True)
    assert all(not specials.intersection(ids) for ids in denied)
    special_texts = (oracle.DEEPSEEK_SPECIALS if name == "deepseek" else list(oracle.KIMI_SPECIALS.values()))
    for text, ids in zip(CORPUS, allowed):
        assert bool(specials.intersection(ids)) == any(s in text for s in special_texts), text


@pytest.mark.parametrize("name", ["deepseek", "deepseek-string-merges", "gpt2", "kimi"])
@pytest.mark.parametrize("allow_special", [True, False])
def test_round_trip_and_streaming(tokenizers, tmp_path, name, allow_special):
    directory = tokenizers["root"] / name
    encoded = moeserve_encode(directory, tokenizers["corpus"], allow_special)
    decoded = moeserve_decode(directory, encoded, tmp_path, stream=False)
    streamed = moeserve_decode(directory, encoded, tmp_path, stream=True)
    for text, ids, full, chunks in zip(CORPUS, encoded, decoded, streamed):
        prefix = " " if name == "gpt2" and text and not text.startswith(" ") else ""
        assert full == prefix + text, f"decode(encode(x)) != x for {text!r}"
        assert "".join(chunks) == full
        assert len(chunks) == len(ids) + 1  # one per pushed id, then the flush
        assert "\ufffd" not in "".join(chunks)


def random_id_lists(vocab_size, seed):
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(1, 40))] for _ in range(200)]


@pytest.mark.parametrize("name", ["deepseek", "kimi"])
def test_decode_of_arbitrary_ids_matches_reference(tokenizers, tmp_path, name):
    """Random ids give ill-formed UTF-8: every chunk still decodes, the chunks concatenate to the
    full decode, and that equals the reference library's lossy decode."""
    if name == "kimi":
        enc = tokenizers["kimi"]
        id_lists = random_id_lists(enc.n_vocab, seed=1)
        reference = [enc.decode(ids, errors="replace") for ids in id_lists]
    else:
        tok = tokenizers["hf"][name]
        id_lists = random_id_lists(tok.get_vocab_size(), seed=2)
        reference = [tok.decode(ids, skip_special_tokens=False) for ids in id_lists]
    directory = tokenizers["root"] / name
    decoded = moeserve_decode(directory, id_lists, tmp_path, stream=False)
    streamed = moeserve_decode(directory, id_lists, tmp_path, stream=True)
    assert any("\ufffd" in text for text in reference)  # the test does reach broken sequences
    for ids, want, full, chunks in zip(id_lists, reference, decoded, streamed):
        assert full == want, ids
        assert "".join(chunks) == full, ids


def test_builtin_tokenizer_round_trip(tmp_path):
    text = "héllo <|im_end|> 你好 😀"
    ids = [int(x) for x in run_bytes("tokenize", "--tokenizer", "synthetic", "--text", text,
                                      "--allow-special").decode().strip().split(",")]
    assert ids[:2] == [104, 0xC3]  # bytes are their own ids
    assert 258 in ids  # <|im_end|> is id 258
    assert run_bytes("detokenize", "--tokenizer", "synthetic", "--ids", ",".join(map(str, ids))).decode() == text
