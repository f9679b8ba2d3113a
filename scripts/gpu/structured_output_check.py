#!/usr/bin/env python3
"""Constrained outputs on a running server (stdlib only: runs on the GPU machine): 32 greedy and
sampled completions under a bounded JSON schema must end with finish_reason "stop" and parse to
an object with the schema's keys and types; prints one JSON line and exits 1 on any failure."""
import argparse
import http.client
import json
from concurrent.futures import ThreadPoolExecutor

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "count", "ok", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "count": {"type": "integer", "minimum": 0,
                                                                             "maximum": 999},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3}}}


def served_model(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def one(port, model, i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": model, "prompt": [1000 + i, 2000, 3000], "max_tokens": 200,
            "temperature": 0 if i % 2 else 0.9, "seed": i,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = json.loads(conn.getresponse().read())
    choice = r["choices"][0]
    return choice["finish_reason"], choice["text"]


def valid(text):
    v = json.loads(text)
    return (set(v) == {"name", "count", "ok", "tags"} and isinstance(v["name"], str) and len(v["name"]) <= 8
            and isinstance(v["count"], int) and 0 <= v["count"] <= 999 and isinstance(v["ok"], bool)
            and all(t in ("a", "b") for t in v["tags"]) and len(v["tags"]) <= 3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=30000)
    a = p.parse_args()
    model = served_model(a.port)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: one(a.port, model, i), range(32)))
    bad = []
    for i, (finish, text) in enumerate(results):
        try:
            ok = finish == "stop" and valid(text)
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            bad.append({"request": i, "finish": finish, "text": text})
    print(json.dumps({"requests": len(results), "failed": len(bad), "examples": bad[:3],
                      "first_outputs": [t for _, t in results[:3]]}))
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
