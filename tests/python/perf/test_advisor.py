"""The plan advisor through the CLI (issue 22): `plan advise` on the repository's profiles, its
JSON and errors, and acceptance 1: on CPU ranks, `plan calibrate` then a `sweep --hardware` of 6
plans x 3 concurrencies, every point within +-20% of the prediction and the plans of each
concurrency in the measured order where they differ by more than 20%."""
import itertools
import json
import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import REPO, run_moeserve  # noqa: E402

K26 = str(REPO / "tests" / "data" / "configs" / "kimi-k2.6.config.json")
PLANS = ["tp8", "pp8", "ep8", "ep8-dp", "ep4tp2", "tp2pp4"]


def test_advise_k26_on_h200_json_and_markdown(tmp_path):
    out = tmp_path / "advice.json"
    proc = run_moeserve("plan", "advise", "--model", K26, "--hardware", "h200-sxm-x8", "--plans", ",".join(PLANS),
                        "--concurrency", "1,8,32,64", "--input-len", "1024", "--output-len", "256", "--json", out)
    advice = json.loads(out.read_text())
    assert [p["plan"] for p in advice["plans"]] == PLANS
    for plan in advice["plans"]:
        assert [pt["concurrency"] for pt in plan["points"]] == [1, 8, 32, 64]
        for pt in plan["points"]:
            r = pt["round"]
            parts = (r["weights_us"] + r["kv_us"] + r["flops_us"] + r["layer_overhead_us"] + r["pp_bubble_us"]
                     + r["host_us"] + sum(r["collectives_us"].values()))
            assert parts == pytest.approx(r["total_us"], rel=1e-9)
            assert pt["aggregate_tok_s"] == pytest.approx(pt["concurrency"] * pt["per_request_tok_s"], rel=1e-9)
    for c, order in advice["ranking"].items():
        fitting = [p["plan"] for p in advice["plans"] if p["fits"]]
        assert sorted(order) == sorted(fitting)
        if order:
            assert f"Winner at concurrency {c}: **{order[0]}**" in proc.stdout
    assert "### Concurrency 64" in proc.stdout and "dominating term" in proc.stdout


def test_advise_errors_name_the_problem(tmp_path):
    proc = run_moeserve("plan", "advise", "--model", K26, "--hardware", "no-such-gpu", check=False)
    assert proc.returncode != 0 and "--hardware 'no-such-gpu'" in proc.stderr and "h200-sxm-x8" in proc.stderr
    bad = json.loads((REPO / "perf" / "profiles" / "h200-sxm-x8.json").read_text())
    del bad["fields"]["memory_gbs"]["source"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    proc = run_moeserve("plan", "advise", "--model", K26, "--hardware", path, check=False)
    assert proc.returncode != 0 and "field 'memory_gbs' has no source" in proc.stderr


def measured_order_violations(points, concurrency):
    """Pairs of plans at one concurrency that the prediction orders against the measurement while
    their measured throughputs differ by more than 20%."""
    at = {p["plan"]: p for p in points if p["max_concurrency"] == concurrency}
    bad = []
    for a, b in itertools.combinations(at, 2):
        ma, mb = at[a]["output_throughput"], at[b]["output_throughput"]
        pa, pb = at[a]["predicted_output_throughput"], at[b]["predicted_output_throughput"]
        if max(ma, mb) > 1.2 * min(ma, mb) and (ma > mb) != (pa > pb):
            bad.append((a, b, ma, mb, pa, pb))
    return bad


# Issue 22's acceptance line 1, not yet shown to pass (docs/benchmarks-log.md has the runs): a timed
# sweep (~10 minutes on an idle 2-core machine: every point 3 times, the median run kept), run by
# `MOESERVE_ADVISOR_ACCEPTANCE=1 ctest -R py_perf_test_advisor` (ctest's entry runs alone and gets
# the time it needs then).
@pytest.mark.skipif(os.environ.get("MOESERVE_ADVISOR_ACCEPTANCE") != "1",
                    reason="the timed acceptance sweep runs with MOESERVE_ADVISOR_ACCEPTANCE=1")
def test_calibrated_advisor_predicts_a_cpu_sweep(tmp_path):
    # Calibrate in the same run, right before the sweep, so that both see the same machine load;
    # calibrate keeps the least disturbed of 3 rounds of each timing, the sweep the median of 3
    # runs of each point (a burst of load on a shared machine moves one run by more than 20%).
    profile = tmp_path / "cpu.json"
    run_moeserve("plan", "calibrate", "--out", profile, "--devices", "8", "--scale", "0.5")
    sweep = tmp_path / "sweep"
    run_moeserve("sweep", "--model", "synthetic:small", "--plans", ",".join(PLANS), "--concurrency", "1,8,32",
                 "--dataset", "random-ids", "--vocab-size", "4096", "--random-input-len", "64",
                 "--random-output-len", "32", "--random-range-ratio", "1", "--repeats", "3", "--hardware", profile,
                 "--out", sweep, timeout=1700)
    result = json.loads((sweep / "sweep.json").read_text())
    points = result["points"]
    assert len(points) == len(PLANS) * 3
    runs = [json.loads(line) for line in (sweep / "bench.jsonl").read_text().splitlines()]
    assert len(runs) == 3 * len(points)
    for p in points:  # the point is the median of its 3 runs
        at = sorted(r["output_throughput"] for r in runs
                    if (r["plan"], r["max_concurrency"]) == (p["plan"], p["max_concurrency"]))
        assert p["output_throughput"] == at[1]
    report = "\n".join(f"{p['plan']:7s} c={p['max_concurrency']:<3d} measured {p['output_throughput']:8.1f} "
                       f"predicted {p['predicted_output_throughput']:8.1f} ({100 * p['prediction_error']:+.0f}%)"
                       for p in points)
    print(report)
    assert "predicted by the plan advisor" in (sweep / "sweep.md").read_text()
    outside = [p for p in points if abs(p["prediction_error"]) > 0.20]
    assert not outside, "points outside +-20%:\n" + report
    for c in (1, 8, 32):
        assert not measured_order_violations(points, c), f"c={c}: ranked against the measurement:\n" + report
