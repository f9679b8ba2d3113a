#!/usr/bin/env python3
"""Accept length of the speculative algorithms on the default model's held-out text (issue 21):
N prompts of L tokens cut at even offsets of models/default/heldout.txt (never trained on),
greedy, through `moeserve generate` (CPU, fp32); each algorithm's outputs must equal those
without speculation. Prints one line per configuration: accept length (tokens per verify step,
as SGLang's spec_accept_length), drafts accepted / drafted, and tokens per decode step (target
forwards after the prefill, counting the steps where the drafter had nothing to propose).

  python3 scripts/accept_length.py --moeserve build/bin/moeserve [--prompts 16 --prompt-len 64 -n 128]
"""
import argparse
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "default"


def prompts(count, length):
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(MODEL / "tokenizer.json")).encode((MODEL / "heldout.txt").read_text()).ids
    step = (len(ids) - length) // count
    return [ids[i * step:i * step + length] for i in range(count)]


def generate(moeserve, batch, n, spec):
    args = [moeserve, "generate", "--model", str(MODEL), "-n", str(n), "--ignore-eos", *spec]
    for p in batch:
        args += ["--prompt-ids", ",".join(map(str, p))]
    run = subprocess.run(args, capture_output=True, text=True, check=True)
    outputs = run.stdout.strip().splitlines()
    m = re.search(r"(\d+) verify steps, (\d+) of (\d+) drafts accepted, accept_length ([\d.]+)", run.stderr)
    return outputs, m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moeserve", default=str(ROOT / "build" / "bin" / "moeserve"))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("-n", type=int, default=128)
    a = ap.parse_args()
    batch = prompts(a.prompts, a.prompt_len)
    plain, _ = generate(a.moeserve, batch, a.n, [])
    configs = [("NEXTN", s) for s in (1, 2, 3, 4)] + [("NGRAM", s) for s in (2, 4)]
    for algorithm, steps in configs:
        out, m = generate(a.moeserve, batch, a.n,
                          ["--speculative-algorithm", algorithm, "--speculative-num-steps", str(steps)])
        assert out == plain, f"{algorithm} num_steps {steps}: outputs differ from no speculation"
        verify, accepted = int(m.group(1)), int(m.group(2))
        decode_tokens = len(batch) * (a.n - 1)  # the first token of each comes from its prefill
        steps_taken = verify + (decode_tokens - accepted - verify)  # the rest were plain decode steps
        print(f"{algorithm} num_steps {steps}: accept_length {m.group(4)} ({accepted} of {m.group(3)} drafts "
              f"accepted, {verify} verify steps), {decode_tokens / steps_taken:.3f} tokens per decode step; "
              f"outputs equal to no speculation")


if __name__ == "__main__":
    main()
