"""Sampling fields on the GPU (issue 25): the logit-adjust op runs inside the decode step's CUDA
graph. Two servers of the same synthetic model, `--backend cuda` and the CPU reference; the
same greedy requests with logit_bias, penalties and min_tokens go to both. Requests whose bias
forces the path (+100 on a few tokens, so bf16 rounding cannot flip a choice) must give the
same tokens on both; the others are reported. Then the cost: decode throughput of a batch with
penalties against the same batch without (on the CUDA server).

usage: sampling_fields_gpu.py --bin carry/moeserve --out DIR"""
import argparse
import concurrent.futures
import json
import pathlib
import re
import subprocess
import sys
import threading
import time
import urllib.request

PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]
FORCED = [  # the bias decides every token
    {"logit_bias": {"200": 100}},
    {"logit_bias": {"200": 100, "201": 100, "202": 100}, "repetition_penalty": 3.0},
    {"logit_bias": {"200": 100, "201": 100}, "presence_penalty": 2.0, "frequency_penalty": 2.0},
    {"logit_bias": {"300": 100, "301": 100}, "min_tokens": 4, "stop_token_ids": [300]},
]
FREE = [{"repetition_penalty": 1.5}, {"frequency_penalty": 1.0}, {"presence_penalty": -1.0},
        {"logit_bias": {"7": 5.0, "9": -100}}]


def start(binary, backend, log):
    proc = subprocess.Popen([binary, "serve", "--model", "synthetic:tiny", "--backend", backend, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [lines.append(l) for l in proc.stdout], daemon=True).start()
            return proc, f"http://127.0.0.1:{m.group(1)}", lines
    log.write("".join(lines))
    raise SystemExit(f"{backend} server did not start")


def post(base, body):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def tokens(base, extra, n=24):
    body = {"model": "synthetic:tiny", "prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **extra}
    return post(base, body)["choices"][0]["token_ids"]


def throughput(base, extra, concurrency=32, new_tokens=128):
    def one(i):
        return len(tokens(base, extra | {"prompt": [i + 1] * 16}, new_tokens))
    start_time = time.time()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(one, range(concurrency)))
    return total / (time.time() - start_time)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    report = {"forced": [], "free": []}
    with open(out / "servers.log", "w") as log:
        gpu, gpu_base, gpu_lines = start(args.bin, "cuda", log)
        cpu, cpu_base, cpu_lines = start(args.bin, "cpu", log)
        try:
            for kind, cases in (("forced", FORCED), ("free", FREE)):
                for extra in cases:
                    g, c = tokens(gpu_base, extra), tokens(cpu_base, extra)
                    report[kind].append({"fields": extra, "cuda": g, "cpu": c, "equal": g == c})
            tokens(gpu_base, {})  # warm both graph shapes
            tokens(gpu_base, {"presence_penalty": 0.5})
            report["decode_tok_s_plain"] = throughput(gpu_base, {})
            report["decode_tok_s_penalties"] = throughput(
                gpu_base, {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2})
        finally:
            for proc in (gpu, cpu):
                proc.terminate()
                proc.wait(timeout=60)
            log.write("".join(gpu_lines) + "".join(cpu_lines))
    (out / "sampling_fields_gpu.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k.startswith("decode")}))
    for kind in ("forced", "free"):
        print(kind, [r["equal"] for r in report[kind]])
    ok = all(r["equal"] for r in report["forced"])
    print("FORCED_EQUAL" if ok else "FORCED_DIFFER")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
