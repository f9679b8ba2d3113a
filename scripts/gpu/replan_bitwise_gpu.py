#!/usr/bin/env python3
"""Live re-plans on two GPUs that change no bit (run on two): `moeserve serve --backend cuda
--reduction-plan tp2` starts on one GPU, answers greedy completions with top-5 logprobs, then
re-plans to tp2, pp2 and back to one GPU (POST /admin/replan), answering the same requests
after each switch; every answer must carry the same tokens and the same logprobs to the last
digit. A plain server (no reduction plan) is run the same way for contrast. Writes a JSON
report; exits non-zero when a re-plan under the reduction plan changes anything."""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91], [200, 4], [11, 12, 13, 14, 15, 16, 17], [9, 9, 9]]
PLANS = ["tp2", "pp2", "single"]


ADMIN_KEY = "replan-bitwise"  # the server's --admin-api-key; the API routes are open (no --api-key)


def request(base, method, path, body=None, timeout=300):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {ADMIN_KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def answers(base, model):
    out = []
    for prompt in PROMPTS:
        status, body = request(base, "POST", "/v1/completions",
                               {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0,
                                "logprobs": 5, "return_token_ids": True, "ignore_eos": True})
        assert status == 200, body
        choice = body["choices"][0]
        out.append([choice["token_ids"], choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]])
    return out


def run_server(binary, backend, model, reduction_plan):
    proc = subprocess.Popen([binary, "serve", "--backend", backend, "--model", model, "--port", "0", "--skip-warmup",
                             "--kv-pages", "256", "--reduction-plan", reduction_plan,
                             "--admin-api-key", ADMIN_KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        match = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if match:
            return proc, f"http://127.0.0.1:{match.group(1)}"
    raise RuntimeError("server did not start:\n" + "".join(lines))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--moeserve", required=True)
    parser.add_argument("--model", default="synthetic:kimi-k2.6:layers=3")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report, ok = {}, True
    for reduction_plan in ("tp2", "single"):
        proc, base = run_server(args.moeserve, args.backend, args.model, reduction_plan)
        try:
            first = answers(base, args.model)
            entry = {}
            for plan in PLANS:
                t0 = time.time()
                status, reply = request(base, "POST", "/admin/replan", {"plan": plan})
                assert status == 200, reply
                now = answers(base, args.model)
                same_tokens = sum(a[0] == b[0] for a, b in zip(now, first))
                same_logprobs = sum(a[1] == b[1] and a[2] == b[2] for a, b in zip(now, first))
                entry[plan] = {"prompts": len(PROMPTS), "same_tokens": same_tokens, "same_logprobs": same_logprobs,
                               "replan_s": round(time.time() - t0, 2)}
                if reduction_plan != "single":
                    ok &= same_tokens == len(PROMPTS) and same_logprobs == len(PROMPTS)
            report[f"under {reduction_plan}"] = entry
            print(f"under --reduction-plan {reduction_plan}:", json.dumps(entry), flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2))
    print("re-plans one GPU -> tp2 -> pp2 -> one GPU under --reduction-plan tp2 change no bit:",
          "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
