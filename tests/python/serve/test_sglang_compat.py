"""What SGLang's and vLLM's users point at a server: SGLang's published Grafana dashboard reads
every series it queries (with a model_name label) from /metrics, the exposition parses with
prometheus_client's parser and passes promtool's checks (promlint.py), and the native routes (/generate, /get_server_info, /tokenize,
/detokenize, /health_generate, /version) answer in those projects' shapes."""
import json
import pathlib
import re
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import promlint  # noqa: E402
from server_harness import MODEL, Server  # noqa: E402

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "data" / "sglang_grafana_dashboard.json"
# PromQL words that are not series: functions, aggregations, modifiers.
PROMQL_WORDS = {"histogram_quantile", "sum", "avg", "rate", "increase", "by", "le", "without", "max", "min"}


@pytest.fixture(scope="module")
def server():
    with Server("--max-running-requests", "4", "--skip-server-warmup") as s:
        yield s


def dashboard_series():
    """Every (panel title, series name) a panel's PromQL reads."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    out = []
    for panel in panels:
        for target in panel["targets"]:
            expr = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"', " ", target["expr"])  # drop selectors, ranges, strings
            names = [w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr) if w not in PROMQL_WORDS]
            assert names, f"panel {panel['title']!r}: no series in {target['expr']!r}"
            out += [(panel["title"], n) for n in names]
    return out


def exposed_samples(server):
    status, text = server.request("GET", "/metrics")
    assert status == 200
    return list(text_string_to_metric_families(text)), text


def test_every_dashboard_series_is_exposed_with_model_name(server):
    status, _ = server.request("POST", "/v1/completions",
                               {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0})
    assert status == 200
    families, _ = exposed_samples(server)
    samples = {}
    for family in families:
        for s in family.samples:
            samples.setdefault(s.name, []).append(s.labels)
    series = dashboard_series()
    assert len(series) >= 8
    for title, name in series:
        assert name in samples, f"panel {title!r} reads {name}, which /metrics does not expose"
        assert all(labels.get("model_name") == MODEL for labels in samples[name]), (title, name, samples[name])
    # The request above is in the e2e histogram and the token counters.
    count = [s for f in families for s in f.samples if s.name == "sglang:e2e_request_latency_seconds_count"]
    assert count[0].value == 1


def test_exposition_parses_and_names_are_prometheus_clean(server):
    families, text = exposed_samples(server)
    # promtool check metrics's rules (promlint.py: its two sglang: waivers and why).
    assert promlint.lint(text) == []
    # moeserve's own series sit beside SGLang's.
    names = [f.name for f in families]
    assert "moeserve_kv_pages_capacity" in names and "moeserve_plan_info" in names and "moeserve_replans" in names


def test_the_lint_finds_what_promtool_reports():
    """The checker is not vacuous: each of promtool's complaints on a bad exposition."""
    bad = "\n".join([
        "# HELP requestsServed x", "# TYPE requestsServed counter", "requestsServed 1",
        "# TYPE pages_total gauge", "pages_total 2",
        "# HELP latency_ms x", "# TYPE latency_ms gauge", "latency_ms 3",
        "# HELP wait_milliseconds x", "# TYPE wait_milliseconds gauge", "wait_milliseconds 3",
        "# HELP step_seconds x", "# TYPE step_seconds histogram",
        'step_seconds_bucket{le="1"} 3', 'step_seconds_bucket{le="+Inf"} 2', "step_seconds_count 2",
        "step_seconds_sum 1", ""])
    problems = "\n".join(promlint.lint(bad))
    for expected in ["requestsServed: metric names should be written in 'snake_case'",
                     'requestsServed: counter metrics should have "_total" suffix',
                     'pages_total: non-counter metrics should not have "_total" suffix', "pages_total: no help text",
                     "latency_ms: metric names should not contain abbreviated units ('ms')",
                     "wait_milliseconds: use base unit 'seconds' instead of 'milliseconds'",
                     "step_seconds{}: buckets not cumulative"]:
        assert expected in problems, problems


def test_native_generate_text_ids_batch_and_stream(server):
    status, one = server.request("POST", "/generate", {"text": "hello", "sampling_params": {
        "max_new_tokens": 5, "temperature": 0, "ignore_eos": True}})
    assert status == 200, one
    assert len(one["output_ids"]) == 5 and one["meta_info"]["completion_tokens"] == 5
    assert one["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert one["meta_info"]["prompt_tokens"] == len("hello".encode())
    # The same request on /v1/completions gives the same tokens (both greedy).
    status, oa = server.request("POST", "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 5,
                                                            "temperature": 0, "ignore_eos": True,
                                                            "return_token_ids": True})
    assert status == 200
    assert oa["choices"][0]["token_ids"] == one["output_ids"]
    status, batch = server.request("POST", "/generate", {"input_ids": [[1, 2], [3, 4, 5]], "sampling_params": {
        "max_new_tokens": 2, "temperature": 0, "ignore_eos": True}})
    assert status == 200 and isinstance(batch, list) and len(batch) == 2
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == [2, 3]
    status, text = server.request("POST", "/generate", {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
    assert status == 200
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert text.rstrip().endswith("data: [DONE]")
    # Cumulative, as SGLang streams: each chunk holds every token so far. A writer that falls behind the
    # engine (a loaded machine) gets several tokens in one event, so the count per chunk is not fixed.
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(set(counts)) and counts[-1] == 4, counts
    for chunk in chunks:
        assert len(chunk["output_ids"]) == chunk["meta_info"]["completion_tokens"]
        assert chunks[-1]["output_ids"][:len(chunk["output_ids"])] == chunk["output_ids"]


@pytest.mark.parametrize("body, field", [
    ({"text": "a", "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
    ({"text": "a", "return_logprob": True}, "return_logprob"),
    ({"text": "a", "lora_path": "x"}, "lora_path"),
    ({"text": "a", "sampling_params": {"no_such": 1}}, "sampling_params.no_such"),
    ({"text": "a", "input_ids": [1]}, "input_ids"),
    ({"text": "a", "bogus": 1}, "bogus"),
])
def test_native_generate_refuses_what_it_does_not_honour(server, body, field):
    status, error = server.request("POST", "/generate", body)
    assert status == 400, error
    assert error["error"]["param"] == field


def test_tokenize_detokenize_server_info_health_version(server):
    status, tok = server.request("POST", "/tokenize", {"prompt": "hi there"})
    assert status == 200
    assert tok["tokens"] == list("hi there".encode()) and tok["count"] == 8 and tok["max_model_len"] > 0
    status, chat = server.request("POST", "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and chat["count"] > 2  # the chat template's markers around the message
    status, detok = server.request("POST", "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and detok == {"prompt": "hi there"}
    assert server.request("POST", "/detokenize", {"tokens": [-1]})[0] == 400
    for path in ("/get_server_info", "/server_info"):
        status, info = server.request("GET", path)
        assert status == 200
        assert info["max_running_requests"] == 4 and info["tp_size"] == 1 and info["max_total_num_tokens"] > 0
        assert "avg_spec_accept_length" in info["internal_states"][0]
    assert server.request("GET", "/health_generate") == (200, {})
    status, version = server.request("GET", "/version")
    assert status == 200 and version["version"]
