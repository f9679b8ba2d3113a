#!/usr/bin/env python3
"""HTTP throughput of a running moeserve server (stdlib only: runs on the GPU machine).

Sends `--requests` streaming /v1/completions requests with random token-id prompts at
`--concurrency`, `ignore_eos`, a fixed `max_tokens` and the given sampling options (greedy by
default; request i uses seed i), and prints one JSON line: output
tokens per second over the run, mean / min / max TTFT and inter-token latency, and the server's own
step-time, scheduler CPU and sampling counters from /metrics (delta over the run)."""
import argparse
import http.client
import json
import random
import threading
import time


def metrics(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    return values


def served_model(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def one_request(host, port, model, prompt, max_tokens, sampling, out):
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True, "return_token_ids": True, **sampling})
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    stamps = []
    buffer = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event.startswith(b"data: ") and event != b"data: [DONE]":
                # One stamp per generated token (a chunk may carry several).
                data = json.loads(event[6:])
                n = sum(len(c.get("token_ids") or []) for c in data.get("choices", []))
                stamps.extend([time.perf_counter()] * n)
    out.append((start, stamps))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=163840)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--prompt-seed", type=int, default=0, help="another seed: prompts the prefix cache has not seen")
    p.add_argument("--response-format", default=None, help="a response_format as JSON (structured output)")
    a = p.parse_args()
    sampling = {"temperature": a.temperature, "top_k": a.top_k, "top_p": a.top_p}
    if a.response_format:
        sampling["response_format"] = json.loads(a.response_format)
    rng = random.Random(a.prompt_seed)
    prompts = [[rng.randrange(min(1000, a.vocab // 2), a.vocab) for _ in range(a.input_len)] for _ in range(a.requests)]
    results, lock, next_index = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(prompts):
                return
            one_request(a.host, a.port, model, prompts[i], a.output_len, dict(sampling, seed=i), results)

    model = served_model(a.host, a.port)
    before = metrics(a.host, a.port)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - t0
    after = metrics(a.host, a.port)
    if len(results) != len(prompts):
        raise SystemExit(f"{len(prompts) - len(results)} requests failed")
    tokens = sum(len(s) for _, s in results)
    ttft = [s[0] - start for start, s in results if s]
    itl = [b - x for _, s in results for x, b in zip(s, s[1:])]
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if "step_duration_seconds_sum" in k
             or "step_duration_seconds_count" in k or "cpu_seconds" in k or "sampl" in k}
    steps = delta.get("moeserve_step_duration_seconds_count", 0)
    decode_steps = delta.get("moeserve_decode_step_duration_seconds_count", 0)
    print(json.dumps({"concurrency": a.concurrency, "sampling": sampling, "requests": len(results),
                      "output_tokens": tokens,
                      "duration_s": round(duration, 3), "output_tok_per_s": round(tokens / duration, 1),
                      "mean_ttft_ms": round(1e3 * sum(ttft) / max(len(ttft), 1), 2),
                      "min_ttft_ms": round(1e3 * min(ttft, default=0), 2),
                      "max_ttft_ms": round(1e3 * max(ttft, default=0), 2),
                      "mean_itl_ms": round(1e3 * sum(itl) / max(len(itl), 1), 3),
                      "server_steps": steps,
                      "server_mean_step_ms": round(1e3 * delta.get("moeserve_step_duration_seconds_sum", 0) / max(steps, 1), 3),
                      "server_decode_steps": decode_steps,
                      "server_mean_decode_step_ms": round(
                          1e3 * delta.get("moeserve_decode_step_duration_seconds_sum", 0) / max(decode_steps, 1), 3),
                      "server_scheduler_cpu_ms_per_step": round(1e3 * delta.get("moeserve_scheduler_cpu_seconds_total", 0) / max(steps, 1), 3),
                      "sampled_rows": delta.get("moeserve_sampled_rows_total", 0),
                      "sampling_fallbacks": delta.get("moeserve_sampling_fallbacks_total", 0)}))


if __name__ == "__main__":
    main()
