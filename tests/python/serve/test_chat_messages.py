"""The messages side of /v1/chat/completions as agents send it (the official SDK's shapes):
an assistant turn with `content: null` and `tool_calls`, tool results with `tool_call_id`,
content as a list of text parts, `chat_template_kwargs` (thinking on / off),
`add_generation_prompt` and `continue_final_message`. The prompt the server builds
(prompt_token_ids) must be the tokens of transformers' rendering of the same template."""
import json
import pathlib
import subprocess
import sys

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, moeserve_bin  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
KIMI_THINKING = REPO / "tokenizer" / "chat_templates" / "kimi-k2-thinking.jinja"
DEEPSEEK_V31 = REPO / "tests" / "tokenizer" / "data" / "jinja_corpus" / "deepseek_v31.jinja"

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "{\"temp\": 21}"},
]


def special_tokens():
    """The synthetic tokenizer's bos / eos texts, as its templates see them."""
    probe = pathlib.Path(__file__).with_name("probe_specials.jinja")
    proc = subprocess.run([moeserve_bin(), "chat-template", "--tokenizer", "synthetic", "--chat-template",
                           probe, "--messages", "[]"], capture_output=True, text=True, check=True)
    bos, eos = proc.stdout.split("|")
    return {"bos_token": bos, "eos_token": eos}


def token_ids(text):
    proc = subprocess.run([moeserve_bin(), "tokenize", "--tokenizer", "synthetic", "--text", text, "--allow-special"],
                          capture_output=True, text=True, check=True)
    return [int(t) for t in proc.stdout.strip().split(",") if t]


def reference_ids(template, messages, **kwargs):
    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template.read_text(encoding="utf-8"),
                                        **special_tokens(), **kwargs)
    return token_ids(rendered[0])


def prompt_ids(server, **body):
    status, response = server.request("POST", "/v1/chat/completions",
                                      {"model": MODEL, "max_tokens": 1, "return_token_ids": True, **body})
    assert status == 200, response
    return response["choices"][0]["prompt_token_ids"]


@pytest.fixture(scope="module")
def kimi_server():
    with Server("--chat-template", "kimi-k2-thinking") as s:
        yield s


@pytest.fixture(scope="module")
def thinking_server():
    with Server("--chat-template", DEEPSEEK_V31) as s:
        yield s


def test_tool_round_trip_renders(kimi_server):
    """content: null with tool_calls, then the tool's result: rendered as the template does."""
    got = prompt_ids(kimi_server, messages=ROUND_TRIP, tools=TOOLS)
    assert got == reference_ids(KIMI_THINKING, ROUND_TRIP, tools=TOOLS, add_generation_prompt=True)


def test_text_parts_and_refused_parts(kimi_server):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Look "}, {"type": "text", "text": "here"}]}]
    assert prompt_ids(kimi_server, messages=parts) == reference_ids(KIMI_THINKING, parts, add_generation_prompt=True)
    image = [{"role": "user", "content": [{"type": "text", "text": "Look"},
                                          {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    status, response = kimi_server.request("POST", "/v1/chat/completions", {"model": MODEL, "messages": image})
    assert status == 400 and "messages[0].content[1].type" in response["error"]["message"], response


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_template_kwargs_are_template_variables(thinking_server, thinking):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    got = prompt_ids(thinking_server, messages=messages, chat_template_kwargs={"thinking": thinking})
    assert got == reference_ids(DEEPSEEK_V31, messages, add_generation_prompt=True, thinking=thinking)


def test_generation_prompt_and_continue_final_message(kimi_server):
    messages = [{"role": "user", "content": "Count to three"}, {"role": "assistant", "content": "One, two,"}]
    got = prompt_ids(kimi_server, messages=messages, add_generation_prompt=False, continue_final_message=True)
    assert got == reference_ids(KIMI_THINKING, messages, continue_final_message=True)
    got = prompt_ids(kimi_server, messages=messages[:1], add_generation_prompt=False)
    assert got == reference_ids(KIMI_THINKING, messages[:1], add_generation_prompt=False)
    status, response = kimi_server.request("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "continue_final_message": True, "add_generation_prompt": True})
    assert status == 400 and "continue_final_message" in response["error"]["message"], response
    status, response = kimi_server.request("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "chat_template_kwargs": [1]})
    assert status == 400 and "chat_template_kwargs" in response["error"]["message"], response
