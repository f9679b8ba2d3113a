"""`moeserve inspect` on the reference configs: parameter counts from the architecture."""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import REPO, run_moeserve  # noqa: E402

CONFIGS = REPO / "tests" / "data" / "configs"  # copies of the published configs


def counts(spec):
    out = run_moeserve("inspect", spec).stdout
    m = re.search(r"parameters\s+.*\((\d+) / (\d+)\)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)), out


def test_kimi_k26_is_one_trillion_total_32b_active():
    total, active, out = counts(CONFIGS / "kimi-k2.6.config.json")
    assert 1.00e12 <= total <= 1.06e12, out      # "1T total" as published
    assert 31e9 <= active <= 34e9, out           # "32B activated"
    assert "1.03 T total" in out and "32.86 B active" in out
    assert "tensors prefixed 'language_model.'" in out


def test_deepseek_v3_is_671b_total_37b_active():
    total, active, out = counts(CONFIGS / "deepseek-v3.config.json")
    assert 665e9 <= total <= 675e9, out          # 671B without the MTP layer
    assert 36e9 <= active <= 38.5e9, out         # 37B activated


def test_moonlight_is_16b_total_3b_active():
    total, active, out = counts(CONFIGS / "moonlight-16b-a3b.config.json")
    assert 15e9 <= total <= 17e9 and 2.5e9 <= active <= 3.5e9, out


def test_synthetic_presets_match_reference_configs():
    """The built-in shape presets carry the published shapes: same counts as the configs."""
    pairs = {"kimi-k2.6": "kimi-k2.6.config.json", "kimi-k2": "kimi-k2-instruct-0905.config.json",
             "deepseek-v3": "deepseek-v3.config.json", "moonlight": "moonlight-16b-a3b.config.json"}
    for preset, config in pairs.items():
        assert counts(f"synthetic:{preset}")[:2] == counts(CONFIGS / config)[:2], preset


def test_layer_override_and_checkpoint_bytes():
    total_3, _, out = counts("synthetic:kimi-k2.6:layers=3")
    assert "layers           3 (1 dense, 2 MoE)" in out
    total_61, _, _ = counts("synthetic:kimi-k2.6")
    assert total_3 < total_61 / 10


def test_quantized_checkpoints_report_their_stored_size():
    """Issue 19: K2.6 stores its routed experts in INT4 (group 32), DeepSeek-V3 its linears in block FP8."""
    out = run_moeserve("inspect", CONFIGS / "kimi-k2.6.config.json").stdout
    assert "quantization     int4-pack-quantized (INT4 routed experts, group 32)" in out
    assert "checkpoint       stored 553.40 GiB (INT4 routed experts, group 32)" in out  # 594.2 GB
    out = run_moeserve("inspect", CONFIGS / "deepseek-v3.config.json").stdout
    assert "checkpoint       stored 626.92 GiB (FP8 e4m3 linears, block 128x128)" in out
