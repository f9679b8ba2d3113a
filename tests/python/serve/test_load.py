"""Issue 6, acceptance 3: 1,000 requests with random prompt and output lengths at
concurrency 128 (completions and chat, streaming and not, and streaming clients that hang
up after their first chunk) all complete without a failure; afterwards no KV page is held by
a request, every page is free once the prefix cache is flushed, and the server's resident
memory is within 10% of what it was before the load.

"Before the load" is measured after a warm-up of 200 requests of the same mix: the forward
keeps one workspace per padded step size (step/step_plan.h: padded_token_count) and
the allocator keeps its arenas, so the first load grows memory once by design; what must not
happen is growth with the number of requests served.
"""
import asyncio
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server  # noqa: E402

REQUESTS = 1000
WARMUP = 200
CONCURRENCY = 128


async def one_request(client, rng, stats):
    kind = rng.choice(["completion", "completion_stream", "chat", "chat_stream", "disconnect"])
    max_tokens = rng.randint(1, 24)
    prompt = [rng.randrange(0, 256) for _ in range(rng.randint(1, 300))]
    if rng.random() < 0.3:  # a shared prefix: exercise the prefix cache under load
        prompt = [7] * 64 + prompt
    temperature = rng.choice([0.0, 0.0, 0.7, 1.0])
    extra = dict(temperature=temperature, seed=rng.randrange(1 << 30), top_p=rng.choice([1.0, 0.9]),
                 extra_body={"top_k": rng.choice([0, 20]), "min_p": rng.choice([0.0, 0.05])})
    messages = [{"role": "user", "content": "".join(chr(97 + t % 26) for t in prompt[:rng.randint(1, 200)])}]
    if kind == "completion":
        r = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, **extra)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert 1 <= r.usage.completion_tokens <= max_tokens
    elif kind == "chat":
        r = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, **extra)
        assert r.choices[0].finish_reason in ("stop", "length")
    elif kind in ("completion_stream", "chat_stream"):
        if kind == "completion_stream":
            stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True,
                                                     **extra)
        else:
            stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                                          stream=True, **extra)
        finish = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        assert finish in ("stop", "length")
    else:  # a streaming client that hangs up after its first chunk
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, stream=True,
                                                 extra_body={"ignore_eos": True})
        async for _ in stream:
            break
        await stream.close()
        stats["disconnected"] += 1
    stats[kind] = stats.get(kind, 0) + 1


async def run_load(base_url, count, seed):
    import openai
    stats = {"disconnected": 0, "failures": []}
    rng = random.Random(seed)
    seeds = [rng.randrange(1 << 30) for _ in range(count)]
    gate = asyncio.Semaphore(CONCURRENCY)
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                                  timeout=120) as client:
        async def guarded(i):
            async with gate:
                try:
                    await one_request(client, random.Random(seeds[i]), stats)
                except Exception as e:  # noqa: BLE001 - every failure is reported below
                    stats["failures"].append(f"request {i}: {type(e).__name__}: {e}")
        await asyncio.gather(*(guarded(i) for i in range(count)))
    return stats


def wait_idle(server, timeout=60):
    deadline = time.time() + timeout
    while True:
        m = server.metrics()
        if m["moeserve_requests_running"] == 0 and m["moeserve_requests_waiting"] == 0 and m["moeserve_kv_pages_used"] == 0:
            return m
        assert time.time() < deadline, f"the server did not go idle: {m}"
        time.sleep(0.05)


def test_thousand_requests_at_concurrency_128():
    with Server("--max-running-requests", 128, "--admin-api-key", "adm") as server:
        warm = asyncio.run(run_load(server.base, WARMUP, seed=1))
        assert not warm["failures"], warm["failures"][:5]
        wait_idle(server)
        rss_before = server.rss_kib()

        start = time.time()
        stats = asyncio.run(run_load(server.base, REQUESTS, seed=2))
        elapsed = time.time() - start
        assert not stats["failures"], f"{len(stats['failures'])} failures: {stats['failures'][:5]}"
        assert stats["disconnected"] > 50

        m = wait_idle(server)
        rss_after = server.rss_kib()
        assert m["moeserve_kv_pages_used"] == 0
        assert m['moeserve_requests_finished_total{reason="cancelled"}'] > 0
        assert m['moeserve_requests_finished_total{reason="error"}'] == 0
        assert m["moeserve_prefix_cache_hit_tokens_total"] > 0
        status, flushed = server.request("POST", "/admin/flush_cache", headers={"Authorization": "Bearer adm"})
        assert status == 200
        m = server.metrics()
        assert m["moeserve_kv_pages_free"] == m["moeserve_kv_pages_capacity"]
        print(f"\nload: {REQUESTS} requests at concurrency {CONCURRENCY} in {elapsed:.1f}s, 0 failures, "
              f"{stats['disconnected']} disconnects, {m['moeserve_generation_tokens_total']:.0f} tokens generated "
              f"in total, {m['moeserve_preemptions_total']:.0f} preemptions; RSS {rss_before} KiB before, "
              f"{rss_after} KiB after ({100.0 * (rss_after - rss_before) / rss_before:+.1f}%)")
        assert abs(rss_after - rss_before) <= 0.10 * rss_before, (rss_before, rss_after)
