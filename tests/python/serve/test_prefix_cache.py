"""Issue 6, acceptance 2: a request sharing a long prefix with an earlier one reuses its KV
pages (counted in /metrics and in usage.prompt_tokens_details.cached_tokens) and produces
the same tokens as with the prefix cache off (and as `moeserve generate`)."""
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server_harness import MODEL, Server, generate_ids, openai_client  # noqa: E402

PAGE = 16
rng = random.Random(6)
PREFIX = [rng.randrange(0, 512) for _ in range(300)]
FIRST = PREFIX + [1, 2, 3]
SECOND = PREFIX + [9, 8, 7, 6, 5]
NEW_TOKENS = 16


def complete(server, prompt):
    r = openai_client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0,
                                                  extra_body={"return_token_ids": True})
    return r.choices[0].model_extra["token_ids"], r.usage


def test_shared_prefix_reuses_pages_and_keeps_the_tokens():
    with Server("--page-size", PAGE, "--disable-radix-cache") as off:
        tokens_off, usage_off = complete(off, SECOND)
        assert usage_off.prompt_tokens_details.cached_tokens == 0
        assert off.metrics()["moeserve_prefix_cache_hit_tokens_total"] == 0

    with Server("--page-size", PAGE) as on:
        complete(on, FIRST)
        before = on.metrics()
        assert before["moeserve_prefix_cache_hit_tokens_total"] == 0
        assert before["moeserve_kv_pages_cached"] >= len(FIRST) // PAGE  # the finished request left its pages
        tokens_on, usage_on = complete(on, SECOND)
        after = on.metrics()
        shared_pages = len(PREFIX) // PAGE
        hit = after["moeserve_prefix_cache_hit_tokens_total"] - before["moeserve_prefix_cache_hit_tokens_total"]
        assert hit == shared_pages * PAGE
        assert usage_on.prompt_tokens_details.cached_tokens == shared_pages * PAGE
        assert 0 < after["moeserve_prefix_cache_hit_rate"] < 1
        # The same prompt again: every whole page but the one holding the last token is cached.
        again, usage_again = complete(on, SECOND)
        assert usage_again.prompt_tokens_details.cached_tokens == (len(SECOND) - 1) // PAGE * PAGE
        assert again == tokens_on

    assert tokens_on == tokens_off
    assert tokens_on == generate_ids([SECOND], n=NEW_TOKENS)[0]
