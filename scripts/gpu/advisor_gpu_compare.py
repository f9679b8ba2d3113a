#!/usr/bin/env python3
"""Issue 22 acceptance 2 on one H200 (stdlib only): the advisor's prediction against what the GPU
measured, per point.

Inputs (written by scripts/gpu/run_advisor_gpu.sh into --dir): bench-step JSONs named
`step_<dtype>_c<context>.json` and `prefill_<dtype>.json`, serve_load.py lines `serve_c<concurrency>.json`.
Calibration, per weight dtype, from the context-1024 and 32768 steps and the prefill passes only: the repository's
h200-sxm-x8 profile with bench-step's measured copy and bf16 GEMM ceilings as its peaks, the streaming
efficiency by batch that makes the advisor's weight and KV bytes take the measured context-1024 step
(what the advisor's other terms leave of it), the KV read's efficiency by batch from the 32768-token
steps (where it is most of the step), and the prefill efficiency from the measured prefill
passes; each field's source says so. Then the held-out points: the other context's steps (the
advisor's decode round without host time, as bench-step times it) within +-10%, and serving's
aggregate output tok/s through HTTP (INT4, the served dtype) within +-15%. Prints one line per point
with its error and a summary; exit status 0 either way (the numbers are the result). Runs anywhere
with a moeserve binary (plan advise needs no GPU)."""
import argparse
import glob
import json
import os
import re
import subprocess
import sys


KV_CONTEXT = 32768  # the KV efficiency's calibration context (with 1024: the held-out points are the others)
HOW = "measured on one H200 with `moeserve bench-step` (scripts/gpu/run_advisor_gpu.sh): "


def field(profile, name, value, source):
    profile["fields"][name] = {"value": value, "source": HOW + source}


def advise(a, model, profile, concurrency, input_len, output_len, tag):
    path = os.path.join(a.dir, f"{tag}.profile.json")
    json.dump(profile, open(path, "w"), indent=2)
    out = os.path.join(a.dir, f"{tag}.advise.json")
    subprocess.run([a.bin, "plan", "advise", "--model", model, "--hardware", path, "--gpus", "1", "--plans", "single",
                    "--concurrency", ",".join(map(str, concurrency)), "--input-len", str(input_len),
                    "--output-len", str(output_len), "--json", out], check=True, capture_output=True)
    return json.load(open(out))["plans"][0]["points"]


def step_us(r):
    """The advisor's decode round as bench-step times it: no host time (scheduling, outputs)."""
    return r["total_us"] - r["host_us"]


def model_of(a, dtype):
    return f"synthetic:kimi-k2.6:layers={a.layers}" + (":dtype=bf16" if dtype == "bf16" else "")


def calibrate(a, dtype):
    base = json.load(open(a.base_profile))
    cal = json.load(open(os.path.join(a.dir, f"step_{dtype}_c1024.json")))
    field(base, "memory_gbs", cal["copy_gbs"], f"device-to-device copy ceiling {cal['copy_gbs']:.1f} GB/s")
    field(base, "matmul_tflops", cal["bf16_tflops"], f"bf16 GEMM ceiling {cal['bf16_tflops']:.1f} TFLOP/s")
    repository_prefill = base["fields"]["prefill_efficiency"]
    for name in ("weight_efficiency", "kv_efficiency", "prefill_efficiency"):
        field(base, name, [[1, 1.0]], "1 while calibrating")
    rows = cal["rows"]
    points = advise(a, model_of(a, dtype), base, [r["batch"] for r in rows], 1024, 1, f"cal_{dtype}")
    curve = []
    for row, pt in zip(rows, points):
        r = pt["round"]
        streamed = r["weights_us"] + r["kv_us"]
        curve.append([row["batch"], streamed / max(1.0, row["step_ms"] * 1e3 - (step_us(r) - streamed))])
    text = ", ".join(f"batch {b}: {e:.3f}" for b, e in curve)
    for name in ("weight_efficiency", "kv_efficiency"):
        field(base, name, curve, f"{model_of(a, dtype)} steps at context 1024: the advisor's weight and KV bytes at "
                                 f"the copy ceiling over the measured step less its other terms ({text})")
    calibrate_kv(a, dtype, base)
    prefill_path = os.path.join(a.dir, f"prefill_{dtype}.json")
    if not os.path.exists(prefill_path):  # no prefill passes: the repository profile's efficiency
        base["fields"]["prefill_efficiency"] = repository_prefill
        print(f"{dtype}: no {prefill_path}: prefill_efficiency as the repository profile has it")
        json.dump(base, open(os.path.join(a.dir, f"h200-calibrated-{dtype}.json"), "w"), indent=2)
        return base
    pre = json.load(open(prefill_path))["prefill"]
    curve = []
    for row in pre:
        pt = advise(a, model_of(a, dtype), base, [1], row["tokens"], 1, f"cal_prefill_{dtype}_{row['tokens']}")[0]
        computed = pt["prefill_us"] - base["fields"]["step_overhead_us"]["value"]
        curve.append([row["tokens"], computed / (row["ms"] * 1e3)])
    field(base, "prefill_efficiency", curve, f"{model_of(a, dtype)} prefill passes (--prefill): the advisor's prefill "
          "at efficiency 1 over the measured pass: " + ", ".join(f"{t} tokens {e:.3f}" for t, e in curve))
    base["name"] = f"h200-calibrated-{dtype}"
    json.dump(base, open(os.path.join(a.dir, f"h200-calibrated-{dtype}.json"), "w"), indent=2)
    return base


def calibrate_kv(a, dtype, base):
    """The KV read's efficiency by batch from the longest context's steps (KV_CONTEXT), where it is
    most of the step: the advisor's KV bytes at the copy ceiling over the measured step less the
    other terms at the context-1024 calibration."""
    path = os.path.join(a.dir, f"step_{dtype}_c{KV_CONTEXT}.json")
    if not os.path.exists(path):
        return
    rows = json.load(open(path))["rows"]
    at_one = json.loads(json.dumps(base))
    field(at_one, "kv_efficiency", [[1, 1.0]], "1 while calibrating")
    points = advise(a, model_of(a, dtype), at_one, [r["batch"] for r in rows], KV_CONTEXT, 1, f"cal_kv_{dtype}")
    curve = []
    for row, pt in zip(rows, points):
        r = pt["round"]
        curve.append([row["batch"], r["kv_us"] / max(1.0, row["step_ms"] * 1e3 - (step_us(r) - r["kv_us"]))])
    field(base, "kv_efficiency", curve, f"{model_of(a, dtype)} steps at context {KV_CONTEXT}: the advisor's KV bytes "
          "at the copy ceiling over the measured step less its other terms (" +
          ", ".join(f"batch {b}: {e:.3f}" for b, e in curve) + ")")


def compare_steps(a, dtype, profile, calibrated_here=True):
    held_out = []
    for path in sorted(glob.glob(os.path.join(a.dir, f"step_{dtype}_c*.json"))):
        match = re.fullmatch(r"step_\w+_c(\d+)\.json", os.path.basename(path))
        if not match:
            continue
        context = int(match.group(1))
        rows = json.load(open(path))["rows"]
        points = advise(a, model_of(a, dtype), profile, [r["batch"] for r in rows], context, 1,
                        f"pred_step_{dtype}_c{context}")
        for row, pt in zip(rows, points):
            predicted_ms = step_us(pt["round"]) / 1e3
            err = predicted_ms / row["step_ms"] - 1
            calibration = calibrated_here and context in (1024, KV_CONTEXT)
            if not calibration:
                held_out.append(err)
            print(f"bench-step {dtype:5s} context {context:6d} batch {row['batch']:4d}: measured {row['step_ms']:8.3f} "
                  f"ms predicted {predicted_ms:8.3f} ms ({100 * err:+.1f}%) dominant {pt['round']['dominant']}"
                  + ("  [calibration point]" if calibration else ""))
    return held_out


def compare_serving(a, profile):
    errors = []
    for path in sorted(glob.glob(os.path.join(a.dir, "serve_c*.json"))):
        measured = json.loads(open(path).read().strip().splitlines()[-1])
        c = measured["concurrency"]
        pt = advise(a, model_of(a, "int4"), profile, [c], a.input_len, a.output_len, f"pred_serve_c{c}")[0]
        err = pt["aggregate_tok_s"] / measured["output_tok_per_s"] - 1
        errors.append(err)
        print(f"serving concurrency {c:3d}: measured {measured['output_tok_per_s']:9.1f} tok/s predicted "
              f"{pt['aggregate_tok_s']:9.1f} ({100 * err:+.1f}%); TTFT measured {measured['mean_ttft_ms']} ms "
              f"predicted {pt['ttft_ms']:.1f}; server decode step {measured['server_mean_decode_step_ms']} ms, "
              f"predicted round {pt['round']['total_us'] / 1e3:.3f} ms")
    return errors


def summary(name, errors, bound):
    inside = sum(abs(e) <= bound for e in errors)
    worst = max((abs(e) for e in errors), default=0)
    print(f"{name}: {inside} of {len(errors)} points within +-{100 * bound:.0f}% (worst {100 * worst:.1f}%)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--bin", default="carry/advisor/moeserve")
    p.add_argument("--base-profile", default="perf/profiles/h200-sxm-x8.json")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--profiles", default="", help="dtype=FILE,...: profiles calibrated on an earlier run; "
                   "no calibration here, every point held out")
    a = p.parse_args()
    given = dict(item.split("=", 1) for item in a.profiles.split(",") if item)
    held_out, profiles = [], {}
    for dtype in ("bf16", "int4"):
        if not os.path.exists(os.path.join(a.dir, f"step_{dtype}_c1024.json")):
            print(f"{dtype}: no step_{dtype}_c1024.json (bench-step did not run)")
            continue
        profiles[dtype] = json.load(open(given[dtype])) if dtype in given else calibrate(a, dtype)
        held_out += compare_steps(a, dtype, profiles[dtype], calibrated_here=dtype not in given)
    summary("bench-step, held-out points", held_out, 0.10)
    if "int4" in profiles:
        summary("serving", compare_serving(a, profiles["int4"]), 0.15)


if __name__ == "__main__":
    main()
