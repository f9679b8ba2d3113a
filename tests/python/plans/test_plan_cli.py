"""`moeserve plan show`, `plan list`, the plan flags of `generate`, `generate --stats`, and
the errors an operator sees for plans that cannot work (issue 4, acceptance 3-5)."""
import json
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import REPO, run_moeserve  # noqa: E402

KIMI = "synthetic:kimi-k2.6"  # INT4 routed experts, as published
KIMI_BF16 = KIMI + ":dtype=bf16"
# Kimi K2.6's architecture (tests/data/configs/kimi-k2.6.config.json).
K26 = dict(vocab=163840, hidden=7168, inter=18432, moe_inter=2048, layers=61, heads=64, q_lora=1536, kv_lora=512,
           nope=128, rope=64, v=128, experts=384, shared=1, dense=1)


def kimi_parameters():
    """Parameter count from the architecture, written independently of model/config.cc."""
    k = K26
    h = k["hidden"]
    attention = (2 * h + h * k["q_lora"] + k["q_lora"] + k["q_lora"] * k["heads"] * (k["nope"] + k["rope"])
                 + h * (k["kv_lora"] + k["rope"]) + k["kv_lora"] + k["kv_lora"] * k["heads"] * (k["nope"] + k["v"])
                 + k["heads"] * k["v"] * h)
    dense = 3 * h * k["inter"]
    moe = 3 * h * k["moe_inter"] * (k["experts"] + k["shared"]) + k["experts"] * h + k["experts"]
    moe_layers = k["layers"] - k["dense"]
    return 2 * k["vocab"] * h + h + k["layers"] * attention + k["dense"] * dense + moe_layers * moe


ROW = re.compile(r"^(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\[(\d+),(\d+)\)\s+\[(\d+),(\d+)\)\s+\[(\d+),(\d+)\)\s+"
                 r"\[(\d+),(\d+)\)\s+(\[\d+,\d+\)|-)\s+")


def plan_show(*args):
    out = run_moeserve("plan", "show", *args).stdout
    rows = [ROW.match(line) for line in out.splitlines()]
    return out, [m for m in rows if m]


@pytest.mark.parametrize("plan", ["tp8", "ep8", "pp8", "ep8-dp", "ep4tp2", "tp2pp4"])
def test_kimi_owned_weight_bytes_add_up_to_the_model(plan):
    out, rows = plan_show(plan, "--model", KIMI_BF16)  # the default has INT4 routed experts
    assert len(rows) == 8
    owned = int(re.search(r"\(owned, (\d+) bytes\)", out).group(1))
    assert owned == 2 * kimi_parameters()  # bf16: every parameter owned by exactly one rank


def test_kimi_rank_tables():
    _, rows = plan_show("tp8", "--model", KIMI)
    for r, m in enumerate(rows):  # heads and vocab split 8 ways, every layer, every expert's columns split
        assert (int(m[5]), int(m[6])) == (0, 61)
        assert (int(m[7]), int(m[8])) == (8 * r, 8 * r + 8)
        assert (int(m[9]), int(m[10])) == (0, 384)
        assert (int(m[11]), int(m[12])) == (256 * r, 256 * r + 256)
        assert m[13] == f"[{20480 * r},{20480 * (r + 1)})"
    _, rows = plan_show("ep8", "--model", KIMI)
    for r, m in enumerate(rows):  # 48 whole experts per rank
        assert (int(m[9]), int(m[10])) == (48 * r, 48 * r + 48)
        assert (int(m[11]), int(m[12])) == (0, 2048)
    _, rows = plan_show("pp8", "--model", KIMI)
    layers = [(int(m[5]), int(m[6])) for m in rows]
    assert layers == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40), (40, 47), (47, 54), (54, 61)]
    assert [m[13] for m in rows] == ["[0,163840)"] + ["-"] * 6 + ["[0,163840)"]


def test_docs_hold_the_current_plan_show_output():
    docs = (REPO / "docs" / "plans.md").read_text()
    for plan in ("tp8", "ep8", "pp8"):
        command = f"moeserve plan show {plan} --model {KIMI}"
        block = re.search(re.escape(command) + r"\n(.*?)```", docs, re.S)
        assert block, f"docs/plans.md lacks the output of `{command}`"
        assert block.group(1) == run_moeserve("plan", "show", plan, "--model", KIMI).stdout, command


def test_flags_describe_the_same_plans_as_presets():
    for preset, flags in (("ep8-dp", ["--tp-size", 8, "--ep-size", 8, "--enable-dp-attention"]),
                          ("ep4tp2", ["--tp-size", 8, "--ep-size", 4]),
                          ("tp2pp4", ["--tp-size", 2, "--pp-size", 4])):
        assert plan_show(preset)[0] == plan_show(*flags)[0]


def test_generate_with_flags_and_stats():
    args = ["generate", "--model", "synthetic:tiny", "--prompt-ids", "5,17,42", "--prompt-ids", "7", "-n", 3,
            "--ignore-eos"]
    single = run_moeserve(*args).stdout
    proc = run_moeserve(*args, "--tp-size", 4, "--ep-size", 2, "--enable-dp-attention", "--dp-size", 2, "--stats")
    assert proc.stdout == single
    lines = proc.stderr.splitlines()
    assert lines[0] == "communication of plan pp1.attn_tp2.attn_dp2.moe_ep2.moe_tp2 (4 ranks): per rank, site and collective"
    table = [line.split() for line in lines[2:]]
    # rank 0: 3 forward passes; 8 layers of which 7 MoE: one attention all-reduce per layer,
    # one counts/dispatch/combine all-to-all and one re-assembling all-reduce per MoE layer.
    rank0 = {(row[6], row[7]): row for row in table if row[0] == "0"}
    assert set(rank0) == {("attention", "all_reduce"), ("dense_mlp", "all_reduce"), ("embedding", "all_reduce"),
                          ("lm_head", "all_gather"), ("moe", "all_reduce"), ("moe_counts", "all_to_all_v"),
                          ("moe_dispatch", "all_to_all_v"), ("moe_combine", "all_to_all_v")}
    assert rank0[("attention", "all_reduce")][8] == "24" and rank0[("attention", "all_reduce")][11] == "1.00"
    assert rank0[("moe_dispatch", "all_to_all_v")][8] == "21"
    assert rank0[("embedding", "all_reduce")][11] == "-"


def test_pipeline_stats_count_sends_per_micro_batch():
    proc = run_moeserve("generate", "--model", "synthetic:tiny", "--plan", "pp2", "--prompt-ids", "1,2",
                        "--prompt-ids", "3", "--prompt-ids", "4",
                        "-n", 2, "--ignore-eos", "--pp-max-micro-batch-size", 1, "--stats")
    table = [line.split() for line in proc.stderr.splitlines()[2:]]
    assert [(r[0], r[6], r[7], r[8]) for r in table] == [("0", "pipeline", "send", "6"), ("1", "pipeline", "recv", "6")]


ERRORS = [
    (["plan", "show", "tp16"], "plan 'tp16': model attention heads = 8 is not divisible by attention TP size = 16"),
    (["plan", "show", "ep32-dp"], "plan 'ep32-dp': model routed experts = 16 is not divisible by EP size = 32"),
    (["plan", "show", "pp16"], "plan 'pp16': 16 pipeline stages for 8 layers (each stage needs a layer)"),
    (["plan", "show", "ep3-dp"], "plan 'ep3-dp': model routed experts = 16 is not divisible by EP size = 3"),
    (["plan", "show", "tp3"], "plan 'tp3': model attention heads = 8 is not divisible by attention TP size = 3"),
    (["plan", "show", "ep2tp16"], "plan 'ep2tp16': model attention heads = 8 is not divisible by attention TP size = 32"),
    (["plan", "show", "tp2x"], "plan 'tp2x': unexpected 'x' at offset 3; expected 'single' or components tpN, epN, "
                               "ppN (each at most once) with an optional -dp"),
    (["plan", "show", "tp4-dp"], "plan 'tp4-dp': '-dp' (attention data parallelism) needs expert parallelism, as in "
                                 "ep8-dp"),
    (["plan", "show", "tp8", "--tp-size", "8"], "--plan tp8 conflicts with --tp-size/--ep-size/--pp-size/--dp-size/"
                                                "--enable-dp-attention: give one or the other"),
    (["plan", "show", "--tp-size", "8", "--ep-size", "3"],
     "--ep-size 3 does not divide --tp-size 8 (the ranks of a pipeline stage)"),
    (["plan", "show", "--tp-size", "8", "--dp-size", "2"],
     "--dp-size 2 without --enable-dp-attention: replicating whole engines is not supported; add "
     "--enable-dp-attention for data-parallel attention"),
    (["plan", "show", "ep8", "--model", KIMI_BF16, "--mem-per-rank", "80GiB"],
     "plan 'ep8' does not fit --mem-per-rank 80.00 GiB: rank 0 needs 257.91 GiB = weights 240.76 GiB + KV cache "
     "17.16 GiB (262144 tokens x 1 sequences x 68.62 KiB per token)"),
    # 32 requests over 8 DP replicas: each rank caches 4 sequences.
    (["plan", "show", "ep8-dp", "--model", KIMI_BF16, "--mem-per-rank", "280GiB", "--context-length", "131072",
      "--max-running-requests", "32"],
     "plan 'ep8-dp' does not fit --mem-per-rank 280.00 GiB: rank 0 needs 292.40 GiB = weights 258.08 GiB + KV cache "
     "34.31 GiB (131072 tokens x 4 sequences x 68.62 KiB per token)"),
    (["plan", "show", "tp8", "--mem-per-rank", "lots"],
     "--mem-per-rank: 'lots' is not a size (use e.g. 80GiB, 141GB, 512MiB or a byte count)"),
    (["serve", "--model", "synthetic:tiny", "--plan", "pp2", "--pp-groups", "-1", "--port", "0"],
     "--pp-groups must be >= 0 (0: one per pipeline stage), got -1"),
    (["generate", "--model", "synthetic:tiny", "--plan", "tp16", "--prompt-ids", "1"],
     "plan 'tp16': model attention heads = 8 is not divisible by attention TP size = 16"),
    # generate checks fp32 (the CPU backend's dtype): 1280 B = (32 + 8) x 8 layers x 4 bytes per token.
    (["generate", "--model", "synthetic:tiny", "--plan", "tp2", "--prompt-ids", "1", "--mem-per-rank", "4MiB"],
     "plan 'tp2' does not fit --mem-per-rank 4.00 MiB: rank 0 needs 7.08 MiB = weights 2.08 MiB + KV cache 5.00 MiB "
     "(4096 tokens x 1 sequences x 1.25 KiB per token)"),
]


@pytest.mark.parametrize("args,message", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_invalid_plans_are_rejected_with_a_clear_message(args, message):
    proc = run_moeserve(*args, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: {message}"


def test_memory_fit_passes_when_it_fits():
    out = run_moeserve("plan", "show", "ep8", "--model", KIMI_BF16, "--mem-per-rank", "260GiB").stdout
    assert out.startswith("plan ep8: world 8")


K26_CONFIG = REPO / "tests" / "data" / "configs" / "kimi-k2.6.config.json"  # INT4 routed experts (W4A16)
FIT = re.compile(r"^fits --mem-per-rank .*: tightest rank \d+ needs .* = weights (\d+\.\d+) GiB \+ KV cache .*; "
                 r"KV room after weights: (\d+) tokens per rank$", re.M)


@pytest.mark.parametrize("plan", ["ep8", "tp8"])
@pytest.mark.parametrize("memory", ["141GiB", "96GB"])
def test_int4_kimi_k26_fits_eight_ranks_with_kv_room(plan, memory):
    """Issue 19: the checkpoint's INT4 experts (group 32) are counted as stored, ~71 GiB a rank."""
    out = run_moeserve("plan", "show", plan, "--model", K26_CONFIG, "--mem-per-rank", memory).stdout
    assert "stored 553.40 GiB (INT4 routed experts, group 32)" in out
    m = FIT.search(out)
    assert m, out
    assert 60 < float(m.group(1)) < 80 and int(m.group(2)) > 262144, out


def test_bf16_kimi_k26_does_not_fit_eight_ranks(tmp_path):
    """The control: the same config without quantization_config is bf16, ~241 GiB a rank."""
    config = json.loads(K26_CONFIG.read_text())
    del config["quantization_config"], config["text_config"]["quantization_config"]  # K2.6 has both copies
    bf16 = tmp_path / "config.json"
    bf16.write_text(json.dumps(config))
    proc = run_moeserve("plan", "show", "ep8", "--model", bf16, "--mem-per-rank", "141GiB", check=False)
    assert proc.returncode != 0
    assert "plan 'ep8' does not fit --mem-per-rank 141.00 GiB: rank 0 needs 257.91 GiB = weights 240.76 GiB" in proc.stderr
