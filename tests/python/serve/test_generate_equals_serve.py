"""One generation path: `moeserve generate` and `moeserve serve` run the same scheduler and step
loop (runtime/step_loop.h), so under every plan preset of up to 4 ranks they give the same
tokens and the same logprobs for the same requests, greedy and seeded sampling. Both run with
--batch-invariant: each row's logits are then independent of the batch it ran in, so the
server's batches (padded, one request at a time here) need not match generate's (all prompts
in one batch).
"""
import json
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, openai_client, run_moeserve  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64], [200, 4], [11, 12, 13, 14, 15]]
NEW_TOKENS = 6
TOP = 2
SAMPLINGS = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.9, top_p=0.95, seed=7),
}


def plans_up_to_4_ranks():
    names = run_moeserve("plan", "list").stdout.split()
    plans = []
    for name in names:
        show = run_moeserve("plan", "show", name, "--model", MODEL, check=False).stdout
        match = re.search(r"world (\d+)", show)
        if match and int(match.group(1)) <= 4:
            plans.append(name)
    return plans


PLANS = plans_up_to_4_ranks()


def generate(plan, sampling):
    """Per prompt: (tokens, logprobs) from `moeserve generate --logprobs`."""
    args = ["generate", "--model", MODEL, "--plan", plan, "-n", NEW_TOKENS, "--ignore-eos", "--batch-invariant",
            "--logprobs", TOP]
    for flag, value in sampling.items():
        args += ["--" + flag.replace("_", "-"), value]
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    lines = [json.loads(line) for line in run_moeserve(*args).stdout.strip().splitlines()]
    return [(line["tokens"], line["logprobs"]) for line in lines]


@pytest.fixture(scope="module", params=PLANS)
def served(request):
    with Server("--plan", request.param, "--batch-invariant") as server:
        yield request.param, server


@pytest.mark.parametrize("mode", SAMPLINGS)
def test_generate_equals_serve(served, mode):
    plan, server = served
    sampling = SAMPLINGS[mode]
    expected = generate(plan, sampling)
    client = openai_client(server)
    for prompt, (tokens, logprobs) in zip(PROMPTS, expected):
        choice = client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS, logprobs=TOP,
                                           extra_body={"return_token_ids": True, "ignore_eos": True},
                                           **sampling).choices[0]
        assert choice.model_extra["token_ids"] == tokens, f"{plan} {mode}: prompt {prompt}"
        assert choice.logprobs.token_logprobs == pytest.approx(logprobs, abs=1e-5), f"{plan} {mode}: prompt {prompt}"
