#!/usr/bin/env python3
"""Cold start and live re-plan on one GPU from a Kimi K2.6-shaped checkpoint on local disk (issue 26, line 4).

Writes the real K2.6 text config (tests/data/configs/kimi-k2.6.config.json) cut to --layers
layers as a checkpoint directory: its routed experts INT4 pack-quantized (group 32, int32
weight_packed, bf16 weight_scale, weight_shape), everything else bf16, one safetensors file per
layer (reused when DIR holds it already). The weights are random bytes tiled from one block (the load moves the same bytes as a real
checkpoint's; the outputs mean nothing). Then starts `moeserve serve --model DIR --plan single
--reduction-plan tp2` (--reduction-plan) and times it to ready (process start to /health answering; the load GB/s it
prints; the page cache dropped first with --drop-caches, else warm from the writing), takes greedy tokens,
re-plans single -> single --repeat times through POST /admin/replan (the reduction plan is the
server's, so the outputs stay identical), each with its phases and where its weights came from,
and checks the greedy tokens after each. With --source-replan, one more server whose re-plan has
the in-place path refused (--mem-per-rank too small for both shards) and loads from the checkpoint
instead: the cost a re-plan without resident weights pays.

  python3 scripts/gpu/replan_k26_gpu.py --moeserve build/bin/moeserve [--dir /tmp/k26] [--layers 5]
      [--repeat 3] [--drop-caches] [--source-replan] [--json OUT.json]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import synthetic_checkpoint  # noqa: E402
from bench_replan_cpu import Server  # noqa: E402

BLOCK = 1 << 26  # bytes of random data each tensor's bytes are tiled from


def k26_config(layers):
    full = json.loads((ROOT / "tests/data/configs/kimi-k2.6.config.json").read_text())
    config = dict(full["text_config"])
    config["num_hidden_layers"] = layers
    config["quantization_config"] = full["quantization_config"]
    config["bos_token_id"], config["eos_token_id"] = 0, 1
    return config


class Blocks:
    """Valid bytes of each kind, tiled: bf16 weights ~N(0, 1/K), norms ~1, scales ~1/(7.5 sqrt(K)), packed
    words uniform."""

    def __init__(self):
        rng = np.random.default_rng(26)
        weights = (rng.standard_normal(BLOCK // 2, dtype=np.float32) / 64).view(np.uint32)
        self.bf16 = (weights >> 16).astype(np.uint16).tobytes()
        self.norm = (np.full(BLOCK // 2, 1.0, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        self.scale = (np.full(BLOCK // 2, 1.0 / (7.5 * 64), np.float32).view(np.uint32) >> 16).astype(
            np.uint16).tobytes()
        self.words = rng.integers(0, 256, BLOCK, dtype=np.uint8).tobytes()
        self.f32 = (0.05 * rng.standard_normal(BLOCK // 4, dtype=np.float32)).tobytes()

    def write(self, f, name, shape, dtype):
        size = int(np.prod(shape)) * synthetic_checkpoint.DTYPE_BYTES[dtype]
        block = (self.f32 if dtype == "F32" else self.words if dtype == "I32" else
                 self.norm if name.endswith("norm.weight") else self.scale if name.endswith("weight_scale") else
                 self.bf16)
        while size > 0:
            f.write(block[:min(size, len(block))])
            size -= len(block)


def write_checkpoint(directory, layers):
    """Returns the checkpoint's bytes; one written before with the same config is reused."""
    c = k26_config(layers)
    index = directory / "model.safetensors.index.json"
    if index.exists() and json.loads((directory / "config.json").read_text()) == c:
        return json.loads(index.read_text())["metadata"]["total_size"]
    directory.mkdir(parents=True, exist_ok=True)
    blocks = Blocks()
    files = {"model-embed.safetensors": synthetic_checkpoint.head_tensors(c)}
    for layer in range(layers):
        files[f"model-layer{layer:02d}.safetensors"] = synthetic_checkpoint.layer_tensors(c, layer, int4_experts=True)
    total, weight_map = 0, {}
    for file, tensors in files.items():
        total += synthetic_checkpoint.write_safetensors(directory / file, tensors, blocks.write)
        weight_map.update({n: file for n in tensors})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(c, indent=2))
    synthetic_checkpoint.copy_tokenizer(directory)
    return total


def greedy(server, n=16):
    with urllib.request.urlopen(server.base + "/v1/models", timeout=60) as r:
        model = json.loads(r.read())["data"][0]["id"]
    body = {"model": model, "prompt": [3, 14, 15, 92, 65], "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    request = urllib.request.Request(server.base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return json.loads(r.read())["choices"][0]["token_ids"]
    except urllib.error.HTTPError as e:
        server.proc.terminate()
        log = server.proc.stdout.read()
        raise RuntimeError(f"/v1/completions answered {e.code}: {e.read().decode()}\nthe server's output:\n"
                           f"{''.join(server.lines)}{log[-4000:]}") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moeserve", default=str(ROOT / "build/bin/moeserve"))
    ap.add_argument("--dir", default="/tmp/k26")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reduction-plan", default="tp2", help="the server's (\"\": none)")
    ap.add_argument("--backend", default="cuda", help="cpu: the same walk on CPU ranks (a check of the script)")
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before the cold start (root)")
    ap.add_argument("--source-replan", action="store_true",
                    help="one more server whose re-plan loads from the checkpoint (--mem-per-rank refuses two shards)")
    ap.add_argument("--json")
    args = ap.parse_args()
    directory = pathlib.Path(args.dir)
    start = time.time()
    written = write_checkpoint(directory, args.layers)
    print(f"checkpoint: {written / 1e9:.2f} GB ({args.layers} layers) in {directory}, written or found in "
          f"{time.time() - start:.1f} s",
          flush=True)
    extra = ["--max-running-requests", "8", "--context-length", "4096"]
    if args.reduction_plan:
        extra += ["--reduction-plan", args.reduction_plan]
    page_cache = "warm (just written)"
    if args.drop_caches:
        subprocess.run(["sync"], check=True)
        try:
            pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
            page_cache = "dropped"
        except OSError as e:
            page_cache = f"warm (drop_caches refused: {e})"
    server = Server(args.moeserve, directory, "single", extra, backend=args.backend)
    result = {"layers": args.layers, "checkpoint_bytes": written, "page_cache": page_cache,
              "cold_ready_s": server.ready_s, "load_s_and_gb_per_s": server.load, "replans": []}
    print(f"cold start (page cache {page_cache}): ready in {server.ready_s:.2f} s; load {server.load[0]:.2f} s at "
          f"{server.load[1]:.2f} GB/s", flush=True)
    tokens = greedy(server)
    for i in range(args.repeat):
        report = server.replan("single")
        same = greedy(server) == tokens
        result["replans"].append({**report, "greedy_tokens_unchanged": same})
        print(f"re-plan {i}: ready {report['time_to_ready_s']:.3f} s phases {report['phases_s']} weights from "
              f"{report['weights_from']} {report['fallback_reason']!r} moved {report['moved_bytes']} "
              f"greedy unchanged: {same}", flush=True)
    server.stop()
    if args.source_replan:
        source_replan(args, directory, extra, written, tokens, result)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    ok = all(r["weights_from"] == "resident" and r["greedy_tokens_unchanged"] for r in result["replans"])
    sys.exit(0 if ok else 1)


def source_replan(args, directory, extra, written, tokens, result):
    """The same re-plan without resident weights: --mem-per-rank holds one shard, not two."""
    one_shard = f"{int(written * 1.2 / 2**30) + 1}GiB"
    server = Server(args.moeserve, directory, "single", extra + ["--mem-per-rank", one_shard], backend=args.backend)
    report = server.replan("single")
    result["replan_from_source"] = {**report, "greedy_tokens_unchanged": greedy(server) == tokens}
    print(f"re-plan from the checkpoint (--mem-per-rank {one_shard}): ready {report['time_to_ready_s']:.3f} s "
          f"phases {report['phases_s']} weights from {report['weights_from']} ({report['fallback_reason']})",
          flush=True)
    server.stop()


if __name__ == "__main__":
    main()
