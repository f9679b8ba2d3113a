"""`moeserve bench` against a local server on synthetic:tiny: every request completes, the
token counts add up to what was asked (ignore_eos), percentiles are ordered, and the
throughputs are the tokens over the duration."""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "serve"))
from server_harness import Server, run_moeserve  # noqa: E402


def read_runs(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def check_run(run, num_prompts):
    assert len(run["output_lens"]) == num_prompts
    assert sum(run["output_lens"]) == run["total_output_tokens"]
    assert sum(run["input_lens"]) == run["total_input_tokens"]
    assert all(len(ids) == n for ids, n in zip(run["output_ids"], run["output_lens"]))
    assert sum(run["ttfts"]) > 0 and all(t <= run["duration"] for t in run["ttfts"])
    check_run_totals(run, num_prompts)


def check_run_totals(run, num_prompts):
    """What a run's summary alone must satisfy: counts, throughput = tokens / duration,
    ordered percentiles."""
    assert run["completed"] == num_prompts and run["failed"] == 0
    d = run["duration"]
    assert run["request_throughput"] == pytest.approx(num_prompts / d, rel=1e-9)
    assert run["input_throughput"] == pytest.approx(run["total_input_tokens"] / d, rel=1e-9)
    assert run["output_throughput"] == pytest.approx(run["total_output_tokens"] / d, rel=1e-9)
    assert run["total_throughput"] == pytest.approx(
        (run["total_input_tokens"] + run["total_output_tokens"]) / d, rel=1e-9)
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        assert 0 < run[f"median_{metric}"] <= run[f"p90_{metric}"] <= run[f"p99_{metric}"], metric
        assert run[f"mean_{metric}"] > 0
    assert run["mean_ttft_ms"] <= run["mean_e2e_latency_ms"]
    assert 0 < run["concurrency"] <= run["max_concurrency"] + 1e-6


def test_bench_random_ids_numbers_are_consistent(tmp_path):
    out = tmp_path / "bench.jsonl"
    with Server() as server:
        proc = run_moeserve("bench", "--base-url", server.base, "--concurrency", "1,8", "--num-prompts", 24,
                            "--dataset", "random-ids", "--random-input-len", 48, "--random-output-len", 12,
                            "--random-range-ratio", 0.5, "--seed", 3, "--output-file", out, "--output-details")
    assert "Successful requests:" in proc.stdout and "Output token throughput" in proc.stdout
    assert "24/24 requests done" in proc.stderr  # plain progress lines off a terminal
    runs = read_runs(out)
    assert [r["max_concurrency"] for r in runs] == [1, 8]
    for run in runs:
        check_run(run, 24)
        assert all(24 <= n <= 48 for n in run["input_lens"])  # ids: the server counts what we sent
        assert all(6 <= n <= 12 for n in run["output_lens"])  # ignore_eos: exactly max_tokens
    # Same prompts, greedy: the outputs do not depend on the concurrency.
    assert runs[0]["output_ids"] == runs[1]["output_ids"]
    assert runs[0]["input_lens"] == runs[1]["input_lens"]


def test_bench_text_prompts_request_rate_and_api_key(tmp_path):
    out = tmp_path / "bench.jsonl"
    with Server("--api-key", "k3y") as server:
        refused = run_moeserve("bench", "--base-url", server.base, "--model", "synthetic:tiny", "--num-prompts", 2,
                               check=False)
        assert refused.returncode != 0 and "HTTP 401" in refused.stderr
        run_moeserve("bench", "--base-url", server.base, "--api-key", "k3y", "--dataset", "random",
                     "--num-prompts", 12, "--concurrency", 4, "--random-input-len", 20, "--random-output-len", 6,
                     "--random-range-ratio", 1, "--request-rate", 200, "--output-file", out, "--output-details")
    (run,) = read_runs(out)
    check_run(run, 12)
    assert run["request_rate"] == 200 and run["dataset_name"] == "random"
    assert all(n == 6 for n in run["output_lens"])
    assert all(n >= 20 for n in run["input_lens"])  # 20 words: at least a token each


def test_bench_sharegpt_output_lengths_are_the_replies_token_counts(tmp_path):
    # The synthetic tokenizer is byte-level: a reply of N ASCII bytes is N tokens.
    replies = ["the reply of the first conversation", "second answer, a bit longer than the first one", "ok ok"]
    data = [{"conversations": [{"from": "human", "value": f"question number {i} about things"},
                               {"from": "gpt", "value": reply}]} for i, reply in enumerate(replies)]
    data.append({"conversations": [{"from": "human", "value": "a single turn"}]})
    (tmp_path / "sharegpt.json").write_text(json.dumps(data))
    out = tmp_path / "bench.jsonl"
    with Server() as server:
        run_moeserve("bench", "--base-url", server.base, "--dataset", f"sharegpt:{tmp_path / 'sharegpt.json'}",
                     "--tokenizer", "synthetic", "--num-prompts", 10, "--concurrency", 2,
                     "--output-file", out, "--output-details")
        missing = run_moeserve("bench", "--base-url", server.base, "--dataset",
                               f"sharegpt:{tmp_path / 'sharegpt.json'}", check=False)
        assert missing.returncode != 0 and "--tokenizer" in missing.stderr
    (run,) = read_runs(out)
    check_run(run, 3)
    assert sorted(run["output_lens"]) == sorted(len(r) for r in replies)


def test_bench_flag_errors_name_the_flag():
    for args, flag in ((["--base-url", "https://x:1"], "--base-url"),
                       (["--base-url", "http://127.0.0.1:1", "--model", "m", "--concurrency", "0"], "--concurrency"),
                       (["--base-url", "http://127.0.0.1:1", "--model", "m", "--request-rate", "-1"], "--request-rate"),
                       (["--base-url", "http://127.0.0.1:1", "--model", "m", "--dataset", "x"], "--dataset")):
        proc = run_moeserve("bench", *args, check=False)
        assert proc.returncode != 0 and flag in proc.stderr, (args, proc.stderr)
