"""`moeserve sweep` on CPU ranks (synthetic:tiny; tp2, ep2, pp2, ep2-dp and an impossible tp3;
concurrency 1, 4, 16): one server driven through the plans by re-plan writes sweep.json,
sweep.md and sweep.html; sweep.json's numbers are the bench runs it recorded (bench.jsonl),
the best plan per concurrency is the highest output throughput, tp3 is skipped with the
reason, and every plan's greedy outputs are compared with the first plan's, request by
request. Under --reduction-plan the plans that nest in it give the first plan's outputs
exactly and the others are skipped with the reason."""
import json
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "serve"))
from server_harness import run_moeserve  # noqa: E402
from test_bench import check_run_totals  # noqa: E402

PLANS = ["tp2", "ep2", "pp2", "ep2-dp"]
LEVELS = [1, 4, 16]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    proc = run_moeserve("sweep", "--model", "synthetic:tiny", "--plans", ",".join(PLANS + ["tp3"]),
                        "--concurrency", ",".join(map(str, LEVELS)), "--backend", "cpu", "--out", out,
                        "--random-input-len", 32, "--random-output-len", 12, timeout=600)
    return out, proc


def test_sweep_writes_three_files_that_agree_with_its_bench_runs(sweep):
    out, proc = sweep
    for name in ("sweep.json", "sweep.md", "sweep.html", "bench.jsonl", "server.log"):
        assert (out / name).stat().st_size > 0, name
    result = json.loads((out / "sweep.json").read_text())
    runs = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines()]
    assert [(p["plan"], p["max_concurrency"]) for p in result["points"]] == [(p, c) for p in PLANS for c in LEVELS]
    assert [(r["plan"], r["max_concurrency"]) for r in runs] == [(p, c) for p in PLANS for c in LEVELS]
    for point, run in zip(result["points"], runs):
        check_run_totals(run, 4 * run["max_concurrency"])
        for field, value in run.items():
            if field in point:
                assert point[field] == value, (point["plan"], point["max_concurrency"], field)
        assert point["per_request_output_throughput"] == pytest.approx(1000 / point["mean_tpot_ms"])
    assert result["skipped"] == [{"plan": "tp3", "reason": result["skipped"][0]["reason"]}]
    assert "divisible" in result["skipped"][0]["reason"]
    assert [(s["plan"], s["how"]) for s in result["switches"]] == \
        [("tp2", "cold start"), ("ep2", "re-plan"), ("pp2", "re-plan"), ("ep2-dp", "re-plan")]
    for level in LEVELS:
        at = [p for p in result["points"] if p["max_concurrency"] == level]
        best = max(at, key=lambda p: p["output_throughput"])["plan"]
        assert result["best_plan_by_concurrency"][str(level)] == best
    assert "skipping tp3" in proc.stdout
    assert result["reference_plan"] == "tp2" and result["reduction_plan"] == "single"
    assert result["batch_invariant"] is False
    for point in result["points"]:
        expected = 0 if point["plan"] == "tp2" else 4 * point["max_concurrency"]
        assert point["outputs_compared"] == expected, (point["plan"], point["max_concurrency"])
        assert 0 <= point["outputs_equal_reference"] <= expected


def test_sweep_markdown_tables_and_best_plan(sweep):
    out, _ = sweep
    md = (out / "sweep.md").read_text()
    result = json.loads((out / "sweep.json").read_text())
    for heading in ("## output tok/s", "## per-request tok/s", "## mean TTFT (ms)", "## mean TPOT (ms)",
                    "## Best plan per concurrency", "## Skipped plans"):
        assert heading in md, heading
    assert "| plan | c=1 | c=4 | c=16 |" in md
    for plan in PLANS:
        assert re.search(rf"^\| {re.escape(plan)} \|( [0-9.]+ \|){{3}}$", md, re.M), plan
    for level, plan in result["best_plan_by_concurrency"].items():
        assert re.search(rf"^\| {level} \| {re.escape(plan)} \| [0-9.]+ \|$", md, re.M), (level, plan)


def test_sweep_html_is_self_contained_with_two_charts(sweep):
    out, _ = sweep
    html = (out / "sweep.html").read_text()
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    for chart in ("chart-aggregate", "chart-per-request"):
        svg = re.search(rf'<svg id="{chart}".*?</svg>', html, re.S).group(0)
        assert "concurrency (requests in flight)" in svg and 'class="y-label"' in svg
        assert re.findall(r'class="legend-entry"[^>]*>([^<]+)<', svg) == PLANS
        assert len(re.findall(r'<polyline class="series"', svg)) == len(PLANS)
        assert re.findall(r'class="x-tick"[^>]*>([^<]+)<', svg) == [str(c) for c in LEVELS]
    # Everything the Markdown has: the best plan's tok/s per concurrency and the switch times.
    result = json.loads((out / "sweep.json").read_text())
    md = (out / "sweep.md").read_text()
    for level, plan in result["best_plan_by_concurrency"].items():
        tok_s = re.search(rf"^\| {level} \| {re.escape(plan)} \| ([0-9.]+) \|$", md, re.M).group(1)
        assert f"<tr><td>{level}</td><td>{plan}</td><td>{tok_s}</td></tr>" in html, (level, plan)
    for switch in result["switches"]:
        assert f"<tr><td>{switch['plan']}</td><td>{switch['how']}</td><td>{switch['time_to_ready_s']:.3f}</td>" in html



def test_sweep_under_a_reduction_plan_gives_the_first_plans_outputs(tmp_path):
    # --batch-invariant reaches the servers (CPU ranks are batch-invariant with or without it).
    proc = run_moeserve("sweep", "--model", "synthetic:tiny", "--plans", "single,tp2,ep2,pp2,tp2pp2",
                        "--concurrency", "1,4", "--backend", "cpu", "--out", tmp_path, "--reduction-plan", "tp2",
                        "--batch-invariant", "--random-input-len", 32, "--random-output-len", 12, timeout=600)
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["reduction_plan"] == "tp2" and result["reference_plan"] == "single"
    assert result["batch_invariant"] is True
    assert [s["plan"] for s in result["skipped"]] == ["ep2"]
    assert "--reduction-plan tp2" in result["skipped"][0]["reason"]
    assert sorted({p["plan"] for p in result["points"]}) == ["pp2", "single", "tp2", "tp2pp2"]
    for point in result["points"]:
        if point["plan"] != "single":
            assert point["outputs_compared"] == 4 * point["max_concurrency"]
            assert point["outputs_equal_reference"] == point["outputs_compared"], point["plan"]
    assert "sweep: 60 of 60 greedy outputs equal single's (reduction plan tp2)" in proc.stdout
    md = (tmp_path / "sweep.md").read_text()
    assert "## Greedy outputs equal to single's (requests)" in md and "| tp2pp2 | 4 / 4 | 16 / 16 |" in md
    assert "reduction plan tp2, batch-invariant kernels" in md
