#!/usr/bin/env python3
"""The compact tables of docs/plans.md ("The advisor's tables for Kimi K2.6") from `moeserve plan
advise --json F`: aggregate tok/s (per request), TTFT and the dominating term per plan and
concurrency, the winner, and each plan's memory and what dominates (as plan advise prints them)."""
import json
import sys


def main(path):
    a = json.load(open(path))
    conc = [pt["concurrency"] for pt in a["plans"][0]["points"]]
    print("| plan | " + " | ".join(f"c={c}" for c in conc) + " |")
    print("|---|" + "---|" * len(conc))
    for p in a["plans"]:
        cells = [f"{pt['aggregate_tok_s']:.1f} ({pt['per_request_tok_s']:.1f}), TTFT {pt['ttft_ms']:.0f} ms, "
                 f"{pt['round']['dominant']}" for pt in p["points"]]
        print(f"| {p['plan']} | " + " | ".join(cells) + " |")
    print("| **winner** | " + " | ".join(f"**{a['ranking'][str(c)][0]}**" for c in conc) + " |")
    print()
    print("| plan | memory (fit) | what dominates |")
    print("|---|---|---|")
    for p in a["plans"]:
        print(f"| {p['plan']} | {p['memory']} | {p['reasoning']} |")


if __name__ == "__main__":
    main(sys.argv[1])
