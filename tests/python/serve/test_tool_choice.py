"""Issue 24: tool_choice "required" and a named function constrain decoding (grammar/tool_call_grammar.h),
through the official `openai` client on the shipped default model (a DeepSeek V3 tokenizer with its
tool-call special tokens; `--tool-call-parser deepseek_v3`). The model's own tokens are drawn (no
scripted output): whatever it would have written, the answer is one call of an allowed tool (the
named one) whose arguments validate against that tool's parameters (the `jsonschema` package is
the oracle), with finish_reason "tool_calls", streamed and not, greedy and sampled; the tool result
sent back gets an answer. Choices that cannot be honoured are a 400 naming tool_choice.
The parameter schemas bound their strings and numbers, so a 300-token budget always closes a call."""
import json
import pathlib
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import Server, openai_client  # noqa: E402

MODEL = "default"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
                                                                         "maximum": 999},
                                                                   "y": {"type": "integer", "minimum": 0,
                                                                         "maximum": 999}},
                                  "required": ["x", "y"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PROMPTS = ["What is the weather in Paris?", "Add two and three.", "Tell me a story.", "hello"]


@pytest.fixture(scope="module")
def server():
    with Server("--tool-call-parser", "deepseek_v3", "--max-running-requests", 16, model=None) as s:
        yield s


def call_once(client, prompt, choice, stream, temperature, seed):
    """(finish_reason, [(name, arguments text)], content) of one chat request."""
    args = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], tools=TOOLS, tool_choice=choice,
                max_tokens=300, temperature=temperature, seed=seed)
    if not stream:
        choice_out = client.chat.completions.create(**args).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice_out.message.tool_calls or []]
        return choice_out.finish_reason, calls, choice_out.message.content
    calls, finish, content = {}, None, ""
    for chunk in client.chat.completions.create(stream=True, **args):
        c = chunk.choices[0]
        content += c.delta.content or ""
        for piece in c.delta.tool_calls or []:
            call = calls.setdefault(piece.index, ["", ""])
            if piece.function.name:
                call[0] = piece.function.name
            call[1] += piece.function.arguments or ""
        finish = c.finish_reason or finish
    return finish, [tuple(calls[i]) for i in sorted(calls)], content or None


def check_call(result, allowed):
    finish, calls, content = result
    assert finish == "tool_calls", result
    assert len(calls) == 1, result
    name, arguments = calls[0]
    assert name in allowed, result
    jsonschema.validate(json.loads(arguments), PARAMETERS[name])
    assert not content, result  # the whole output is the call
    return name


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_always_calls_a_tool_with_valid_arguments(server, stream):
    client = openai_client(server)
    jobs = [(PROMPTS[i % len(PROMPTS)], 0 if i % 2 else 0.9, i) for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda j: call_once(client, j[0], "required", stream, j[1], j[2]), jobs))
    for r in results:
        check_call(r, {"get_weather", "add"})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_named_choice_calls_that_tool(server, stream):
    client = openai_client(server)
    for name in ("get_weather", "add"):
        choice = {"type": "function", "function": {"name": name}}
        for i, prompt in enumerate(PROMPTS):
            assert check_call(call_once(client, prompt, choice, stream, 0.7, i), {name}) == name


def test_round_trip_after_a_required_call(server):
    client = openai_client(server)
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
                                           max_tokens=300, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": call.id, "type": "function",
                                  "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            max_tokens=16, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content
    assert not answer.choices[0].message.tool_calls


@pytest.mark.parametrize("body,needle", [
    ({"tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": 7}, "expected"),
], ids=["no tools", "unknown name", "with response_format", "not a choice"])
def test_choices_that_cannot_be_honoured_are_refused(server, body, needle):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                      max_tokens=4, extra_body=body)
    assert e.value.body["param"] == "tool_choice", e.value.body
    assert needle in e.value.body["message"], e.value.body


def test_required_needs_a_tool_call_parser():
    with Server(model=None) as server:
        with pytest.raises(openai.BadRequestError) as e:
            openai_client(server).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="required",
                max_tokens=4)
    assert e.value.body["param"] == "tool_choice" and "--tool-call-parser" in e.value.body["message"]
