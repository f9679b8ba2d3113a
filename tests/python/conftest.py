"""Shared fixtures: where the moeserve binary is, and a runner for it."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def moeserve_bin() -> str:
    return os.environ.get("MOESERVE_BIN", str(REPO / "build" / "bin" / "moeserve"))


def run_moeserve(*args, check=True, input=None, timeout=600):
    """Runs `moeserve ARGS...`, returns the CompletedProcess (text mode)."""
    proc = subprocess.run([moeserve_bin(), *map(str, args)], capture_output=True, text=True,
                          input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"moeserve {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def generate_with_logits(model, prompts, logits_path, *flags, new_tokens=8):
    """`moeserve generate` of token-id prompts with --dump-logits and FLAGS: (the greedy ids of
    each prompt, the prompt positions' logits)."""
    args = ["generate", "--model", model, "-n", new_tokens, "--ignore-eos", "--dump-logits", logits_path, *flags]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    out = run_moeserve(*args)
    return [list(map(int, line.split(","))) for line in out.stdout.strip().splitlines()], np.load(logits_path)


@pytest.fixture
def moeserve():
    return run_moeserve
