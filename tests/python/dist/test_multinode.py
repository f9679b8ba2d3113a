"""Multi-process serving on loopback with CPU ranks (issue 28): the same greedy tokens and
logprobs from N processes x K ranks as from one process with N * K ranks (the data plane sums
in rank order like the in-process world, so they agree exactly); a killed node makes the
leader answer 503 naming it and exit non-zero, with no process left; a joiner with another
model or plan is refused, saying what differs."""
import json
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import moeserve_bin, run_moeserve  # noqa: E402

MODEL = "synthetic:tiny"
PROMPTS = ["5,17,42,99,3,250,7,1,64,128,33,2,91", "200,4", "11,12,13,14,15,16,17"]
NEW_TOKENS = 12


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate_args(plan):
    args = ["generate", "--model", MODEL, "--plan", plan, "-n", NEW_TOKENS, "--logprobs", 3, "--ignore-eos",
            "--pp-max-micro-batch-size", 1, "--pp-async-batch-depth", 1]
    for p in PROMPTS:
        args += ["--prompt-ids", p]
    return [str(a) for a in args]


def node_args(nnodes, rank, port):
    return ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{port}"]


def run_nodes(nnodes, args, timeout=300):
    """Starts every node of one command; returns their CompletedProcess-like (rc, stdout, stderr)."""
    port = free_port()
    procs = [subprocess.Popen([moeserve_bin(), *args, *node_args(nnodes, r, port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(nnodes)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def parse(stdout):
    return [json.loads(line) for line in stdout.strip().splitlines()]


@pytest.mark.parametrize("plan,nnodes", [("tp4", 2), ("ep4", 2), ("ep4-dp", 2), ("tp2pp2", 2), ("pp4", 4),
                                         ("ep4-dp", 4)])
def test_processes_match_one_process(plan, nnodes):
    reference = parse(run_moeserve(*generate_args(plan)).stdout)
    results = run_nodes(nnodes, generate_args(plan))
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, f"{plan} node {rank} of {nnodes} failed:\n{err}"
        if rank > 0:
            assert out.strip() == "", f"a follower printed results:\n{out}"
    got = parse(results[0][1])
    assert len(got) == len(PROMPTS)
    for i, (a, b) in enumerate(zip(got, reference)):
        assert a["tokens"] == b["tokens"], f"{plan} over {nnodes} processes: prompt {i}'s tokens differ"
        assert a["logprobs"] == b["logprobs"], f"{plan} over {nnodes} processes: prompt {i}'s logprobs differ"
        assert a["top_logprobs"] == b["top_logprobs"], f"{plan}: prompt {i}'s top logprobs differ"
    assert len(got[0]["tokens"]) == NEW_TOKENS


def test_mismatched_joiner_is_refused():
    port = free_port()
    base = generate_args("tp2")
    leader = subprocess.Popen([moeserve_bin(), *base, *node_args(2, 0, port), "--dist-join-timeout", "30"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # another plan with the same number of ranks, then another model (another seed)
        for args, field in ((generate_args("ep2"), "plan: 'tp2"),
                            ([a.replace(MODEL, MODEL + ":seed=7") for a in base], "model: ")):
            joiner = subprocess.run([moeserve_bin(), *args, *node_args(2, 1, port)], capture_output=True, text=True,
                                    timeout=60)
            assert joiner.returncode != 0
            assert "refused" in joiner.stderr and field in joiner.stderr, joiner.stderr
        # the leader still waits for a right joiner, and serves with it
        right = subprocess.run([moeserve_bin(), *base, *node_args(2, 1, port)], capture_output=True, text=True,
                               timeout=300)
        assert right.returncode == 0, right.stderr
        out, err = leader.communicate(timeout=300)
        assert leader.returncode == 0, err
        assert parse(out) == parse(run_moeserve(*generate_args("tp2")).stdout)
    finally:
        if leader.poll() is None:
            leader.kill()


class Node:
    """One `moeserve serve` node; its output lines are collected as they come."""

    def __init__(self, nnodes, rank, port, http_port):
        args = ["serve", "--model", MODEL, "--plan", "tp2", "--port", str(http_port), "--skip-warmup",
                "--max-running-requests", "8", *node_args(nnodes, rank, port), "--dist-heartbeat-timeout", "3"]
        self.proc = subprocess.Popen([moeserve_bin(), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.output = []
        self._drain_thread = threading.Thread(target=self._drain, daemon=True)
        self._drain_thread.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.output.append(line)

    def exit_output(self, timeout):
        """Waits for the process to exit; its whole output (the pipe read to its end: the
        lines may still be on their way when the process has gone)."""
        self.proc.wait(timeout=timeout)
        self._drain_thread.join(timeout=10)
        return "".join(self.output)

    def wait_for(self, pattern, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in self.output:
                match = re.search(pattern, line)
                if match:
                    return match
            if self.proc.poll() is not None and not any(re.search(pattern, l) for l in self.output):
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(self.output))


def post(base, body, timeout=30):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError) as e:
        return None, str(e)


def answers_503_naming(base, node, since):
    """Polls with new requests until one is answered 503; its body must name the lost node."""
    status, body = None, ""
    while time.time() - since < 10:
        status, body = post(base, {"model": MODEL, "prompt": [9], "max_tokens": 2}, timeout=5)
        if status == 503:
            break
        time.sleep(0.1)
    assert status == 503 and f"node {node} (rank {node}) lost" in body, (status, body)
    assert time.time() - since < 10


# killed: the follower (SIGKILL), the leader (SIGKILL), or the follower hung (SIGSTOP: only the
# heartbeats notice it, after --dist-heartbeat-timeout 3 s).
@pytest.mark.parametrize("fault", ["follower killed", "leader killed", "follower hung"])
def test_lost_node_stops_the_server(fault):
    port, http_port = free_port(), free_port()
    nodes = [Node(2, r, port, http_port) for r in range(2)]
    try:
        nodes[0].wait_for(r"on http://127\.0\.0\.1:(\d+)")
        base = f"http://127.0.0.1:{http_port}"
        assert post(base, {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4})[0] == 200
        load = [threading.Thread(target=post, args=(base, {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4000,
                                                           "ignore_eos": True}, 60)) for _ in range(4)]
        for t in load:
            t.start()
        time.sleep(1.0)
        lost = 0 if fault == "leader killed" else 1
        nodes[lost].proc.send_signal(signal.SIGSTOP if fault == "follower hung" else signal.SIGKILL)
        since = time.time()
        survivor = nodes[1 - lost]
        if lost == 1:  # the leader answers 503 naming the node, then exits non-zero
            answers_503_naming(base, 1, since)
        output = survivor.exit_output(timeout=15)
        assert survivor.proc.returncode != 0, output
        assert "lost" in output, (survivor.proc.returncode, output)
        if fault == "follower hung":  # woken, it finds the leader gone and exits non-zero too
            nodes[1].proc.send_signal(signal.SIGCONT)
            nodes[1].proc.wait(timeout=15)
            assert nodes[1].proc.returncode != 0
        for t in load:
            t.join(timeout=60)
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.send_signal(signal.SIGCONT)
                n.proc.kill()
    assert all(n.proc.poll() is not None for n in nodes)
