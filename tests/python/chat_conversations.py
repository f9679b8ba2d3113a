"""A fixed-seed generator of chat conversations for the chat-template oracle tests: systems,
multi-turn, tool calls (string and object arguments, several per turn), tool results,
reasoning, list contents of text parts, special-token text, unicode and whitespace edges,
with tools and chat_template_kwargs (thinking on / off) chosen per conversation."""
import json
import random
import string

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city, «quoted» and \"escaped\"",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "days": {"type": "integer", "default": 1},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "scores": {"type": "array", "items": {"type": "number"}},
            "filters": {"type": "object", "properties": {"site": {"type": "string"}, "safe": {"type": "boolean"}},
                        "required": ["site"]}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "now", "description": "The time now", "parameters": {"type": "object", "properties": {}}}},
]

TEXTS = [
    "Hello!", "What is 2+2?", "  padded with spaces  ", "line one\nline two\n\nline four",
    "héllo 你好 😀 ünïcödé", "Think <|im_end|> twice <｜User｜>", "quotes ' and \" and \\ backslash",
    "<think>hidden plan</think>The visible answer.", "Tabs\tand\ttabs", "a", "end with newline\n",
    "Explain {{ not a template }} and {% neither %}", "Number 42, float 3.5, and a list [1, 2]",
    "Once upon a time there was a very long sentence that goes on and on for a while.",
]
REASONING = ["need the tool", "the user wants a number\nso compute it", "  spaced reasoning  "]
KWARGS = [{}, {}, {"enable_thinking": True}, {"enable_thinking": False}, {"thinking": True}, {"thinking": False},
          {"reasoning_effort": "high"}, {"enable_thinking": False, "thinking": False}]


def call_id(rng):
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(9))


def tool_call(rng):
    tool = rng.choice(TOOLS)["function"]
    args = {"city": rng.choice(["Paris", "東京", "New \"York\""]), "days": rng.randint(1, 7)}
    if tool["name"] == "search":
        args = {"query": rng.choice(TEXTS), "tags": ["a", "b"], "filters": {"site": "x.org", "safe": True}}
    if tool["name"] == "now":
        args = {}
    arguments = args if rng.random() < 0.3 else json.dumps(args, ensure_ascii=rng.random() < 0.5)
    return {"id": call_id(rng), "type": "function", "function": {"name": tool["name"], "arguments": arguments}}


def user_content(rng):
    if rng.random() < 0.15:
        return [{"type": "text", "text": rng.choice(TEXTS)}, {"type": "text", "text": rng.choice(TEXTS)}]
    return rng.choice(TEXTS)


def assistant_turn(rng, tool_rate):
    """An assistant reply: text, or tool calls followed by their results and a text answer."""
    turn = []
    reasoning = rng.choice(REASONING) if rng.random() < 0.3 else None
    if rng.random() < tool_rate:
        calls = [tool_call(rng) for _ in range(1 if rng.random() < 0.7 else 2)]
        message = {"role": "assistant", "content": None if rng.random() < 0.7 else "Let me check.", "tool_calls": calls}
        if reasoning:
            message["reasoning_content"] = reasoning
        turn.append(message)
        for call in calls:
            result = {"role": "tool", "tool_call_id": call["id"], "content": rng.choice(['{"temp": 21}', "sunny", "é"])}
            if rng.random() < 0.3:
                result["name"] = call["function"]["name"]
            turn.append(result)
    message = {"role": "assistant", "content": rng.choice(TEXTS)}
    if reasoning and rng.random() < 0.5:
        message["reasoning_content"] = reasoning
    turn.append(message)
    return turn


def conversation(rng):
    """(messages, tools, kwargs, add_generation_prompt, continue_final_message)."""
    tool_rate = rng.choice([0.0, 0.0, 0.5, 0.8])
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(["You are terse.", "Be helpful.\nAlways.", "  S  "])})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": user_content(rng)})
        messages += assistant_turn(rng, tool_rate)
    ending = rng.random()
    if ending < 0.5:
        messages.append({"role": "user", "content": user_content(rng)})
    elif ending < 0.6 and messages[-1].get("tool_calls") is None:
        messages = messages[:-1]  # ends with tool results (or a user message)
    tools = [rng.choice(TOOLS) for _ in range(rng.randint(1, 3))] if tool_rate > 0 and rng.random() < 0.8 else None
    if tools:
        tools = list({t["function"]["name"]: t for t in tools}.values())
    kwargs = rng.choice(KWARGS)
    continue_final = messages[-1]["role"] == "assistant" and isinstance(messages[-1]["content"], str) and \
        rng.random() < 0.3
    add_generation_prompt = not continue_final and rng.random() < 0.7
    return messages, tools, kwargs, add_generation_prompt, continue_final


def conversations(seed, count):
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(count)]
