#!/usr/bin/env python3
"""Runs one GPU correctness script of scripts/gpu as a ctest test (label `gpu`, tests/CMakeLists.txt).

    ctest_check.py --gpus N [--default-bin PATH] [--report NAME] SCRIPT [SCRIPT ARGS...]

Exits 77 (the tests' SKIP_RETURN_CODE, so ctest reports "skipped", not "passed") when fewer
than N GPUs are visible: nvidia-smi missing or failing counts as none, and CUDA_VISIBLE_DEVICES
limits the count. Otherwise runs `SCRIPT --moeserve BIN --out gpu-reports/<NAME or script>.json ARGS`
and exits with its status. BIN is $MOESERVE_BIN when set (e.g. a carried binary on the GPU
machine), else --default-bin (the build's own binary, given relative to the test's directory
so that a build tree copied elsewhere still finds it). The scripts stay runnable by hand.
"""
import argparse
import os
import pathlib
import subprocess
import sys

SKIPPED = 77


def visible_gpus():
    """How many GPUs this process may use: nvidia-smi's list, cut to CUDA_VISIBLE_DEVICES."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    count = sum(line.startswith("GPU ") for line in out.stdout.splitlines())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        kept = 0
        for device in visible.split(","):
            if device.strip() in ("", "-1"):  # CUDA ignores this entry and every one after it
                break
            kept += 1
        count = min(count, kept)
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs the check needs")
    parser.add_argument("--default-bin", default="build/bin/moeserve", help="moeserve when $MOESERVE_BIN is unset")
    parser.add_argument("--report", help="the JSON report's name under gpu-reports/ (default: the script's)")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()

    have = visible_gpus()
    if have < args.gpus:
        print(f"skipped: {pathlib.Path(args.script).name} needs {args.gpus} GPU(s), {have} visible")
        return SKIPPED
    binary = pathlib.Path(os.environ.get("MOESERVE_BIN") or args.default_bin).resolve()
    if not binary.is_file():
        print(f"error: no moeserve binary at {binary} (set MOESERVE_BIN)")
        return 1
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on the lent machines
    reports = pathlib.Path("gpu-reports")
    reports.mkdir(exist_ok=True)
    out = reports / ((args.report or pathlib.Path(args.script).stem) + ".json")
    command = [sys.executable, args.script, "--moeserve", str(binary), "--out", str(out), *args.script_args]
    print("running:", " ".join(command), flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
