"""Issue 6, acceptance 1: the official `openai` client against `moeserve serve` on CPU ranks
under single, tp2, ep2, pp2 (and ep2-dp: attention DP): completions and chat, streaming and
not. Greedy and seeded sampled outputs through the server equal `moeserve generate` for the
same prompts under the same plan (token ids for completions, text for both), and streaming
returns exactly what non-streaming does.
"""
import json
import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, detokenize, generate_ids, moeserve_bin, openai_client  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91], [200, 4], [11, 12, 13, 14, 15, 16, 17], [300],
           [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33]]
NEW_TOKENS = 12
CHATS = [[{"role": "user", "content": "Hello!"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]]
PLANS = ["single", "tp2", "ep2", "pp2", "ep2-dp"]


def generate_chat_text(chat, plan):
    """`moeserve generate --chat` text (special tokens printed, the end-of-turn token dropped)."""
    out = subprocess.run([moeserve_bin(), "generate", "--model", MODEL, "--plan", plan, "-n", str(NEW_TOKENS),
                          "--chat", json.dumps(chat)], capture_output=True, check=True).stdout.decode("utf-8")
    return json.loads(out.strip())


@pytest.fixture(scope="module", params=PLANS)
def served(request):
    with Server("--plan", request.param) as server:
        yield request.param, server


def completion(client, prompt, stream, **extra):
    args = dict(model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0,
                extra_body={"return_token_ids": True, **extra})
    if not stream:
        choice = client.completions.create(**args).choices[0]
        return choice.text, choice.model_extra["token_ids"], choice.finish_reason
    text, ids, finish = "", [], None
    for chunk in client.completions.create(stream=True, **args):
        choice = chunk.choices[0]
        text += choice.text
        ids += choice.model_extra.get("token_ids", [])
        finish = choice.finish_reason or finish
    return text, ids, finish


def test_completions_equal_generate(served):
    plan, server = served
    client = openai_client(server)
    expected = generate_ids(PROMPTS, plan=plan, n=NEW_TOKENS)
    # All prompts at once, so that the server batches them.
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        plain = list(pool.map(lambda p: completion(client, p, False), PROMPTS))
        streamed = list(pool.map(lambda p: completion(client, p, True), PROMPTS))
    for prompt, want, got, got_stream in zip(PROMPTS, expected, plain, streamed):
        text, ids, finish = got
        assert ids == want, f"{plan}: prompt {prompt}"
        visible = want[:-1] if finish == "stop" else want
        assert text == detokenize(visible)
        assert finish == ("stop" if len(want) < NEW_TOKENS else "length")
        assert got_stream == got


def test_sampled_completions_equal_generate(served):
    """Sampled rows, batched: drawn from the ranks' reduced candidates (merged over the vocab
    split, per DP replica; rows whose top_p reaches past them fetch their logits), the same
    tokens as `moeserve generate` sampling full logits on the host."""
    plan, server = served
    client = openai_client(server)
    flags = ["--temperature", "0.9", "--top-p", "0.95", "--seed", "7"]
    expected = generate_ids(PROMPTS, plan=plan, n=NEW_TOKENS, extra=flags)
    args = dict(model=MODEL, max_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=7,
                extra_body={"return_token_ids": True})
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: client.completions.create(prompt=p, **args).choices[0], PROMPTS))
    for prompt, want, choice in zip(PROMPTS, expected, got):
        assert choice.model_extra["token_ids"] == want, f"{plan}: prompt {prompt}"


def test_completions_with_a_text_prompt(served):
    _, server = served
    client = openai_client(server)
    response = client.completions.create(model=MODEL, prompt="Hello, world!", max_tokens=NEW_TOKENS, temperature=0,
                                         extra_body={"return_token_ids": True})
    choice = response.choices[0]
    assert choice.model_extra["prompt_token_ids"] == PROMPTS[4]
    assert choice.model_extra["token_ids"] == generate_ids([PROMPTS[4]], plan=served[0], n=NEW_TOKENS)[0]
    assert response.usage.prompt_tokens == len(PROMPTS[4])
    assert response.usage.completion_tokens == len(choice.model_extra["token_ids"])
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_chat_equals_generate(served):
    plan, server = served
    client = openai_client(server)
    for chat in CHATS:
        expected = generate_chat_text(chat, plan)
        args = dict(model=MODEL, messages=chat, max_tokens=NEW_TOKENS, temperature=0,
                    extra_body={"skip_special_tokens": False})
        response = client.chat.completions.create(**args)
        message = response.choices[0].message
        assert message.role == "assistant"
        assert message.content == expected, plan
        assert response.object == "chat.completion"
        assert response.usage.completion_tokens <= NEW_TOKENS
        streamed, finish, roles = "", None, []
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
            if chunk.usage is not None:
                usage = chunk.usage
                continue
            delta = chunk.choices[0].delta
            roles.append(delta.role)
            streamed += delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        assert streamed == expected
        assert roles[0] == "assistant"
        assert finish == response.choices[0].finish_reason
        assert usage.completion_tokens == response.usage.completion_tokens
        assert usage.prompt_tokens == response.usage.prompt_tokens


def test_models_route(served):
    _, server = served
    models = openai_client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
