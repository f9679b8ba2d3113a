#!/usr/bin/env python3
"""Where a serving step's time goes on the device, from tools/kernel_trace.cc's CSV of a whole
`moeserve serve` run (scripts/gpu/profile_step.sh times one bench-step step instead).

A step starts at its embedding kernel. Of the steps whose kernel count is the most common one
(the steady decode shape), it prints medians of: the period from one step's start to the next,
the kernels' busy time in it, the idle time (host gaps), the largest gap and the kernel it
precedes, and each kernel's summed time per step (the --top heaviest).

Usage: python3 scripts/gpu/serve_trace.py TRACE.csv [--device 0] [--top 15]
"""
import argparse
import collections
import statistics


def load(path, device):
    kernels = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(",", 4)
            if len(parts) == 5 and int(parts[0]) == device:
                kernels.append((int(parts[2]), int(parts[3]), parts[4]))
    return sorted(kernels)


def short(name):
    return name.split("(")[0].split("<")[0].split("::")[-1]


def steps(kernels, marker):
    starts = [i for i, k in enumerate(kernels) if marker in k[2]]
    return [kernels[a:b] for a, b in zip(starts, starts[1:])], [kernels[b][0] for b in starts[1:]]


def busy(step):
    total, cursor = 0, None
    for start, end, _ in step:
        if cursor is None or start >= cursor:
            total, cursor = total + end - start, end
        elif end > cursor:
            total, cursor = total + end - cursor, end
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--marker", default="embedding_kernel")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    groups, next_starts = steps(load(args.trace, args.device), args.marker)
    count = collections.Counter(len(g) for g in groups).most_common(1)[0][0]
    chosen = [(g, n) for g, n in zip(groups, next_starts) if len(g) == count]
    us = lambda ns: ns / 1000.0  # noqa: E731
    periods = [us(n - g[0][0]) for g, n in chosen]
    busies = [us(busy(g)) for g, _ in chosen]
    largest, before = [], collections.Counter()
    for g, n in chosen:
        gaps = [(g[i + 1][0] - g[i][1], short(g[i + 1][2])) for i in range(len(g) - 1)]
        gaps.append((n - g[-1][1], "(next step)"))
        gap, name = max(gaps)
        largest.append(us(gap))
        before[name] += 1
    print(f"steps: {len(groups)}, of the common shape ({count} kernels): {len(chosen)}")
    print(f"median period {statistics.median(periods):.1f} us, busy {statistics.median(busies):.1f} us, "
          f"idle {statistics.median(p - b for p, b in zip(periods, busies)):.1f} us")
    print(f"median largest gap {statistics.median(largest):.1f} us, before: {before.most_common(3)}")
    per_kernel = collections.defaultdict(list)
    for g, _ in chosen:
        totals = collections.Counter()
        for start, end, name in g:
            totals[short(name)] += end - start
        for name, ns in totals.items():
            per_kernel[name].append(us(ns))
    ranked = sorted(per_kernel.items(), key=lambda kv: -statistics.median(kv[1]))
    for name, values in ranked[:args.top]:
        print(f"  {statistics.median(values):9.1f} us  {name}")


if __name__ == "__main__":
    main()
