#!/usr/bin/env python3
"""Encode throughput of moeserve's tokenizers beside Hugging Face `tokenizers` and `tiktoken`,
single-threaded, same text, same run.

Builds a text file (Python standard-library sources for code and English, plus the multilingual
test corpus), trains a DeepSeek-V3-style byte-level BPE (tokenizer.json) and a Kimi-style
tiktoken ranks file on it, then times `moeserve bench-tokenizer` and the reference libraries on
the whole file (best of --repeat runs) and checks that all agree on the token count.

  python3 scripts/bench_tokenizer.py [--moeserve build/bin/moeserve] [--megabytes 8]
"""
import argparse
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import tokenizer_oracle as oracle  # noqa: E402


def build_text(megabytes):
    """Standard-library sources (code, comments, docstrings) interleaved with the multilingual corpus."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    corpus = "\n".join(oracle.corpus())
    parts, size = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace").replace("\ufffd", "?")
        parts += [text, corpus]
        size += len(text.encode()) + len(corpus.encode())
        if size >= megabytes * 1e6:
            break
    return "\n".join(parts)


def best_seconds(fn, repeat):
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    return best, result


def moeserve_bench(binary, tokenizer_dir, text_file, repeat):
    out = subprocess.run([binary, "bench-tokenizer", "--tokenizer", str(tokenizer_dir), "--file", str(text_file),
                          "--repeat", str(repeat)], check=True, capture_output=True, text=True).stdout
    fields = dict(item.split("=") for item in out.split())
    return float(fields["best_seconds"]), int(fields["tokens"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moeserve", default=os.environ.get("MOESERVE_BIN", str(REPO / "build" / "bin" / "moeserve")))
    parser.add_argument("--megabytes", type=float, default=8.0, help="size of the benchmark text")
    parser.add_argument("--vocab-size", type=int, default=32000, help="BPE vocabulary to train")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        text = build_text(args.megabytes)
        text_file = tmp / "bench.txt"
        text_file.write_text(text, encoding="utf-8")
        n_bytes = len(text.encode())
        training = text.splitlines()
        hf = oracle.deepseek_like(tmp / "deepseek", vocab_size=args.vocab_size, texts=training)
        hf.encode_special_tokens = True  # special-token text stays text, as in bench-tokenizer
        enc = oracle.kimi_like(tmp / "kimi", vocab_size=args.vocab_size, texts=training)
        rows = []
        ours_s, ours_n = moeserve_bench(args.moeserve, tmp / "deepseek", text_file, args.repeat)
        hf_s, hf_ids = best_seconds(lambda: hf.encode(text, add_special_tokens=False).ids, args.repeat)
        assert ours_n == len(hf_ids), f"token counts differ: moeserve {ours_n}, tokenizers {len(hf_ids)}"
        rows += [("tokenizer.json (DeepSeek-V3 style)", "moeserve", ours_s, ours_n),
                 ("tokenizer.json (DeepSeek-V3 style)", f"HF tokenizers {oracle.tokenizers_version()}", hf_s, len(hf_ids))]
        ours_s, ours_n = moeserve_bench(args.moeserve, tmp / "kimi", text_file, args.repeat)
        tt_s, tt_ids = best_seconds(lambda: enc.encode_ordinary(text), args.repeat)
        assert ours_n == len(tt_ids), f"token counts differ: moeserve {ours_n}, tiktoken {len(tt_ids)}"
        rows += [("tiktoken.model (Kimi K2 style)", "moeserve", ours_s, ours_n),
                 ("tiktoken.model (Kimi K2 style)", f"tiktoken {oracle.tiktoken_version()}", tt_s, len(tt_ids))]

    print(f"text: {n_bytes / 1e6:.2f} MB, vocab {args.vocab_size}, best of {args.repeat}, one thread")
    print(f"| format | encoder | MB/s | tokens |")
    print(f"|---|---|---|---|")
    for fmt, who, seconds, tokens in rows:
        print(f"| {fmt} | {who} | {n_bytes / 1e6 / seconds:.2f} | {tokens} |")


if __name__ == "__main__":
    main()
