"""Speculative decoding through the server (issue 21): with --speculative-algorithm NGRAM, greedy
completions equal `moeserve generate` without speculation, token for token, for prompts with
repetition sent at once (continuous batching, speculative and logprob requests side by side);
the usage reports spec_verify_ct and spec_accept_length as SGLang's meta info does, /metrics
counts drafts and accepted ones, and `moeserve bench` reports accept_length. With NEXTN (the
shipped default model's MTP layer as the drafter) greedy completions of held-out text equal
`moeserve generate` without speculation and drafts are accepted. These run with
--speculative-fixed-drafts, so that their accept counts do not depend on the machine's timing; by
default the drafts of each step are chosen from measured step costs (spec/draft_budget.h), which
changes no output token (greedy or seeded) and is reported as moeserve_spec_draft_budget. Other
algorithms are refused at start-up with a clear message."""
import json
import pathlib
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, generate_ids, run_moeserve  # noqa: E402

DEFAULT_MODEL = pathlib.Path(__file__).resolve().parents[3] / "models" / "default"

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [9, 9, 9, 9, 9, 9], [1, 2, 1, 2, 1, 2, 1], [100, 200, 300, 100, 200]]
NEW_TOKENS = 24
SPEC = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5", "--max-running-requests", "8",
        "--speculative-fixed-drafts"]


def complete(server, prompt, model=MODEL, **extra):
    status, body = server.request("POST", "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True, **extra})
    assert status == 200, body
    return body


def test_greedy_completions_equal_plain_generate_and_report_accept_length():
    expected = generate_ids(PROMPTS, n=NEW_TOKENS, extra=["--ignore-eos"])
    with Server(*SPEC, "--page-size", "4") as server:
        with ThreadPoolExecutor(len(PROMPTS) + 1) as pool:
            bodies = list(pool.map(lambda p: complete(server, p), PROMPTS))
            with_logprobs = pool.submit(complete, server, PROMPTS[0], logprobs=2).result()
        verify_steps = 0
        for prompt, want, body in zip(PROMPTS, expected, bodies):
            assert body["choices"][0]["token_ids"] == want, f"prompt {prompt}"
            usage = body["usage"]
            assert usage["completion_tokens"] == NEW_TOKENS
            verify_steps += usage.get("spec_verify_ct", 0)
            if "spec_verify_ct" in usage:
                assert 1.0 <= usage["spec_accept_length"] <= 5.0
        assert verify_steps > 0, "no request speculated"
        # A logprobs request runs without drafts and reports no speculation.
        assert with_logprobs["choices"][0]["token_ids"] == expected[0]
        assert "spec_verify_ct" not in with_logprobs["usage"]
        metrics = server.metrics()
        assert metrics["moeserve_spec_verify_steps_total"] >= verify_steps
        assert 0 < metrics["moeserve_spec_accepted_tokens_total"] <= metrics["moeserve_spec_draft_tokens_total"]
        assert metrics["moeserve_spec_accept_length"] > 1.0
        assert metrics["moeserve_spec_draft_budget"] == 4
        assert metrics["moeserve_kv_pages_used"] == 0


def test_a_streamed_speculative_step_sends_its_tokens_in_one_chunk():
    # A request's accepted drafts and next token reach its stream as one event, one SSE chunk
    # (as SGLang streams a speculative step), and the chunks still carry every token in order.
    expected = generate_ids(PROMPTS[:1], n=NEW_TOKENS, extra=["--ignore-eos"])[0]
    with Server(*SPEC, "--page-size", "4") as server:
        status, text = server.request("POST", "/v1/completions", {
            "model": MODEL, "prompt": PROMPTS[0], "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True})
    assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    ids = [c["choices"][0].get("token_ids", []) for c in chunks if c.get("choices")]
    assert [t for chunk in ids for t in chunk] == expected
    assert max(len(chunk) for chunk in ids) > 1, ids
    assert len([chunk for chunk in ids if chunk]) < NEW_TOKENS


def test_adaptive_draft_budget_changes_no_token():
    """The default budget: greedy and seeded sampled completions equal those without speculation."""
    expected = generate_ids(PROMPTS, n=NEW_TOKENS, extra=["--ignore-eos"])
    sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 7}
    with Server("--max-running-requests", "8") as plain:
        want_sampled = [complete(plain, p, **sampled)["choices"][0]["token_ids"] for p in PROMPTS]
    with Server(*SPEC[:-1], "--page-size", "4") as server:
        for _ in range(3):  # enough steps for the budget to measure its candidates
            with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
                greedy = list(pool.map(lambda p: complete(server, p), PROMPTS))
                seeded = list(pool.map(lambda p: complete(server, p, **sampled), PROMPTS))
            assert [b["choices"][0]["token_ids"] for b in greedy] == expected
            assert [b["choices"][0]["token_ids"] for b in seeded] == want_sampled
        metrics = server.metrics()
        assert 0 <= metrics["moeserve_spec_draft_budget"] <= 4
        assert metrics["moeserve_kv_pages_used"] == 0


def test_bench_reports_accept_length(tmp_path):
    out = tmp_path / "bench.jsonl"
    with Server(*SPEC) as server:
        # Ids from a vocabulary of 8: every prompt repeats, so NGRAM drafts.
        run_moeserve("bench", "--base-url", server.base, "--num-prompts", 4, "--dataset", "random-ids",
                     "--vocab-size", 8, "--random-input-len", 16, "--random-output-len", 16, "--disable-tqdm",
                     "--output-file", out)
    record = json.loads(out.read_text().strip().splitlines()[-1])
    assert record["completed"] == 4
    assert record["accept_length"] >= 1.0


def heldout_prompts(lengths):
    """Prompts of the given lengths cut from the default model's held-out text (its tokenizer)."""
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json")).encode(
        (DEFAULT_MODEL / "heldout.txt").read_text()).ids
    return [ids[300 * i:300 * i + n] for i, n in enumerate(lengths)]


def test_nextn_greedy_completions_equal_plain_generate_on_the_default_model():
    prompts = heldout_prompts((24, 40, 7, 64, 16))
    args = ["generate", "--model", DEFAULT_MODEL, "-n", NEW_TOKENS, "--ignore-eos"]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    expected = [[int(t) for t in line.split(",")] for line in run_moeserve(*args).stdout.strip().splitlines()]
    with Server("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--page-size", "4",
                "--max-running-requests", "8", "--speculative-fixed-drafts", model=None) as server:
        with ThreadPoolExecutor(len(prompts)) as pool:
            bodies = list(pool.map(lambda p: complete(server, p, model="default"), prompts))
        accepted = 0
        for prompt, want, body in zip(prompts, expected, bodies):
            assert body["choices"][0]["token_ids"] == want, f"prompt {prompt}"
            accepted += body["usage"].get("spec_accept_length", 1.0) > 1.0
        assert accepted > 0, "the trained MTP layer's drafts were never accepted"
        assert server.metrics()["moeserve_kv_pages_used"] == 0


def test_unimplemented_algorithms_are_refused():
    result = run_moeserve("serve", "--speculative-algorithm", "EAGLE3", check=False)
    assert result.returncode != 0
    assert "--speculative-algorithm EAGLE3: not implemented yet" in result.stderr + result.stdout
