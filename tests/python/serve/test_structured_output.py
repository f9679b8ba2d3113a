"""Structured output (issue 24): response_format json_schema / json_object through the official
`openai` client on the default model (models/default, `moeserve serve` without --model), decoded
under xgrammar's token mask. 200 requests with random schemas from a fixed-seed generator: every
output parses and validates against its schema (the `jsonschema` package is the oracle) and ends
with finish_reason "stop"; json_object outputs parse as objects; greedy output under a schema is
the same with NGRAM speculation as without (drafts are cut where the grammar rejects them and
verified under the same masks); a schema xgrammar cannot compile is a 400 naming response_format.
The schemas bound every string, array and integer, so a 400-token budget always closes them."""
import json
import pathlib
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import Server, openai_client  # noqa: E402

MODEL = "default"
REQUESTS = 200
WORDS = ["alpha", "beta", "gamma", "delta", "red", "green", "blue", "north", "south"]
PROMPTS = ["Describe the weather today as JSON.", "List facts about the river.", "Return a record for the order.",
           "The history of the city in one object:", "Give the result of the experiment."]


def random_value_schema(rng, depth):
    """A bounded schema (every string, array and integer has a length or range), so a tiny model
    cannot spend its tokens before the value closes."""
    kind = rng.choice(["integer", "boolean", "enum", "string", "array"] + (["object"] if depth < 2 else []))
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 12)}
    if kind == "array":
        items = rng.choice([{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 99},
                            {"type": "string", "enum": rng.sample(WORDS, 2)}])
        return {"type": "array", "items": items, "minItems": rng.randint(0, 1), "maxItems": rng.randint(2, 4)}
    return random_object_schema(rng, depth + 1)


def random_object_schema(rng, depth=0):
    names = rng.sample(["id", "name", "count", "ok", "tags", "city", "score", "kind", "meta", "level"],
                       rng.randint(1, 4))
    properties = {name: random_value_schema(rng, depth) for name in names}
    required = [n for n in names if rng.random() < 0.7] or names[:1]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def schemas(n, seed=24):
    rng = random.Random(seed)
    return [random_object_schema(rng) for _ in range(n)]


def ask(client, i, schema, **extra):
    """Chat for even i, completions for odd i; (text, finish_reason, usage)."""
    response_format = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    prompt = PROMPTS[i % len(PROMPTS)]
    if i % 2 == 0:
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           response_format=response_format, max_tokens=400, **extra)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=400,
                                  extra_body={"response_format": response_format}, **extra)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage


@pytest.fixture(scope="module")
def server():
    with Server("--max-running-requests", 32, model=None) as s:
        yield s


def test_json_schema_outputs_parse_and_validate(server):
    client = openai_client(server, timeout=300)
    cases = schemas(REQUESTS)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda a: ask(client, a[0], a[1], temperature=0.8, seed=a[0]), enumerate(cases)))
    for i, (schema, (text, finish, _)) in enumerate(zip(cases, results)):
        assert finish == "stop", f"request {i}: finish_reason {finish}, output {text!r}, schema {json.dumps(schema)}"
        value = json.loads(text)
        jsonschema.validate(value, schema)


def test_json_object_outputs_parse_as_objects(server):
    client = openai_client(server, timeout=300)

    def one(i):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[i % 5]}],
                                           response_format={"type": "json_object"}, max_tokens=400,
                                           temperature=0.7, seed=i)
        return r.choices[0].message.content, r.choices[0].finish_reason
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(20)))
    # Any object is allowed, so a string may run past max_tokens ("length": the text is then a
    # prefix of an object); every output that ended on its own must parse as an object.
    stopped = [text for text, finish in results if finish == "stop"]
    assert len(stopped) >= 10, results
    for text in stopped:
        assert isinstance(json.loads(text), dict), text
    for text, finish in results:
        assert finish in ("stop", "length") and text.lstrip().startswith("{"), (finish, text)


def test_vllm_and_sglang_schema_fields(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for field, value in [("guided_json", schema), ("json_schema", json.dumps(schema))]:
        status, body = server.request("POST", "/v1/completions", {
            "model": MODEL, "prompt": "Is it done?", "max_tokens": 50, "temperature": 0, field: value})
        assert status == 200, body
        jsonschema.validate(json.loads(body["choices"][0]["text"]), schema)


def test_bad_schemas_are_refused_naming_the_field(server):
    status, body = server.request("POST", "/v1/completions", {
        "model": MODEL, "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n"}}})
    assert status == 400 and body["error"]["param"] == "response_format", body
    status, body = server.request("POST", "/v1/completions", {
        "model": MODEL, "prompt": "x", "response_format": {"type": "yaml"}})
    assert status == 400 and "response_format.type" in body["error"]["message"], body
    status, body = server.request("POST", "/v1/completions", {
        "model": MODEL, "prompt": "x", "guided_json": {"type": "object"},
        "response_format": {"type": "json_object"}})
    assert status == 400 and "only one structured-output field" in body["error"]["message"], body


def test_greedy_output_under_a_schema_is_the_same_with_speculation():
    cases = schemas(16, seed=7)
    outputs = []
    for spec in ([], ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5",
                      "--speculative-fixed-drafts"]):
        with Server("--max-running-requests", 16, *spec, model=None) as s:
            client = openai_client(s, timeout=300)
            with ThreadPoolExecutor(8) as pool:
                outputs.append(list(pool.map(lambda a: ask(client, a[0], a[1], temperature=0), enumerate(cases))))
    plain, speculative = outputs
    for i, ((text, finish, _), (spec_text, spec_finish, _)) in enumerate(zip(plain, speculative)):
        assert (spec_text, spec_finish) == (text, finish), f"request {i}"
        jsonschema.validate(json.loads(text), cases[i])
    verify_steps = sum((u.model_extra or {}).get("spec_verify_ct", 0) or 0 for _, _, u in speculative)
    assert verify_steps > 0, "no request speculated"
