#!/usr/bin/env python3
"""Issue 22 acceptance 2 on one H200 (stdlib only: runs on the GPU machine): the advisor's prediction
against what the GPU measured, per point.

Inputs (written by scripts/gpu/run_advisor_gpu.sh into --dir): bench-step JSONs named
`step_<dtype>_c<context>.json` and serve_load.py lines `serve_c<concurrency>.json`. Calibration: the
repository's h200-sxm-x8 profile with its bandwidth and GEMM peak replaced by the ceilings bench-step
measured on this GPU (its copy and bf16 GEMM runs), each field's source saying so; the prediction is
`moeserve plan advise` on that profile (single GPU): a decode round's time at each batch and context
against bench-step's median step, and the aggregate output tok/s against HTTP's. Prints one line per
point with its error and a summary (+-10% for steps, +-15% for serving); exit status 0 either way:
the numbers are the result."""
import argparse
import glob
import json
import os
import re
import subprocess
import sys


def calibrated_profile(base_path, step_json, out_path):
    profile = json.load(open(base_path))
    fields = profile["fields"]
    how = "measured on this H200 with `moeserve bench-step` (scripts/gpu/run_advisor_gpu.sh): "
    fields["memory_gbs"] = {"value": step_json["copy_gbs"],
                            "source": how + f"device-to-device copy ceiling {step_json['copy_gbs']:.1f} GB/s"}
    fields["matmul_tflops"] = {"value": step_json["bf16_tflops"],
                               "source": how + f"bf16 GEMM ceiling {step_json['bf16_tflops']:.1f} TFLOP/s"}
    profile["name"] = "h200-calibrated"
    json.dump(profile, open(out_path, "w"), indent=2)


def advise(binary, model, profile, concurrency, input_len, output_len, out_json):
    subprocess.run([binary, "plan", "advise", "--model", model, "--hardware", profile, "--gpus", "1", "--plans",
                    "single", "--concurrency", ",".join(map(str, concurrency)), "--input-len", str(input_len),
                    "--output-len", str(output_len), "--json", out_json], check=True, capture_output=True)
    return json.load(open(out_json))["plans"][0]["points"]


def compare_steps(a, profile):
    errors = []
    for path in sorted(glob.glob(os.path.join(a.dir, "step_*_c*.json"))):
        dtype, context = re.match(r"step_(\w+)_c(\d+)\.json", os.path.basename(path)).groups()
        measured = json.load(open(path))
        model = f"synthetic:kimi-k2.6:layers={a.layers}" + (":dtype=bf16" if dtype == "bf16" else "")
        rows = measured["rows"]
        # The round's context is input + output / 2: input = context, output 1.
        points = advise(a.bin, model, profile, [r["batch"] for r in rows], int(context), 1,
                        os.path.join(a.dir, f"advise_{dtype}_c{context}.json"))
        for row, pt in zip(rows, points):
            predicted_ms = pt["round"]["total_us"] / 1e3
            err = predicted_ms / row["step_ms"] - 1
            errors.append(err)
            print(f"bench-step {dtype:5s} context {int(context):6d} batch {row['batch']:4d}: measured "
                  f"{row['step_ms']:8.3f} ms predicted {predicted_ms:8.3f} ms ({100 * err:+.1f}%) "
                  f"dominant {dominant(pt['round'])}")
    return errors


def dominant(r):
    terms = {k: r[k] for k in ("weights_us", "kv_us", "flops_us", "layer_overhead_us", "host_us")}
    terms.update(r["collectives_us"])
    return max(terms, key=terms.get)


def compare_serving(a, profile):
    errors = []
    for path in sorted(glob.glob(os.path.join(a.dir, "serve_c*.json"))):
        measured = json.loads(open(path).read().strip().splitlines()[-1])
        c = measured["concurrency"]
        pt = advise(a.bin, f"synthetic:kimi-k2.6:layers={a.layers}", profile, [c], a.input_len, a.output_len,
                    os.path.join(a.dir, f"advise_serve_c{c}.json"))[0]
        err = pt["aggregate_tok_s"] / measured["output_tok_per_s"] - 1
        errors.append(err)
        print(f"serving concurrency {c:3d}: measured {measured['output_tok_per_s']:9.1f} tok/s predicted "
              f"{pt['aggregate_tok_s']:9.1f} ({100 * err:+.1f}%); server decode step "
              f"{measured['server_mean_decode_step_ms']} ms, predicted round {pt['round']['total_us'] / 1e3:.3f} ms")
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
    a = p.parse_args()
    steps = sorted(glob.glob(os.path.join(a.dir, "step_bf16_c*.json")))
    if not steps:
        sys.exit(f"{a.dir}: no step_bf16_c*.json (bench-step did not run)")
    profile = os.path.join(a.dir, "h200-calibrated.json")
    calibrated_profile(a.base_profile, json.load(open(steps[0])), profile)
    summary("bench-step", compare_steps(a, profile), 0.10)
    summary("serving", compare_serving(a, profile), 0.15)


if __name__ == "__main__":
    main()
