#!/usr/bin/env python3
"""Re-plan against cold start on CPU ranks serving a bf16 checkpoint directory (issue 26, line 2).

Writes a DeepSeek-V3-shaped bf16 checkpoint of about 1 GB (random weights, the default model's
tokenizer) to DIR (default /tmp/moeserve_replan_ckpt, reused when present), then for every
plan P of --plans starts `moeserve serve --model DIR --plan P` --repeat times and times it to
ready (the cold start: process start to /health answering, and the load GB/s the server
prints); then on one server started on the first plan walks every ordered pair of plans
--repeat times (an Eulerian circuit of the pairs: each re-plan starts from the previous one's
plan) with POST /admin/replan, and prints each pair's median time to ready (with its spread
and phases) over the median cold start of the target plan. The load average is printed
before and after: on a shared machine the figures mean something only when it is low.

  python3 scripts/bench_replan_cpu.py --moeserve build/bin/moeserve [--dir DIR] [--plans tp2,ep2,pp2,ep2-dp]
      [--repeat 3] [--skip-warmup] [--json OUT.json]
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

import synthetic_checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = {  # about 0.49 G parameters: 0.97 GB in bf16
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 4096,
    "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 512, "num_hidden_layers": 10,
    "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 128,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "n_routed_experts": 32,
    "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 2048, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "topk_method": "noaux_tc", "scoring_func": "sigmoid"}


def tensor_bytes(name, shape, dtype, rng):
    n = int(np.prod(shape))
    if dtype == "F32":
        return (0.05 * rng.standard_normal(n, dtype=np.float32)).tobytes()
    if name.endswith("norm.weight"):
        values = 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)
    else:
        values = rng.standard_normal(n, dtype=np.float32) / np.sqrt(shape[-1])
    values = values.astype(np.float32)
    return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # bf16: the top half of fp32


def write_checkpoint(directory):
    """model.safetensors (every tensor bf16 but the router bias), config.json and the tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = synthetic_checkpoint.head_tensors(CONFIG)
    for layer in range(CONFIG["num_hidden_layers"]):
        tensors.update(synthetic_checkpoint.layer_tensors(CONFIG, layer))
    rng = np.random.default_rng(26)
    synthetic_checkpoint.write_safetensors(directory / "model.safetensors", tensors,
                                           lambda f, name, shape, dtype: f.write(tensor_bytes(name, shape, dtype, rng)))
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=2))
    synthetic_checkpoint.copy_tokenizer(directory)


class Server:
    def __init__(self, moeserve, directory, plan, extra=(), backend="cpu"):
        self.start = time.time()
        self.proc = subprocess.Popen([moeserve, "serve", "--model", str(directory), "--plan", plan, "--port", "0",
                                      "--admin-api-key", "bench", "--backend", backend, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, self.port, self.load = [], None, None
        while self.port is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the server exited:\n" + "".join(self.lines))
            self.lines.append(line)
            if m := re.search(r"in ([0-9.]+) s: ([0-9.]+) GB/s", line):
                self.load = (float(m.group(1)), float(m.group(2)))
            if m := re.search(r"on http://127\.0\.0\.1:(\d+)", line):
                self.port = int(m.group(1))
        self.base = f"http://127.0.0.1:{self.port}"
        while True:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.01)
        self.ready_s = time.time() - self.start

    def replan(self, plan):
        request = urllib.request.Request(self.base + "/admin/replan", data=json.dumps({"plan": plan}).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": "Bearer bench"}, method="POST")
        with urllib.request.urlopen(request, timeout=600) as r:
            return json.loads(r.read())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def pair_circuit(plans):
    """Every ordered pair of distinct plans once, as one walk from plans[0] (Hierholzer)."""
    out_edges = {p: [q for q in plans if q != p] for p in plans}
    stack, walk = [plans[0]], []
    while stack:
        if out_edges[stack[-1]]:
            stack.append(out_edges[stack[-1]].pop())
        else:
            walk.append(stack.pop())
    walk.reverse()
    return list(zip(walk, walk[1:]))


def spread(values):
    return f"{statistics.median(values):.3f} s [{min(values):.3f}, {max(values):.3f}]"


def loadavg():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def cold_starts(args, directory, plans, extra):
    cold = {}
    for plan in plans:
        times, loads = [], []
        for _ in range(args.repeat):
            server = Server(args.moeserve, directory, plan, extra)
            server.stop()
            times.append(server.ready_s)
            loads.append(server.load)
        cold[plan] = statistics.median(times)
        gbps = statistics.median(g for _, g in loads)
        print(f"cold start {plan}: ready in {spread(times)} (median of {len(times)}; weights loaded in "
              f"{spread([s for s, _ in loads])}, {gbps:.2f} GB/s); {loadavg()}", flush=True)
    return cold


def replans(args, directory, plans, extra, cold):
    server = Server(args.moeserve, directory, plans[0], extra)
    runs = {}
    for _ in range(args.repeat):
        for pair in pair_circuit(plans):
            r = server.replan(pair[1])
            assert r["previous_plan"] == pair[0], r
            runs.setdefault(pair, []).append(r)
    server.stop()
    worst, rows = 0.0, []
    for (a, b), rs in runs.items():
        ready = [r["time_to_ready_s"] for r in rs]
        share = statistics.median(ready) / cold[b]
        worst = max(worst, share)
        phases = {k: statistics.median(r["phases_s"][k] for r in rs) for k in rs[0]["phases_s"]}
        detail = {k: statistics.median(r.get("move_detail_s", {}).get(k, 0) for r in rs)
                  for k in rs[0].get("move_detail_s", {})}
        moved = rs[0]["moved_bytes"]
        rows.append({"from": a, "to": b, "ready_s": ready, "share_of_cold": share, "phases_s": phases,
                     "move_detail_s": detail, "moved_bytes": moved, "weights_from": rs[0]["weights_from"]})
        text = ", ".join(f"{k} {v:.3f}" for k, v in {**phases, **detail}.items())
        print(f"re-plan {a} -> {b}: ready in {spread(ready)} ({text}; weights from {rs[0]['weights_from']}: "
              f"{moved['local'] / 1e9:.2f} GB local + {moved['peer'] / 1e9:.2f} GB peer copied, "
              f"{moved.get('viewed', 0) / 1e9:.2f} GB viewed, {moved.get('reused_cache', 0) / 1e9:.2f} GB KV cache "
              f"reused) = {100 * share:.0f}% of {b}'s cold start", flush=True)
    return worst, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moeserve", default=str(ROOT / "build/bin/moeserve"))
    ap.add_argument("--dir", default="/tmp/moeserve_replan_ckpt")
    ap.add_argument("--plans", default="tp2,ep2,pp2,ep2-dp")
    ap.add_argument("--repeat", type=int, default=3, help="cold starts per plan and re-plans per ordered pair")
    ap.add_argument("--skip-warmup", action="store_true",
                    help="start the servers with --skip-warmup (the cold start is then the load alone)")
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args()
    directory = pathlib.Path(args.dir)
    if not (directory / "model.safetensors").exists():
        t = time.time()
        write_checkpoint(directory)
        print(f"wrote {directory} in {time.time() - t:.1f} s")
    size = (directory / "model.safetensors").stat().st_size
    print(f"checkpoint: {size / 1e9:.3f} GB bf16 in {directory}; {loadavg()}", flush=True)
    plans = args.plans.split(",")
    extra = ["--skip-warmup"] if args.skip_warmup else []
    cold = cold_starts(args, directory, plans, extra)
    worst, rows = replans(args, directory, plans, extra, cold)
    print(f"worst re-plan (median): {100 * worst:.0f}% of the cold start (bar: 30%); {loadavg()}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"cold_start_s": cold, "replans": rows}, indent=1))
    return 0 if worst <= 0.30 else 1


if __name__ == "__main__":
    sys.exit(main())
