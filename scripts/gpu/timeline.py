#!/usr/bin/env python3
"""Per-kernel timeline of one decode step, from tools/kernel_trace.cc's CSV (or an Nsight
Systems sqlite export).

Usage (on the GPU machine; scripts/gpu/profile_step.sh does all of it):
  CUDA_INJECTION64_PATH=$PWD/carry/libkernel_trace.so MOESERVE_KERNEL_TRACE=/tmp/k.csv \
    moeserve bench-step ... --batch 1
  python3 scripts/gpu/timeline.py /tmp/k.csv [--device 0] [--top 45]

Steps are the bursts of kernels on a device separated by an idle gap longer than --gap-us (the
host synchronises between bench-step iterations). Of the bursts with the most common kernel
count, the script keeps the --steps fastest (the CUDA-graph runs; bench-step also runs a step
without graphs to time its collectives) and takes the one of median span. It prints, per kernel
name, its count, summed duration and the idle time before it (no kernel of the device
running), then the step's busy time against its span.
"""
import argparse
import collections
import sqlite3
import statistics


def load_kernels(path, device):
    if path.endswith(".csv"):
        rows = []
        with open(path) as trace:
            for line in trace:
                dev, stream, start, end, name = line.rstrip("\n").split(",", 4)
                if int(dev) == device:
                    rows.append((int(start), int(end), int(stream), name))
        return sorted(rows)
    db = sqlite3.connect(path)
    rows = db.execute(
        "SELECT k.start, k.end, k.streamId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName WHERE k.deviceId = ? ORDER BY k.start",
        (device,)).fetchall()
    return rows


def bursts(kernels, gap_ns):
    out, current, last_end = [], [], None
    for kernel in kernels:
        if last_end is not None and kernel[0] - last_end > gap_ns:
            out.append(current)
            current = []
        current.append(kernel)
        last_end = kernel[1] if last_end is None else max(last_end, kernel[1])
    if current:
        out.append(current)
    return out


def busy_ns(kernels):
    """Union of the kernels' [start, end) intervals (two streams overlap)."""
    total, cursor = 0, None
    for start, end, *_ in sorted(kernels):
        if cursor is None or start >= cursor:
            total += end - start
            cursor = end
        elif end > cursor:
            total += end - cursor
            cursor = end
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sqlite")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--gap-us", type=float, default=40.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--sequence", action="store_true",
                        help="also list the step's kernels in order (start offset, duration)")
    args = parser.parse_args()

    kernels = load_kernels(args.sqlite, args.device)
    groups = bursts(kernels, args.gap_us * 1000)
    counts = collections.Counter(len(g) for g in groups if len(g) > 20)
    if not counts:
        raise SystemExit(f"{args.sqlite}: no burst of more than 20 kernels on device {args.device}")
    size = counts.most_common(1)[0][0]
    steps = [g for g in groups if len(g) == size]
    steps = sorted(steps, key=lambda g: g[-1][1] - g[0][0])[:args.steps]
    spans = [g[-1][1] - g[0][0] for g in steps]
    step = steps[spans.index(sorted(spans)[len(spans) // 2])]
    span = step[-1][1] - step[0][0]
    print(f"device {args.device}: {len(steps)} steps of {size} kernels; span median "
          f"{statistics.median(spans) / 1e3:.1f} us (min {min(spans) / 1e3:.1f}); "
          f"busy {busy_ns(step) / 1e3:.1f} us")

    per_name = collections.defaultdict(lambda: [0, 0, 0])  # count, duration, idle before
    cursor = step[0][0]
    for start, end, _, name in step:
        entry = per_name[name]
        entry[0] += 1
        entry[1] += end - start
        entry[2] += max(0, start - cursor)
        cursor = max(cursor, end)
    print(f"{'kernel':60s} {'n':>4s} {'sum us':>9s} {'mean us':>8s} {'idle before us':>15s}")
    ranked = sorted(per_name.items(), key=lambda item: -item[1][1])
    for name, (count, duration, idle) in ranked[:args.top]:
        print(f"{name[:60]:60s} {count:4d} {duration / 1e3:9.1f} {duration / count / 1e3:8.2f} "
              f"{idle / 1e3:15.1f}")
    if args.sequence:
        for start, end, stream, name in step:
            print(f"  {(start - step[0][0]) / 1e3:8.1f} {(end - start) / 1e3:7.2f} s{stream} {name[:70]}")
    idle_total = sum(v[2] for v in per_name.values())
    print(f"{'(all)':60s} {size:4d} {sum(v[1] for v in per_name.values()) / 1e3:9.1f} "
          f"{'':8s} {idle_total / 1e3:15.1f}")


if __name__ == "__main__":
    main()
