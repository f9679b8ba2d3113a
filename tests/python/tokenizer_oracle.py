"""Builds the tokenizers the tokenizer tests compare against (no downloads).

- deepseek_like: a byte-level BPE trained with Hugging Face `tokenizers` whose pre-tokenizer is
  DeepSeek-V3's (Sequence of Split regexes + ByteLevel), with DeepSeek-style special tokens and
  the DeepSeek-V3 chat template; `merges_as_strings` writes merges in the old "a b" form.
- gpt2_like: the same trainer with a plain ByteLevel pre-tokenizer (GPT-2 regex, prefix space).
- kimi_like: a tiktoken ranks file and tokenizer_config.json laid out like Kimi K2's
  (tiktoken.model, TikTokenTokenizer, 256 reserved special ids after the ranks), plus the
  matching `tiktoken.Encoding` built with Kimi's split pattern.
"""
import base64
import json
import pathlib

import tiktoken
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "tokenizer" / "data"
TEMPLATES = REPO / "tokenizer" / "chat_templates"  # the built-in templates moeserve ships

# DeepSeek-V3's tokenizer.json pre-tokenizer regexes.
DEEPSEEK_SPLITS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
DEEPSEEK_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>",
                     "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                     "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                     "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]
DEEPSEEK_ADDED = ["<think>", "</think>"]  # non-special added tokens: always recognised

# tokenization_kimi.py's pat_str.
KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
# Kimi K2's named special tokens, as offsets from the first id after the ranks.
KIMI_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
                 6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
                 11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
                 13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
                 17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]"}
KIMI_RESERVED = 256


def corpus():
    with open(DATA / "corpus.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def training_text():
    """The corpus plus varied prose and code, so that BPE learns merges of every script."""
    base = corpus()
    extra = [
        "The tokenizer splits text into pieces and merges the most frequent pairs of bytes.",
        "Mixture-of-experts models route every token to a few experts out of many.",
        "我们在这里测试中文分词的效果，希望每一个汉字都能被正确处理。",
        "東京は日本の首都です。カタカナとひらがなを混ぜて書きます。",
        "Les élèves étudient la géométrie et l'algèbre à l'école.",
        "import numpy as np\nx = np.arange(10)\nprint(x.sum())\n",
        "1 22 333 4444 55555 666666 7777777",
    ]
    return (base + extra) * 20


def _train(pre_tokenizer, specials, vocab_size, texts=None):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts if texts is not None else training_text(), trainer)
    return tok


def deepseek_like(directory: pathlib.Path, merges_as_strings=False, vocab_size=1500, texts=None) -> Tokenizer:
    directory.mkdir(parents=True, exist_ok=True)
    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DEEPSEEK_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = _train(pre, DEEPSEEK_SPECIALS, vocab_size, texts)
    tok.add_tokens(DEEPSEEK_ADDED)
    tok.save(str(directory / "tokenizer.json"))
    if merges_as_strings:
        spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        spec["model"]["merges"] = [f"{a} {b}" for a, b in spec["model"]["merges"]]
        (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config = {"bos_token": DEEPSEEK_SPECIALS[0], "eos_token": DEEPSEEK_SPECIALS[1],
              "tokenizer_class": "LlamaTokenizerFast",
              "chat_template": (TEMPLATES / "deepseek-v3.jinja").read_text(encoding="utf-8")}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def gpt2_like(directory: pathlib.Path) -> Tokenizer:
    directory.mkdir(parents=True, exist_ok=True)
    tok = _train(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), ["<|endoftext|>"], 800)
    tok.save(str(directory / "tokenizer.json"))
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def kimi_like(directory: pathlib.Path, vocab_size=1200, texts=None) -> tiktoken.Encoding:
    """Writes tiktoken.model + tokenizer_config.json; returns the reference Encoding."""
    directory.mkdir(parents=True, exist_ok=True)
    hf = _train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), [], vocab_size, texts)
    # Ranks in merge order: the trainer numbers tokens as it creates them.
    byte_of_char = {}
    for b, ch in enumerate(_byte_level_chars()):
        byte_of_char[ch] = b
    vocab = sorted(hf.get_vocab().items(), key=lambda kv: kv[1])
    ranks = {}
    for token, _ in vocab:
        ranks[bytes(byte_of_char[c] for c in token)] = len(ranks)
    num_base = len(ranks)
    with open(directory / "tiktoken.model", "w") as f:
        for token, rank in ranks.items():
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    specials = {KIMI_SPECIALS.get(i, f"<|reserved_token_{num_base + i}|>"): num_base + i for i in range(KIMI_RESERVED)}
    config = {
        "added_tokens_decoder": {str(num_base + i): {"content": name, "lstrip": False, "normalized": False,
                                                     "rstrip": False, "single_word": False, "special": True}
                                 for i, name in KIMI_SPECIALS.items()},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "chat_template": (TEMPLATES / "kimi-k2.jinja").read_text(encoding="utf-8"),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return tiktoken.Encoding(name="kimi-like", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def _byte_level_chars():
    """GPT-2's bytes_to_unicode, in byte order."""
    shown = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in shown:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def tokenizers_version():
    import tokenizers
    return tokenizers.__version__


def tiktoken_version():
    return tiktoken.__version__


def variant(source: pathlib.Path, directory: pathlib.Path, ignore_merges=False, odd_pre_tokenizer=False) -> Tokenizer:
    """A copy of the tokenizer in `source` with BPE "ignore_merges" set and/or a pre-tokenizer that
    uses every Split behavior (and invert, String patterns, a prefix space)."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    if odd_pre_tokenizer:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(" ", behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
            pre_tokenizers.Split(Regex(r"[,.]"), behavior="merged_with_next"),
            pre_tokenizers.Split(Regex(r"\t"), behavior="removed"),
            pre_tokenizers.Split(Regex(r"[aeiou]+"), behavior="isolated", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
        ])
    tok.save(str(directory / "tokenizer.json"))
    if ignore_merges:
        spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        spec["model"]["ignore_merges"] = True
        (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return Tokenizer.from_file(str(directory / "tokenizer.json"))
