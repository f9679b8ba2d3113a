"""vLLM's sampling and scoring fields through HTTP, against transformers on a random checkpoint
(fp32 CPU) and against vLLM's formulas written out here in torch.

Scoring: `echo` + `logprobs` + `max_tokens: 0` returns one logprob per prompt token (the first
null) equal to transformers' log-softmax (1e-5 relative to max(1, |logprob|); measured: at most
1.0e-5 absolute on logprobs near -1.8, the two fp32 forwards' own difference), and `prompt_logprobs` the same with vLLM's ranks.
Logit adjustments: `logit_bias`, `presence_penalty`, `frequency_penalty`, `repetition_penalty`
and `min_tokens` change the logits on the device before the draw; each step's reference is
vLLM's sampler on transformers' logits of the same context (bias and min_tokens masks, then
apply_penalties). The logprobs a penalised request reports are of the adjusted logits (vLLM's
"processed" logprobs). Greedy and sampled draws without logprobs (device argmax, device
candidates) must give the tokens of the host draw that reports the logprobs. Stop fields:
`stop_token_ids`, `stop_reason`, `include_stop_str_in_output`, `text_offset` in characters.
Fields that would change the output and are not implemented answer 400 naming the field."""
import pathlib
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "model"))
import server_harness  # noqa: E402
from checkpoints import build_checkpoint  # noqa: E402
from test_eval_ppl import write_byte_tokenizer  # noqa: E402

PROMPT_TEXT = "Hello, world! Th"
PROMPT = []  # its ids under the checkpoint's byte-level tokenizer (one per byte), set by the fixture
SCORE_TOL = 1e-5  # relative to max(1, |logprob|): both forwards are fp32, logits O(10)
ADJUST_TOL = 1e-4


def close(got, want, tol):
    return abs(got - want) <= tol * max(1.0, abs(want))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sampling_fields")
    model = build_checkpoint("no_q_lora_dense1", directory)
    tok = write_byte_tokenizer(directory)
    PROMPT[:] = tok.encode(PROMPT_TEXT, add_special_tokens=False).ids
    assert len(PROMPT) == len(PROMPT_TEXT)
    server_harness.MODEL = str(directory)
    with server_harness.Server() as server:
        yield server, model, str(directory)


def complete(served, **body):
    server, _, name = served
    status, out = server.request("POST", "/v1/completions", {"model": name, **body})
    assert status == 200, out
    return out["choices"][0], out


@torch.no_grad()
def hf_log_softmax(model, ids):
    """transformers' fp32 log-softmax at every position of ids: [len, vocab]."""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)


@torch.no_grad()
def hf_next_logits(model, ids):
    return model(torch.tensor([ids])).logits[0, -1].float()


def vllm_adjust(logits, prompt, output, body):
    """vLLM's sampler on one row: logit_bias and min_tokens (the non-argmax-invariant logits
    processors), then apply_penalties (vllm/model_executor/layers/utils.py)."""
    logits = logits.clone()
    for token, bias in body.get("logit_bias", {}).items():
        logits[int(token)] += bias
    if len(output) < body.get("min_tokens", 0):
        logits[body.get("stop_token_ids", [])] = -float("inf")
    vocab = logits.numel()
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab).float() if output else \
        torch.zeros(vocab)
    prompt_mask = torch.bincount(torch.tensor(prompt), minlength=vocab) > 0
    output_mask = counts > 0
    repetition = torch.where(prompt_mask | output_mask, body.get("repetition_penalty", 1.0), 1.0)
    logits = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits -= body.get("frequency_penalty", 0.0) * counts
    logits -= body.get("presence_penalty", 0.0) * output_mask.float()
    return logits


def test_echo_with_max_tokens_0_scores_the_prompt_as_transformers(served):
    _, model, _ = served
    choice, out = complete(served, prompt=PROMPT, echo=True, logprobs=3, max_tokens=0)
    ref = hf_log_softmax(model, PROMPT)
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(PROMPT) and lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None
    for i in range(1, len(PROMPT)):
        assert close(lp["token_logprobs"][i], ref[i - 1, PROMPT[i]].item(), SCORE_TOL), f"prompt token {i}"
        top = sorted(lp["top_logprobs"][i].values(), reverse=True)  # keyed by text: may collapse (U+FFFD)
        want = torch.topk(ref[i - 1], 3).values.tolist()
        assert all(any(close(t, w, SCORE_TOL) for w in want) for t in top), f"prompt token {i}: {top} vs {want}"
    assert choice["text"] == PROMPT_TEXT
    assert lp["tokens"] == list(PROMPT_TEXT)
    assert lp["text_offset"] == list(range(len(PROMPT)))
    assert choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 0 and out["usage"]["prompt_tokens"] == len(PROMPT)


def test_echo_with_generation_appends_the_output_logprobs(served):
    choice, _ = complete(served, prompt=PROMPT, echo=True, logprobs=1, max_tokens=4, temperature=0,
                         return_token_ids=True)
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(PROMPT) + 4
    plain, _ = complete(served, prompt=PROMPT, logprobs=1, max_tokens=4, temperature=0)
    assert lp["token_logprobs"][len(PROMPT):] == plain["logprobs"]["token_logprobs"]
    shift = len(PROMPT_TEXT)
    assert lp["text_offset"][len(PROMPT):] == [shift + o for o in plain["logprobs"]["text_offset"]]


def test_prompt_logprobs_match_transformers_with_ranks(served):
    _, model, _ = served
    choice, _ = complete(served, prompt=PROMPT, max_tokens=1, prompt_logprobs=2, temperature=0)
    ref = hf_log_softmax(model, PROMPT)
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(PROMPT) and scored[0] is None
    for i in range(1, len(PROMPT)):
        row = ref[i - 1]
        entry = scored[i][str(PROMPT[i])]
        assert close(entry["logprob"], row[PROMPT[i]].item(), SCORE_TOL)
        assert entry["rank"] == 1 + int((row > row[PROMPT[i]]).sum())
        top = torch.topk(row, 2)
        for k in range(2):
            e = scored[i][str(top.indices[k].item())]
            assert e["rank"] == k + 1 and close(e["logprob"], top.values[k].item(), SCORE_TOL)


def test_text_offset_counts_characters_not_bytes(served):
    text = "a\u00e9 \u20acb"  # a, e-acute (2 bytes), space, euro (3 bytes), b
    choice, _ = complete(served, prompt=text, echo=True, logprobs=0, max_tokens=0)
    # A token that completes no character yet starts where the next character will.
    assert choice["logprobs"]["text_offset"] == [0, 1, 1, 2, 3, 3, 3, 4]


ADJUSTMENTS = {
    "logit_bias": {"logit_bias": {"101": 9.0, "32": -100, "111": 4.5}},
    "frequency_penalty": {"frequency_penalty": 1.5},
    "presence_penalty": {"presence_penalty": -1.2},
    "repetition_penalty": {"repetition_penalty": 1.8},
    "repetition_below_one": {"repetition_penalty": 0.6},
    "all_together": {"logit_bias": {"101": 3.0}, "frequency_penalty": 0.5, "presence_penalty": 0.5,
                     "repetition_penalty": 1.3, "min_tokens": 3, "stop_token_ids": [44, 32]},
}
NEW_TOKENS = 6
TOP = 5


def check_against_reference(model, body, choice):
    """Each drawn token's reported logprob and alternatives are vLLM's adjusted distribution's."""
    tokens, logprobs = choice["token_ids"], choice["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(tokens)
    for k, token in enumerate(tokens):
        adjusted = vllm_adjust(hf_next_logits(model, PROMPT + tokens[:k]), PROMPT, tokens[:k], body)
        ref = torch.log_softmax(adjusted.double(), dim=-1)
        assert close(logprobs["token_logprobs"][k], ref[token].item(), ADJUST_TOL), f"step {k}: token {token}"
        # Keyed by token text: bytes that are no character alone all read U+FFFD and collapse
        # (the last one written stays), so each value is one of the top ones.
        got = sorted(logprobs["top_logprobs"][k].values(), reverse=True)
        want = torch.topk(ref, TOP).values.tolist()
        assert all(any(close(g, w, ADJUST_TOL) for w in want) for g in got), f"step {k}: {got} vs {want}"


@pytest.mark.parametrize("name", list(ADJUSTMENTS))
def test_logit_adjustments_follow_vllms_formulas(served, name):
    _, model, _ = served
    body = ADJUSTMENTS[name]
    greedy, _ = complete(served, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, logprobs=TOP,
                         return_token_ids=True, ignore_eos=True, **body)
    tokens = greedy["token_ids"]
    assert len(tokens) >= body.get("min_tokens", 1)
    check_against_reference(model, body, greedy)
    for k, token in enumerate(tokens):  # greedy: the adjusted argmax
        adjusted = vllm_adjust(hf_next_logits(model, PROMPT + tokens[:k]), PROMPT, tokens[:k], body)
        top2 = torch.topk(adjusted, 2).values
        if top2[0] - top2[1] > 1e-3:
            assert token == int(adjusted.argmax()), f"step {k}"
    # The device argmax (no logprobs) sees the same adjusted logits.
    device, _ = complete(served, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, return_token_ids=True,
                         ignore_eos=True, **body)
    assert device["token_ids"] == tokens
    # Sampled: the host draw (with logprobs) against the reference, the device candidates' draw equal to it.
    sampled_args = dict(prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=1.0, seed=7, return_token_ids=True,
                        ignore_eos=True, **body)
    host, _ = complete(served, logprobs=TOP, **sampled_args)
    check_against_reference(model, body, host)
    on_device, _ = complete(served, **sampled_args)
    assert on_device["token_ids"] == host["token_ids"]


def test_adjustments_change_the_output(served):
    plain, _ = complete(served, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, return_token_ids=True)
    biased, _ = complete(served, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, return_token_ids=True,
                         logit_bias={"200": 100})
    assert biased["token_ids"] == [200] * NEW_TOKENS and plain["token_ids"] != biased["token_ids"]


def test_min_tokens_masks_stop_token_ids_until_reached(served):
    first, _ = complete(served, prompt=PROMPT, max_tokens=1, temperature=0, return_token_ids=True)
    stop = first["token_ids"][0]
    stopped, _ = complete(served, prompt=PROMPT, max_tokens=8, temperature=0, return_token_ids=True,
                          stop_token_ids=[stop])
    assert stopped["token_ids"] == [stop] and stopped["finish_reason"] == "stop"
    assert stopped["stop_reason"] == stop
    held, _ = complete(served, prompt=PROMPT, max_tokens=8, temperature=0, return_token_ids=True,
                       stop_token_ids=[stop], min_tokens=3)
    assert len(held["token_ids"]) >= 3 and stop not in held["token_ids"][:3]


def test_stop_strings_stop_reason_and_include_stop_str_in_output(served):
    body = dict(prompt=PROMPT, max_tokens=12, temperature=0)
    plain, _ = complete(served, **body)
    text = plain["text"]
    assert plain["stop_reason"] is None and plain["finish_reason"] == "length"
    # A character of the output past its first (so the cut leaves text before it).
    stop = next(c for c in text[1:] if c != "\ufffd")
    before = text[:text.index(stop)]
    stopped, _ = complete(served, stop=[stop], **body)
    assert stopped["text"] == before and stopped["stop_reason"] == stop and stopped["finish_reason"] == "stop"
    kept, _ = complete(served, stop=[stop], include_stop_str_in_output=True, **body)
    assert kept["text"] == before + stop and kept["stop_reason"] == stop


@pytest.mark.parametrize("field,value", [
    ("logit_bias", {"x": 1}), ("logit_bias", {"999": 1}), ("logit_bias", {"5": 101}),
    ("repetition_penalty", 0), ("frequency_penalty", 3), ("min_tokens", 20), ("prompt_logprobs", 21),
    ("use_beam_search", True), ("allowed_token_ids", [1, 2]), ("bad_words", ["x"]), ("truncate_prompt_tokens", 4),
    ("spaces_between_special_tokens", False), ("return_tokens_as_token_ids", True), ("length_penalty", 0.5),
    ("max_tokens", 0),
])
def test_unsupported_or_invalid_fields_answer_400_naming_them(served, field, value):
    server, _, name = served
    body = {"model": name, "prompt": PROMPT, "max_tokens": 8, field: value}
    status, out = server.request("POST", "/v1/completions", body)
    assert status == 400, out
    assert out["error"]["param"] == field, out


def test_chat_refusals_name_the_field(served):
    server, _, name = served
    for body, field in [({"echo": True}, "echo"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                         "messages")]:
        request = {"model": name, "messages": [{"role": "user", "content": "hi"}], **body}
        status, out = server.request("POST", "/v1/chat/completions", request)
        assert status == 400 and out["error"]["param"] == field, out


def test_draws_past_the_tokenizer_give_no_text_and_the_server_serves_on(tmp_path):
    """A model's vocabulary padded past its tokenizer's (DeepSeek-V3: 129280 ids over a 128815-token
    tokenizer): a draw there, forced here by logit_bias, decodes to nothing as in Hugging Face's
    decode, and fails neither the request nor the engine (it used to stop the engine loop)."""
    from checkpoints import make_model_from
    make_model_from({"vocab_size": 320}, 5).save_pretrained(tmp_path, safe_serialization=True)
    write_byte_tokenizer(tmp_path)
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    name = str(tmp_path)
    with server_harness.Server("--chat-template", str(template), model=name) as server:
        body = {"model": name, "prompt": [104, 105], "max_tokens": 3, "temperature": 0, "logit_bias": {"300": 100},
                "logprobs": 2, "return_token_ids": True}
        status, out = server.request("POST", "/v1/completions", body)
        assert status == 200, out
        choice = out["choices"][0]
        assert choice["token_ids"] == [300, 300, 300] and choice["text"] == "", choice
        assert choice["logprobs"]["tokens"] == ["", "", ""], choice["logprobs"]
        status, text = server.request("POST", "/v1/completions", {**body, "stream": True})
        assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
        status, out = server.request("POST", "/v1/chat/completions", {
            "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "logit_bias": {"301": 100}, "logprobs": True, "top_logprobs": 2})
        assert status == 200, out
        assert out["choices"][0]["logprobs"]["content"][0]["bytes"] == [], out["choices"][0]["logprobs"]
        del body["logit_bias"]
        status, out = server.request("POST", "/v1/completions", body)
        assert status == 200 and len(out["choices"][0]["token_ids"]) == 3, out
