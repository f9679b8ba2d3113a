"""Live re-plan through the server (POST /admin/replan, `moeserve restart --plan`).

Under load: 300 streaming requests at concurrency 32 (`moeserve bench`, Poisson arrivals
spread over a few seconds so that both switches land while requests are in flight) while
the server moves single -> tp2 -> ep2: none fails or is lost, and every greedy output equals
what an undisturbed server gives that request. Refused re-plans (unknown plan, a plan that
does not divide the model, one that does not fit --mem-per-rank, a missing key, one outside
--reduction-plan) leave the server serving on its old plan; under a reduction plan, re-plans
among the plans nesting in it change no bit of the logprobs."""
import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "serve"))
from server_harness import Server, moeserve_bin, run_moeserve  # noqa: E402

LOAD = ["--num-prompts", 300, "--concurrency", 32, "--dataset", "random-ids", "--random-input-len", 48,
        "--random-output-len", 24, "--random-range-ratio", 0.25, "--seed", 7, "--output-details"]

ADMIN = {"Authorization": "Bearer adm"}  # the servers' --admin-api-key


def bench_args(server, out, *extra):
    return ["bench", "--base-url", server.base, *map(str, LOAD), "--output-file", str(out), *map(str, extra)]


def load_run(path):
    (run,) = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
    return run


def wait_for_tokens(server, at_least, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the load ended before the switch"
        if server.metrics().get("moeserve_generation_tokens_total", 0) >= at_least:
            return
        time.sleep(0.02)
    raise AssertionError("the load did not start")


def test_replan_twice_under_load_loses_nothing_and_changes_no_output(tmp_path):
    with Server() as server:
        run_moeserve(*bench_args(server, tmp_path / "undisturbed.jsonl"))
    undisturbed = load_run(tmp_path / "undisturbed.jsonl")
    assert undisturbed["completed"] == 300

    with Server("--admin-api-key", "adm") as server:
        # 300 arrivals at 60/s: about five seconds of load around two switches.
        proc = subprocess.Popen([moeserve_bin(), *bench_args(server, tmp_path / "disturbed.jsonl",
                                                            "--request-rate", 60)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reports = []
        for plan, tokens in (("tp2", 200), ("ep2", 1500)):
            wait_for_tokens(server, tokens, proc)
            status, report = server.request("POST", "/admin/replan", {"plan": plan}, timeout=120, headers=ADMIN)
            assert status == 200, report
            assert proc.poll() is None, "the switch should land while the load runs"
            reports.append(report)
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output
        assert server.request("GET", "/health")[1] == {"status": "ok", "plan": "ep2", "replans": 2}
        metrics = server.metrics()
        assert metrics['moeserve_plan_info{plan="ep2"}'] == 1
        assert metrics["moeserve_replans_total"] == 2
        assert metrics['moeserve_requests_finished_total{reason="error"}'] == 0
    assert [(r["previous_plan"], r["plan"]) for r in reports] == [("single", "tp2"), ("tp2", "ep2")]
    for r in reports:
        assert 0 <= r["drain_s"] <= r["time_to_ready_s"] and r["build_s"] > 0 and r["replans"] >= 1
    # The load was in flight: the switches carried running requests over or had requests waiting.
    assert any(r["requests_carried"] > 0 or r["requests_waited"] > 0 for r in reports), reports
    for r in reports:  # resharded from the weights the ranks held, in four timed phases
        assert r["weights_from"] == "resident", r
        assert set(r["phases_s"]) == {"pause", "move", "graphs", "resume"}, r
        assert abs(sum(r["phases_s"].values()) - r["time_to_ready_s"]) < 1e-3, r
        assert abs(sum(r["move_detail_s"].values()) - r["phases_s"]["move"]) < 1e-3, r
        # single -> tp2 -> ep2 keeps the KV cache's size per rank: the old engine's is taken over;
        # some shard bytes are copied (the split changes) and some viewed (replicated tensors).
        moved = r["moved_bytes"]
        assert moved["reused_cache"] > 0 and moved["viewed"] > 0 and moved["local"] + moved["peer"] > 0, r

    disturbed = load_run(tmp_path / "disturbed.jsonl")
    assert disturbed["completed"] == 300 and disturbed["failed"] == 0
    assert disturbed["errors"] == [""] * 300
    assert disturbed["input_lens"] == undisturbed["input_lens"]
    assert disturbed["output_lens"] == undisturbed["output_lens"]
    mismatched = [i for i, (a, b) in enumerate(zip(disturbed["output_ids"], undisturbed["output_ids"])) if a != b]
    assert not mismatched, f"outputs differ for requests {mismatched[:10]}"


def completion(server, headers=None):
    status, body = server.request("POST", "/v1/completions",
                                  {"model": "synthetic:tiny", "prompt": [5, 6, 7, 8], "max_tokens": 6,
                                   "temperature": 0, "return_token_ids": True}, headers=headers)
    assert status == 200, body
    return body["choices"][0]["token_ids"]


def test_refused_replans_leave_the_old_plan_serving():
    # 3 MiB per rank holds tp2's fp32 weights (about 2.1 MiB a rank) but not single's (4 MiB).
    with Server("--plan", "tp2", "--mem-per-rank", "3MiB", "--context-length", 64,
                "--max-running-requests", 4, "--api-key", "k", "--admin-api-key", "adm") as server:
        auth = {"Authorization": "Bearer k"}
        before = completion(server, auth)
        refusals = [({"plan": "nonsense"}, "nonsense"),
                    ({"plan": "tp3"}, "divisible"),
                    ({"plan": "single"}, "does not fit --mem-per-rank"),
                    ({"plan": ""}, "plan"),
                    ({"plan_name": "ep2"}, "plan")]
        for body, reason in refusals:
            status, reply = server.request("POST", "/admin/replan", body, headers=ADMIN)
            assert status == 400, (body, reply)
            assert reply["error"]["param"] == "plan"
            assert reason.lower() in reply["error"]["message"].lower(), (body, reply)
        status, reply = server.request("POST", "/admin/replan", {"plan": "ep2"})
        assert status == 401, reply
        status, reply = server.request("POST", "/admin/replan", {"plan": "ep2"}, headers=auth)
        assert status == 401, reply  # the API key is not the admin key
        assert server.request("GET", "/health")[1] == {"status": "ok", "plan": "tp2", "replans": 0}
        assert completion(server, auth) == before

        refused = run_moeserve("restart", "--plan", "tp3", "--url", server.base, "--admin-api-key", "adm",
                               check=False)
        assert refused.returncode == 1 and "refused" in refused.stderr and "tp3" in refused.stderr
        done = run_moeserve("restart", "--plan", "ep2", "--url", server.base, "--admin-api-key", "adm")
        assert "tp2 -> ep2: ready in" in done.stdout
        assert server.request("GET", "/health")[1] == {"status": "ok", "plan": "ep2", "replans": 1}
        assert completion(server, auth) == before


def logprobs(server):
    status, body = server.request("POST", "/v1/completions",
                                  {"model": "synthetic:tiny", "prompt": [5, 6, 7, 8], "max_tokens": 8,
                                   "temperature": 0, "logprobs": 5, "return_token_ids": True})
    assert status == 200, body
    choice = body["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]


def test_replans_under_a_reduction_plan_change_no_bit():
    with Server("--plan", "single", "--reduction-plan", "tp4", "--admin-api-key", "adm") as server:
        before = logprobs(server)
        status, reply = server.request("POST", "/admin/replan", {"plan": "ep2"}, headers=ADMIN)
        assert status == 400 and "--reduction-plan tp4" in reply["error"]["message"], reply
        for plan in ("tp2", "tp4", "tp2pp2", "single"):
            status, reply = server.request("POST", "/admin/replan", {"plan": plan}, timeout=120, headers=ADMIN)
            assert status == 200, reply
            assert logprobs(server) == before, plan
        assert server.request("GET", "/health")[1] == {"status": "ok", "plan": "single", "replans": 4}
