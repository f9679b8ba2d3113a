"""Request features and the server's life: sampling parameters, seeds, logprobs, stop strings
and ids, n and echo, usage, metrics, client disconnects, and SIGTERM draining."""
import json
import math
import pathlib
import socket
import sys
import threading
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, detokenize, generate_ids, openai_client  # noqa: E402

PROMPT = [10, 20, 30, 40, 50]


@pytest.fixture(scope="module")
def server():
    with Server() as s:
        yield s


def test_seeded_sampling_is_reproducible_and_matches_generate(server):
    client = openai_client(server)
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.8, top_p=0.9, seed=42,
                extra_body={"top_k": 50, "min_p": 0.01, "return_token_ids": True})
    a = client.completions.create(**args).choices[0].model_extra["token_ids"]
    b = client.completions.create(**args).choices[0].model_extra["token_ids"]
    assert a == b
    expected = generate_ids([PROMPT], n=12, extra=["--temperature", "0.8", "--top-p", "0.9", "--seed", "42",
                                                   "--top-k", "50", "--min-p", "0.01"])[0]
    assert a == expected
    other = client.completions.create(**{**args, "seed": 43}).choices[0].model_extra["token_ids"]
    assert other != a


def test_device_candidates_draw_what_full_logits_draw(server):
    """Sampled rows are drawn from each row's top candidates and softmax normaliser, reduced
    where the logits are (moeserve_sampled_rows_total), or from the row's full logits when the
    draw reaches past them (moeserve_sampling_fallbacks_total; the tiny model's 512-entry
    vocabulary is flat enough that pure temperature sampling does): the same tokens as
    sampling the full logits on the host (`moeserve generate`), for every filter."""
    client = openai_client(server)
    before = server.metrics()
    cases = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.8), dict(temperature=1.3, min_p=0.05),
             dict(temperature=0.9, top_k=300), dict(temperature=0.6, top_k=20, top_p=0.95)]
    for i, case in enumerate(cases):
        body = {"return_token_ids": True, "ignore_eos": True, **{k: v for k, v in case.items() if k in ("top_k", "min_p")}}
        got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, seed=100 + i,
                                        temperature=case["temperature"], top_p=case.get("top_p", 1.0),
                                        extra_body=body).choices[0].model_extra["token_ids"]
        flags = ["--seed", str(100 + i), "--ignore-eos"]
        for key, flag in (("temperature", "--temperature"), ("top_p", "--top-p"), ("top_k", "--top-k"),
                          ("min_p", "--min-p")):
            if key in case:
                flags += [flag, str(case[key])]
        assert got == generate_ids([PROMPT], n=16, extra=flags)[0], case
    after = server.metrics()
    # top_k 300 is past the 256 candidates a row is reduced to: that request's rows bring logits.
    candidate_cases = [c for c in cases if c.get("top_k", 0) <= 256]
    assert after["moeserve_sampled_rows_total"] - before.get("moeserve_sampled_rows_total", 0) == 16 * len(candidate_cases)
    assert after["moeserve_sampling_fallbacks_total"] > before.get("moeserve_sampling_fallbacks_total", 0)


def test_logprobs_completions_and_chat(server):
    client = openai_client(server)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0
        assert len(top) >= 1
        assert math.isclose(chosen, max(top.values()), rel_tol=1e-5)  # greedy takes the most likely
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert isinstance(item.bytes, list)


def test_stop_strings_and_stop_token_ids(server):
    client = openai_client(server)
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"return_token_ids": True, "ignore_eos": True}).choices[0]
    ids = full.model_extra["token_ids"]
    # Stop at the 6th generated token's id: the output ends before it.
    stop_id = ids[5]
    first = ids.index(stop_id)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
                                  extra_body={"return_token_ids": True, "stop_token_ids": [stop_id],
                                              "ignore_eos": True}).choices[0]
    assert r.finish_reason == "stop"
    assert r.model_extra["token_ids"] == ids[:first + 1]
    assert r.text == detokenize(ids[:first])
    # A stop string taken from the middle of the text.
    text = full.text
    candidates = [text[i:i + 2] for i in range(3, len(text) - 2) if text[i:i + 2].isprintable()
                  and "\ufffd" not in text[i:i + 2]]
    if candidates:
        stop = candidates[0]
        for stream in (False, True):
            args = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                        extra_body={"ignore_eos": True})
            if stream:
                got = "".join(ch.choices[0].text for ch in client.completions.create(stream=True, **args))
            else:
                got = client.completions.create(**args).choices[0].text
            assert got == text[:text.index(stop)]


def test_n_and_echo_and_batched_prompts(server):
    client = openai_client(server)
    r = client.completions.create(model=MODEL, prompt=[[1, 2, 3], [4, 5]], max_tokens=3, temperature=0, n=2,
                                  echo=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy: the same twice
    assert r.choices[0].text.startswith(detokenize([1, 2, 3], skip_special=False))
    assert r.usage.prompt_tokens == 5
    assert r.usage.completion_tokens == 12


def test_metrics_are_prometheus_text(server):
    client = openai_client(server)
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    status, text = server.request("GET", "/metrics")
    assert status == 200
    for name in ["moeserve_requests_running", "moeserve_requests_waiting", "moeserve_kv_usage_ratio",
                 "moeserve_prefix_cache_hit_rate", "moeserve_prompt_tokens_total", "moeserve_generation_tokens_total",
                 "moeserve_time_to_first_token_seconds_bucket", "moeserve_inter_token_latency_seconds_bucket",
                 "moeserve_e2e_request_latency_seconds_count", "moeserve_step_duration_seconds_sum"]:
        assert name in text, name
    m = server.metrics()
    assert m["moeserve_time_to_first_token_seconds_count"] >= 1
    assert m['moeserve_time_to_first_token_seconds_bucket{le="+Inf"}'] == m["moeserve_time_to_first_token_seconds_count"]
    assert m["moeserve_generation_tokens_total"] >= 3
    # 3 tokens: one step with the prompt's prefill, then two decode-only steps (at least).
    assert m["moeserve_decode_step_duration_seconds_count"] >= 2
    assert m["moeserve_decode_step_duration_seconds_count"] < m["moeserve_step_duration_seconds_count"]


def raw_completion(port, body):
    """Sends a completion over a raw socket and returns the socket (unread)."""
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return s


def wait_for(predicate, timeout=30):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_cancels_its_request(server, stream):
    before = server.metrics()['moeserve_requests_finished_total{reason="cancelled"}']
    s = raw_completion(server.port, {"model": MODEL, "prompt": PROMPT, "max_tokens": 3000, "stream": stream,
                                     "ignore_eos": True})
    wait_for(lambda: server.metrics()["moeserve_requests_running"] == 1)
    if stream:
        assert s.recv(100).startswith(b"HTTP/1.1 200")
    s.close()
    wait_for(lambda: server.metrics()['moeserve_requests_finished_total{reason="cancelled"}'] == before + 1)
    m = server.metrics()
    assert m["moeserve_requests_running"] == 0
    assert m["moeserve_kv_pages_used"] == 0
    assert m["moeserve_generation_tokens_total"] < 3000 * 10


def test_health_and_models(server):
    assert server.request("GET", "/health") == (200, {"status": "ok", "plan": "single", "replans": 0})
    status, body = server.request("GET", "/v1/models/" + MODEL)
    assert status == 200 and body["id"] == MODEL and body["max_model_len"] == 4096


def test_sigterm_drains_requests_in_flight_then_exits_0():
    server = Server()
    result = {}

    def long_request():
        client = openai_client(server)
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=400, temperature=0,
                                      extra_body={"ignore_eos": True})
        result["finish"] = r.choices[0].finish_reason
        result["tokens"] = r.usage.completion_tokens

    t = threading.Thread(target=long_request)
    t.start()
    wait_for(lambda: server.metrics()["moeserve_requests_running"] == 1)
    server.proc.send_signal(15)
    wait_for(lambda: any("draining" in line for line in server.output))
    # New connections are refused while draining; the request in flight completes.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    t.join(60)
    assert result == {"finish": "length", "tokens": 400}
    assert server.proc.wait(30) == 0
    assert any("moeserve: stopped" in line for line in server.output)
