"""Exactness of the CPU forward against transformers' DeepseekV3ForCausalLM (fp32).

For every config in checkpoints.CONFIGS: logits of a batch of prompts of different lengths
(max |diff| / max |logit| <= 1e-4, same argmax at every position) and 32 greedy tokens
identical to transformers' generate() with its KV cache.
"""
import sys
import pathlib

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from checkpoints import CONFIGS, build_checkpoint  # noqa: E402
from conftest import run_moeserve  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91], [200, 4], [11, 12, 13, 14, 15, 16, 17]]
GREEDY_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model = build_checkpoint(request.param, directory)
    return request.param, directory, model


def test_logits_and_greedy_match_transformers(checkpoint, tmp_path):
    name, directory, model = checkpoint
    logits_path = tmp_path / "logits.npy"
    args = ["generate", "--model", directory, "-n", GREEDY_TOKENS, "--ignore-eos", "--dump-logits", logits_path]
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    out = run_moeserve(*args)
    ours = np.load(logits_path)
    generated = [list(map(int, line.split(","))) for line in out.stdout.strip().splitlines()]
    assert len(generated) == len(PROMPTS)

    offset = 0
    for prompt, tokens in zip(PROMPTS, generated):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            ref = model(ids).logits[0].numpy()
        mine = ours[offset:offset + len(prompt)]
        offset += len(prompt)
        rel = np.abs(mine - ref).max() / np.abs(ref).max()
        assert rel <= 1e-4, f"{name}: max |logit diff| / max |logit| = {rel:.3g}"
        assert (mine.argmax(-1) == ref.argmax(-1)).all(), f"{name}: argmax differs"

        with torch.no_grad():
            ref_gen = model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False, use_cache=True,
                                     eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert tokens == ref_gen, f"{name}: greedy tokens differ\nours {tokens}\nref  {ref_gen}"
    assert offset == ours.shape[0]
