"""scripts/train_default_model.py is reproducible: two short runs with the same seed (tiny
config, CPU, deterministic mode) write bit-identical weights, and a run with another seed does
not (so the comparison can fail). The GPU side of the same property is checked by
scripts/default_model/train_twice_gpu.sh (two runs on one H200, see models/default/README.md)."""
import hashlib
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = ROOT / "models" / "default"
TEMPLATE = ROOT / "tokenizer" / "chat_templates" / "deepseek-v3.jinja"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small folder in prepare_data.py's layout: the default model's tokenizer, training
    tokens from its held-out text (any text serves a determinism test), a held-out slice."""
    from tokenizers import Tokenizer
    folder = tmp_path_factory.mktemp("data")
    text = (MODEL / "heldout.txt").read_text(encoding="utf-8")
    ids = Tokenizer.from_file(str(MODEL / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    np.save(folder / "train_tokens.npy", np.array(ids, dtype=np.uint16))
    (folder / "heldout.txt").write_text(text[:2000], encoding="utf-8")
    (folder / "tokenizer.json").write_bytes((MODEL / "tokenizer.json").read_bytes())
    summary = {"train_tokens": len(ids), "heldout_pydoc": ["a"], "heldout_books": ["b"]}
    (folder / "data_summary.json").write_text(json.dumps(summary))
    return folder


def train(data, out, seed):
    """One short run; returns (SHA-256 of model.safetensors, the log's loss lines)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "train_default_model.py"), "--data", str(data),
           "--chat-template", str(TEMPLATE), "--out", str(out), "--tiny", "--device", "cpu",
           "--steps", "3", "--batch", "2", "--seq", "32", "--warmup", "1", "--log-every", "1",
           "--eval-every", "2", "--eval-tokens", "200", "--seed", str(seed), "--deterministic", "strict"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    # The losses and validation perplexities, without the log's clock.
    losses = [re.sub(r" elapsed \d+s", "", line.split("] ", 1)[1])
              for line in (out / "train_log.txt").read_text().splitlines() if " loss " in line or "validation ppl" in line]
    assert len(losses) >= 3, losses
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(), losses


def test_two_runs_write_identical_weights(data, tmp_path):
    first, first_losses = train(data, tmp_path / "a", seed=20)
    second, second_losses = train(data, tmp_path / "b", seed=20)
    assert second_losses == first_losses
    assert second == first, "two runs with one seed wrote different weights"
    other, _ = train(data, tmp_path / "c", seed=21)
    assert other != first, "another seed wrote the same weights: the runs ignore the seed"
