"""Issue 6, acceptance 4: every bad input gets its HTTP status and OpenAI's error JSON
({"error": {"message", "type", "param", "code"}}) naming the parameter, while a good request
running at the same time completes with the right tokens."""
import json
import pathlib
import socket
import sys
import threading

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, generate_ids, openai_client  # noqa: E402

GOOD_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
GOOD_TOKENS = 150
MAX_BODY = 65536


@pytest.fixture(scope="module")
def server():
    with Server("--max-body-bytes", MAX_BODY) as s:
        yield s


@pytest.fixture(scope="module")
def good_tokens():
    return generate_ids([GOOD_PROMPT], n=GOOD_TOKENS, extra=["--ignore-eos"])[0]


class GoodRequest:
    """A long streaming completion; the bad request is sent once its first chunk arrived."""

    def __init__(self, server):
        self.started = threading.Event()
        self.tokens, self.error = [], None
        self.thread = threading.Thread(target=self._run, args=(server,))
        self.thread.start()
        assert self.started.wait(60), self.error

    def _run(self, server):
        try:
            stream = openai_client(server).completions.create(
                model=MODEL, prompt=GOOD_PROMPT, max_tokens=GOOD_TOKENS, temperature=0, stream=True,
                extra_body={"return_token_ids": True, "ignore_eos": True})
            for chunk in stream:
                self.tokens += chunk.choices[0].model_extra.get("token_ids", [])
                self.started.set()
        except Exception as e:  # noqa: BLE001 - reported by finish()
            self.error = e
            self.started.set()

    def finish(self):
        self.thread.join(120)
        assert self.error is None, self.error
        return self.tokens


def assert_openai_error(status, body, want_status, param=None, code=None, text=None):
    assert status == want_status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    if text is not None:
        assert text in error["message"], error


def good_completion(**overrides):
    return {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, **overrides}


def chat(**overrides):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **overrides}


# (name, path, body or raw bytes, status, param, code, text in the message)
CASES = [
    ("malformed JSON", "/v1/completions", b'{"model": "synthetic:tiny", "prompt": [1, 2', 400, None, None,
     "malformed JSON"),
    ("body not an object", "/v1/completions", b"[1, 2, 3]", 400, None, None, "JSON object"),
    ("max_tokens of the wrong type", "/v1/completions", good_completion(max_tokens="4"), 400, "max_tokens", None,
     "expected an integer"),
    ("temperature of the wrong type", "/v1/chat/completions", chat(temperature=[1]), 400, "temperature", None,
     "expected a number"),
    ("stream of the wrong type", "/v1/completions", good_completion(stream=1), 400, "stream", None, "boolean"),
    ("messages of the wrong type", "/v1/chat/completions", chat(messages={"role": "user"}), 400, "messages", None,
     "expected an array"),
    ("prompt of the wrong type", "/v1/completions", good_completion(prompt=3.5), 400, "prompt", None, None),
    ("temperature out of range", "/v1/completions", good_completion(temperature=2.5), 400, "temperature", None,
     "outside [0, 2]"),
    ("top_p out of range", "/v1/completions", good_completion(top_p=1.5), 400, "top_p", None, None),
    ("top_k out of range", "/v1/completions", good_completion(top_k=-5), 400, "top_k", None, None),
    ("min_p out of range", "/v1/completions", good_completion(min_p=-0.1), 400, "min_p", None, None),
    ("max_tokens out of range", "/v1/completions", good_completion(max_tokens=0), 400, "max_tokens", None, None),
    ("n out of range", "/v1/completions", good_completion(n=100), 400, "n", None, None),
    ("logprobs out of range", "/v1/completions", good_completion(logprobs=50), 400, "logprobs", None, None),
    ("token id outside the vocabulary", "/v1/completions", good_completion(prompt=[1, 99999]), 400, "prompt", None,
     "outside the vocabulary"),
    ("prompt longer than the context", "/v1/completions", good_completion(prompt=[1] * 5000), 400, "prompt",
     "context_length_exceeded", "maximum context length is 4096"),
    ("prompt plus max_tokens longer than the context", "/v1/completions",
     good_completion(prompt=[1] * 4000, max_tokens=200), 400, "max_tokens", "context_length_exceeded", None),
    ("unknown model", "/v1/completions", good_completion(model="gpt-4o"), 404, "model", "model_not_found",
     "does not exist"),
    ("unknown model (chat)", "/v1/chat/completions", chat(model="nope"), 404, "model", "model_not_found", None),
    ("empty messages", "/v1/chat/completions", chat(messages=[]), 400, "messages", None, "at least one"),
    ("message without a role", "/v1/chat/completions", chat(messages=[{"content": "x"}]), 400, "messages", None,
     "role"),
    ("empty prompt", "/v1/completions", good_completion(prompt=""), 400, "prompt", None, "empty"),
    ("empty stop string", "/v1/completions", good_completion(stop=[""]), 400, "stop", None, None),
    ("missing model", "/v1/completions", {"prompt": [1]}, 400, "model", None, "required"),
    ("invalid UTF-8", "/v1/completions", b'{"model": "synthetic:tiny", "prompt": "caf\xe9"}', 400, None, None,
     "not valid UTF-8"),
    ("invalid UTF-8 escape", "/v1/completions", b'{"model": "synthetic:tiny", "prompt": "\\udc80"}', 400, None,
     None, None),
    ("body over the size limit", "/v1/completions",
     json.dumps(good_completion(prompt="x" * (MAX_BODY + 10))).encode(), 413, None, None, "exceeds 65536 bytes"),
    ("unsupported parameter value", "/v1/completions", good_completion(use_beam_search=True), 400,
     "use_beam_search", None, "not supported"),
    ("unknown route", "/v1/embeddings", good_completion(), 404, None, None, "no route"),
]


@pytest.mark.parametrize("name,path,body,status,param,code,text", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_and_a_concurrent_request_completes(server, good_tokens, name, path, body, status,
                                                                 param, code, text):
    good = GoodRequest(server)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got_status, got_body = server.request("POST", path, raw=raw)
    assert_openai_error(got_status, got_body, status, param, code, text)
    assert good.finish() == good_tokens
    assert server.metrics()["moeserve_kv_pages_used"] == 0


def test_wrong_method_and_garbage_on_the_socket(server, good_tokens):
    good = GoodRequest(server)
    status, body = server.request("GET", "/v1/completions")
    assert_openai_error(status, body, 405)
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        reply = s.recv(4096).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 400"), reply
    assert good.finish() == good_tokens


def test_queue_full_is_429():
    with Server("--max-running-requests", 1, "--max-queued-requests", 0) as server:
        good = GoodRequest(server)
        status, body = server.request("POST", "/v1/completions", good_completion())
        assert_openai_error(status, body, 429, code="queue_full", text="at capacity")
        assert server.metrics()["moeserve_requests_rejected_queue_full_total"] == 1
        assert good.finish() == generate_ids([GOOD_PROMPT], n=GOOD_TOKENS, extra=["--ignore-eos"])[0]


def test_api_key_guards_every_route_but_health():
    with Server("--api-key", "sesame") as server:
        assert server.request("GET", "/health")[0] == 200
        for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
                             ("POST", "/v1/chat/completions")]:
            status, body = server.request(method, path, good_completion() if method == "POST" else None)
            assert_openai_error(status, body, 401, code="invalid_api_key")
            status, body = server.request(method, path, good_completion() if method == "POST" else None,
                                          headers={"Authorization": "Bearer wrong"})
            assert status == 401
        client = openai_client(server, api_key="sesame")
        assert client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2).choices[0].finish_reason
        import openai
        with pytest.raises(openai.AuthenticationError):
            openai_client(server, api_key="wrong").models.list()


ADMIN_ROUTES = [("POST", "/admin/replan", {"plan": "single"}), ("POST", "/admin/flush_cache", {}),
                ("POST", "/flush_cache", {})]


def test_admin_routes_are_refused_without_an_admin_key():
    with Server("--api-key", "sesame") as server:
        for method, path, body in ADMIN_ROUTES:
            for headers in ({}, {"Authorization": "Bearer sesame"}):  # the API key does not open them
                status, reply = server.request(method, path, body, headers=headers)
                assert_openai_error(status, reply, 403, code="admin_disabled", text="--admin-api-key")


def test_admin_routes_need_the_admin_key_not_the_api_key():
    with Server("--api-key", "sesame", "--admin-api-key", "root") as server:
        for method, path, body in ADMIN_ROUTES:
            for headers in ({}, {"Authorization": "Bearer sesame"}, {"Authorization": "Bearer wrong"}):
                status, reply = server.request(method, path, body, headers=headers)
                assert_openai_error(status, reply, 401, code="invalid_api_key")
        status, reply = server.request("POST", "/admin/flush_cache", {}, headers={"Authorization": "Bearer root"})
        assert status == 200 and "evicted_pages" in reply, reply
        status, reply = server.request("POST", "/admin/replan", {"plan": "single"},
                                       headers={"Authorization": "Bearer root"}, timeout=120)
        assert status == 200 and reply["plan"] == "single", reply
        status, reply = server.request("POST", "/v1/completions", good_completion(),
                                       headers={"Authorization": "Bearer root"})
        assert status == 401, reply  # nor does the admin key open the API routes
