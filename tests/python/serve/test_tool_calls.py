"""Issue 24, acceptance 2 (tools and reasoning): the official `openai` client against `moeserve
serve` with --tool-call-parser and --reasoning-parser: a full tool round trip, streamed and not;
32 concurrent streaming tool-call requests, each its own calls; reasoning_content apart from the
content, streamed and not, also when Kimi opens its tool calls without closing its thinking;
malformed output ending as content with a clear finish_reason.

No test model can write these formats (the synthetic and default models emit noise), so the
server is started with the hidden test flag --test-scripted-output and each request carries
`moeserve_test_script`: the text the model is made to emit. The server tokenizes it as the
tokenizer splits it (special tokens as the single tokens they are) and streams those tokens in
place of the model's own through the real output path: the detokenizer (which must not skip the
formats' special tokens), stop tokens, the parsers, SSE. This is the least invasive hook: one
line in the engine loop replaces a drawn token, nothing in the runtime or the model changes, and
the script is per request, so concurrent requests each follow their own.

Formats: Kimi K2 on synthetic:tiny (its built-in tokenizer has Kimi's tool-call and <think>
tokens as special tokens, ids 264..270; template kimi-k2-thinking), DeepSeek V3 on the shipped default
model (a DeepSeek V3 tokenizer with its tool-call special tokens; template deepseek-v3). The
format sources are in tests/chatout/tool_parsers_test.cc.
"""
import json
import pathlib
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, openai_client  # noqa: E402

KIMI_SECTION_BEGIN_ID = 264  # the built-in tokenizer's <|tool_calls_section_begin|>
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def kimi_calls(*calls):
    """Kimi K2's tool-call section for [(id, arguments JSON text)]."""
    body = "".join(f"<|tool_call_begin|>{cid}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
                   for cid, args in calls)
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def v3_call(name, args):
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


@pytest.fixture(scope="module")
def kimi():
    # The thinking template: the instruct one does not print an assistant turn's tool calls back.
    with Server("--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2", "--test-scripted-output",
                "--chat-template", "kimi-k2-thinking") as s:
        yield s


@pytest.fixture(scope="module")
def deepseek():
    with Server("--tool-call-parser", "deepseek_v3", "--reasoning-parser", "deepseek_r1", "--test-scripted-output",
                model=None) as s:
        yield s


def chat(client, messages, script, stream, model=MODEL, **extra):
    """(message dict, finish_reason, completion token ids) of one chat request, streamed or not; a
    streamed one is put together from its deltas as a client would."""
    args = dict(model=model, messages=messages, max_tokens=extra.pop("max_tokens", 400), temperature=0,
                extra_body={"moeserve_test_script": script, "return_token_ids": True}, **extra)
    if not stream:
        choice = client.chat.completions.create(**args).choices[0]
        message = choice.message
        calls = [{"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments}
                 for c in message.tool_calls or []]
        return ({"content": message.content, "reasoning": (message.model_extra or {}).get("reasoning_content"),
                 "tool_calls": calls}, choice.finish_reason, choice.model_extra["token_ids"])
    content, reasoning, calls, finish, ids = "", "", {}, None, []
    for chunk in client.chat.completions.create(stream=True, **args):
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "type": None, "name": None, "arguments": ""})
            if piece.id:
                assert call["id"] is None, "a call's id comes on its first piece only"
                call.update(id=piece.id, type=piece.type, name=piece.function.name)
            call["arguments"] += piece.function.arguments or ""
        ids += choice.model_extra.get("token_ids", [])
        finish = choice.finish_reason or finish
    assert sorted(calls) == list(range(len(calls))), calls
    return ({"content": content or None, "reasoning": reasoning or None,
             "tool_calls": [calls[i] for i in sorted(calls)]}, finish, ids)


def assistant_turn(message):
    """The assistant message the SDK user sends back: content null with the calls."""
    return {"role": "assistant", "content": message["content"],
            "tool_calls": [{"id": c["id"], "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]}}
                           for c in message["tool_calls"]]}


def prompt_text(server, messages, model=MODEL):
    """The rendered prompt the server ran for these messages (decoded from its prompt token ids)."""
    status, body = server.request("POST", "/v1/chat/completions", {
        "model": model, "messages": messages, "max_tokens": 1, "return_token_ids": True, "tools": [WEATHER]})
    assert status == 200, body
    status, text = server.request("POST", "/v1/completions", {
        "model": model, "prompt": body["choices"][0]["prompt_token_ids"], "max_tokens": 1, "echo": True,
        "skip_special_tokens": False})
    assert status == 200, text
    return text["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_kimi_round_trip(kimi, stream):
    client = openai_client(kimi)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    script = "<think>I need the weather.</think>" + kimi_calls(("functions.get_weather:0", '{"city": "Paris"}'))
    message, finish, ids = chat(client, messages, script + "<|im_end|>", stream, tools=[WEATHER])
    assert KIMI_SECTION_BEGIN_ID in ids  # the section marker came as its special token and still reached the parser
    assert finish == "tool_calls"
    assert message["reasoning"] == "I need the weather."
    assert message["content"] is None
    assert message["tool_calls"] == [{"id": "functions.get_weather:0", "type": "function", "name": "get_weather",
                                      "arguments": '{"city": "Paris"}'}]
    messages += [assistant_turn(message),
                 {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C, clear"}]
    rendered = prompt_text(kimi, messages)
    assert "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}" in rendered
    assert "18 C, clear" in rendered
    answer, finish, _ = chat(client, messages, "<think>It is clear.</think>It is 18 C and clear in Paris.<|im_end|>",
                             stream, tools=[WEATHER])
    assert finish == "stop"
    assert answer == {"content": "It is 18 C and clear in Paris.", "reasoning": "It is clear.", "tool_calls": []}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_deepseek_v3_round_trip(deepseek, stream):
    client = openai_client(deepseek)
    messages = [{"role": "user", "content": "Weather in Oslo and the time?"}]
    script = ("Checking both.</think>Let me look.<｜tool▁calls▁begin｜>" + v3_call("get_weather", '{"city": "Oslo"}') +
              "\n" + v3_call("get_time", "{}") + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>")
    message, finish, _ = chat(client, messages, script, stream, model="default", tools=[WEATHER, TIME])
    assert finish == "tool_calls"
    assert message["reasoning"] == "Checking both."  # R1's template opens <think> in the prompt
    assert message["content"] == "Let me look."
    assert [(c["name"], c["arguments"]) for c in message["tool_calls"]] == [("get_weather", '{"city": "Oslo"}'),
                                                                          ("get_time", "{}")]
    ids = [c["id"] for c in message["tool_calls"]]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    messages += [assistant_turn(message), {"role": "tool", "tool_call_id": ids[0], "content": "-3 C"},
                 {"role": "tool", "tool_call_id": ids[1], "content": "09:00"}]
    answer, finish, _ = chat(client, messages, "Fine.</think>-3 C at 09:00.<｜end▁of▁sentence｜>", stream,
                             model="default", tools=[WEATHER, TIME])
    assert (answer, finish) == ({"content": "-3 C at 09:00.", "reasoning": "Fine.", "tool_calls": []}, "stop")


def test_32_concurrent_streaming_tool_calls(kimi):
    """Each request its own calls (different counts, names and long arguments): every response
    must carry exactly its own, whole (vLLM #54701 lost them under concurrency)."""
    rng = random.Random(24)
    cases = [[(f"functions.get_weather:{k + j}",
               json.dumps({"city": f"city-{k}-{j}", "note": "".join(rng.choice("abc xyz") for _ in range(8 * k))}))
              for j in range(1 + k % 3)] for k in range(32)]

    def run(k):
        message, finish, _ = chat(openai_client(kimi), [{"role": "user", "content": f"request {k}"}],
                                  kimi_calls(*cases[k]) + "<|im_end|>", True, tools=[WEATHER], max_tokens=1200)
        return message, finish

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(run, range(32)))
    for k, (message, finish) in enumerate(results):
        assert finish == "tool_calls", (k, message)
        assert [(c["id"], c["name"], c["arguments"]) for c in message["tool_calls"]] == \
            [(cid, "get_weather", args) for cid, args in cases[k]], k


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_separated(kimi, stream):
    client = openai_client(kimi)
    message, finish, _ = chat(client, [{"role": "user", "content": "hi"}],
                              "<think>The user greets me.\nBe kind.</think>Hello there!<|im_end|>", stream)
    assert (message, finish) == ({"content": "Hello there!", "reasoning": "The user greets me.\nBe kind.",
                                  "tool_calls": []}, "stop")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_missing_think_close_before_tool_calls(kimi, stream):
    """vLLM PR #32216: Kimi opens the tool-call section without </think>; the call must not leak
    into the reasoning."""
    script = "<think>Look it up." + kimi_calls(("functions.get_weather:3", '{"city": "Rome"}')) + "<|im_end|>"
    message, finish, _ = chat(openai_client(kimi), [{"role": "user", "content": "Rome?"}], script, stream,
                              tools=[WEATHER])
    assert finish == "tool_calls"
    assert message["reasoning"] == "Look it up."
    assert message["content"] is None
    assert [(c["id"], c["arguments"]) for c in message["tool_calls"]] == [("functions.get_weather:3",
                                                                            '{"city": "Rome"}')]


MALFORMED = [
    # (name, script, max_tokens, expected content, finish_reason)
    ("invalid JSON arguments", kimi_calls(("functions.get_weather:0", '{"city": Par')) + "<|im_end|>", 400,
     '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": Par<|tool_call_end|>', "stop"),
    ("unknown tool", kimi_calls(("functions.delete_all:0", "{}")) + "<|im_end|>", 400,
     "<|tool_call_begin|>functions.delete_all:0<|tool_call_argument_begin|>{}<|tool_call_end|>", "stop"),
    ("unclosed at the length limit", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
     '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}', 30,
     None, "length"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name,script,max_tokens,content,finish", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_output_ends_as_content(kimi, stream, name, script, max_tokens, content, finish):
    message, got_finish, ids = chat(openai_client(kimi), [{"role": "user", "content": "x"}], "<think>t</think>" + script,
                                    stream, tools=[WEATHER], max_tokens=max_tokens)
    assert got_finish == finish
    if content is None:  # cut by the length limit: what was emitted of the call, as content
        assert len(ids) == max_tokens
        assert message["content"].startswith("<|tool_call_begin|>functions.get_weather:0"), message
        assert "<|tool_call_argument_begin|>" in message["content"]
    else:
        assert message["content"] == content
    if not stream or name == "unknown tool":
        assert message["tool_calls"] == []
    else:  # streamed, the call's first pieces went out before it turned out malformed: finish_reason says so
        assert [c["name"] for c in message["tool_calls"]] == ["get_weather"]


def test_tool_choice_none_returns_the_text(kimi):
    script = kimi_calls(("functions.get_weather:0", '{"city": "Paris"}')) + "<|im_end|>"
    message, finish, _ = chat(openai_client(kimi), [{"role": "user", "content": "x"}], "<think>t</think>" + script,
                              False, tools=[WEATHER], tool_choice="none")
    assert (message["content"], message["tool_calls"], finish) == (script.replace("<|im_end|>", ""), [], "stop")


def test_parallel_tool_calls_false_keeps_the_first(kimi):
    script = kimi_calls(("functions.get_weather:0", '{"city": "A"}'), ("functions.get_weather:1", '{"city": "B"}'))
    for stream in (False, True):
        message, finish, _ = chat(openai_client(kimi), [{"role": "user", "content": "x"}], script + "<|im_end|>",
                                  stream, tools=[WEATHER], parallel_tool_calls=False)
        assert finish == "tool_calls"
        assert [c["arguments"] for c in message["tool_calls"]] == ['{"city": "A"}']


ZONE = {"type": "function", "function": {"name": "get_zone", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}
HOUR = {"type": "function", "function": {"name": "set_hour", "parameters": {
    "type": "object", "properties": {"h": {"type": "integer", "minimum": 0, "maximum": 23}}, "required": ["h"],
    "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_zone"}}],
                         ids=["required", "named"])
def test_constrained_tool_choices_make_the_model_call(kimi, choice, stream):
    # No script: synthetic:tiny's random weights, drawn under the grammar of one Kimi call
    # (grammar/tool_call_grammar.h; tests/python/serve/test_tool_choice.py has the default model).
    allowed = ["get_zone", "set_hour"] if choice == "required" else ["get_zone"]
    for prompt in ("x", "what time is it", "zone?", "hello there"):
        message, finish, _ = chat(openai_client(kimi), [{"role": "user", "content": prompt}], None, stream,
                                  tools=[HOUR, ZONE], tool_choice=choice)
        assert finish == "tool_calls", message
        calls = message["tool_calls"]
        assert len(calls) == 1 and calls[0]["name"] in allowed, message
        arguments = json.loads(calls[0]["arguments"])
        if calls[0]["name"] == "get_zone":
            assert arguments == {"zone": arguments["zone"]} and arguments["zone"] in ("utc", "cet"), message
        else:
            assert list(arguments) == ["h"] and 0 <= arguments["h"] <= 23, message


def test_script_needs_the_test_flag():
    with Server() as server:
        status, body = server.request("POST", "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "moeserve_test_script": "hi"})
    assert status == 400 and body["error"]["param"] == "moeserve_test_script", body
