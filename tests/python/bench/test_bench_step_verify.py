"""`moeserve bench-step --verify-tokens`: speculative verify steps of several tokens per sequence
beside the 1-token step (issue 21, acceptance 3), on CPU ranks. What is checked is what the
report derives, not the machine's speed: every width's rows, the KV cache counted once per
sequence whatever its tokens, each cost ratio t(w) / t(1) and, from the accept length on, the
expected speedup L / ratio; bad widths and accept lengths are refused by name."""
import json

import pytest

from conftest import run_moeserve

MODEL = ["--model", "synthetic:tiny", "--backend", "cpu", "--context", 40, "--page-size", 8,
         "--iterations", 2, "--warmup", 1]


def bench(tmp_path, *extra):
    out = tmp_path / "step.json"
    proc = run_moeserve("bench-step", *MODEL, "--json", out, *extra)
    return proc.stdout, json.loads(out.read_text())


def test_verify_widths_are_reported_against_the_one_token_step(tmp_path):
    stdout, doc = bench(tmp_path, "--batch", "1,3", "--verify-tokens", "2,4,8", "--accept-length", 3)
    assert "verify steps against the 1-token step" in stdout, stdout
    assert [r["batch"] for r in doc["rows"]] == [1, 3]
    assert all(r["tokens_per_seq"] == 1 for r in doc["rows"])
    verify = {(r["batch"], r["tokens_per_seq"]): r for r in doc["verify_rows"]}
    assert sorted(verify) == [(b, w) for b in (1, 3) for w in (2, 4, 8)]
    one = {r["batch"]: r for r in doc["rows"]}
    for (batch, width), row in verify.items():
        # tok/s counts every token the step computes.
        assert row["tokens_per_s"] == pytest.approx(batch * width / (row["step_ms"] * 1e-3), rel=1e-9)
    assert doc["accept_length"] == 3
    summary = {(r["batch"], r["tokens_per_seq"]): r for r in doc["verify"]}
    assert sorted(summary) == [(b, w) for b in (1, 3) for w in (1, 2, 4, 8)]
    for (batch, width), s in summary.items():
        step_ms = one[batch]["step_ms"] if width == 1 else verify[(batch, width)]["step_ms"]
        assert s["cost_ratio"] == pytest.approx(step_ms / one[batch]["step_ms"], rel=1e-9)
        if width >= 3:  # an accept length of 3 needs 3 tokens per sequence
            assert s["expected_speedup"] == pytest.approx(3 / s["cost_ratio"], rel=1e-9)
        else:
            assert "expected_speedup" not in s


def test_a_verify_step_reads_each_sequence_cache_once(tmp_path):
    _, doc = bench(tmp_path, "--batch", "2", "--verify-tokens", "1,4")
    one, four = doc["rows"][0], doc["verify_rows"][0]
    assert four["tokens_per_seq"] == 4
    # The same 40 cached tokens per sequence, read once by its 4 tokens; 4 times the FLOPs.
    assert one["kv_bytes_rank0"] > 0
    assert four["kv_bytes_rank0"] == one["kv_bytes_rank0"]
    assert four["tflops_per_gpu"] * four["step_ms"] > 3.5 * one["tflops_per_gpu"] * one["step_ms"]


@pytest.mark.parametrize("flag, value, message", [
    ("--verify-tokens", "0", "--verify-tokens: tokens per sequence must be in [1, 64], got 0"),
    ("--verify-tokens", "65", "--verify-tokens: tokens per sequence must be in [1, 64], got 65"),
    ("--accept-length", "0.5", "--accept-length: tokens per verify step must be >= 1, got 0.5"),
])
def test_bad_widths_are_refused_by_name(flag, value, message):
    proc = run_moeserve("bench-step", *MODEL, "--batch", 1, flag, value, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
