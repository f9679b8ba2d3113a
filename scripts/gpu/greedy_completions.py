#!/usr/bin/env python3
"""Greedy completions of a running moeserve server, all at once (stdlib only: runs on the GPU
machine): the first N 400-character chunks of a text file as prompts, `max_tokens` each, sent
concurrently so that the server batches them, and the generated token ids written as one JSON
list. Two servers' files compared byte for byte tell whether an option (speculative decoding)
changed any greedy token under continuous batching.
Usage: greedy_completions.py PORT TEXT_FILE N MAX_TOKENS OUT_JSON"""
import http.client
import json
import sys
import threading


def complete(port, model, prompt, max_tokens, out, i):
    conn = http.client.HTTPConnection("localhost", port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "return_token_ids": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    if resp.status != 200:
        raise RuntimeError(f"request {i}: HTTP {resp.status}: {data}")
    out[i] = data["choices"][0]["token_ids"]


def main():
    port, text_file, n, max_tokens, out_path = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
        sys.argv[5]
    text = open(text_file).read()
    prompts = [text[i:i + 400] for i in range(0, 400 * n, 400)]
    conn = http.client.HTTPConnection("localhost", port, timeout=60)
    conn.request("GET", "/v1/models")
    model = json.loads(conn.getresponse().read())["data"][0]["id"]
    out = [None] * n
    threads = [threading.Thread(target=complete, args=(port, model, p, max_tokens, out, i))
               for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(o is None for o in out):
        sys.exit(f"{sum(o is None for o in out)} of {n} requests failed")
    json.dump(out, open(out_path, "w"))
    print(f"{n} completions of {max_tokens} tokens -> {out_path}")


if __name__ == "__main__":
    main()
