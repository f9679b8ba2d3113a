"""`moeserve generate --prompt / --chat` on synthetic:tiny: text in, text out, through
the built-in tokenizer and chat template, the same continuation as the equivalent ids."""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from conftest import run_moeserve  # noqa: E402


def test_prompt_text_equals_its_ids():
    # The built-in tokenizer of synthetic models maps byte b to id b: the text prompt and its
    # bytes as ids generate the same ids, and the printed text is exactly their decoding.
    text = "Hello moe"
    ids = ",".join(str(b) for b in text.encode())
    tiny = ["generate", "--model", "synthetic:tiny", "-n", "8", "--ignore-eos"]
    by_text = run_moeserve(*tiny, "--prompt", text).stdout.strip().splitlines()
    by_ids = run_moeserve(*tiny, "--prompt-ids", ids).stdout.strip().splitlines()
    assert len(by_text) == 1 and len(by_ids) == 1
    decoded = run_moeserve("detokenize", "--tokenizer", "synthetic", "--ids", by_ids[0]).stdout
    assert json.loads(by_text[0]) == decoded


def test_chat_renders_and_generates_one_line_per_conversation():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    out = run_moeserve("generate", "--model", "synthetic:tiny", "--chat", json.dumps(messages), "-n", "6")
    out = out.stdout.strip().splitlines()
    assert len(out) == 1 and isinstance(json.loads(out[0]), str)


def test_text_and_ids_together_are_refused():
    proc = run_moeserve("generate", "--model", "synthetic:tiny", "--prompt", "a", "--prompt-ids", "1", check=False)
    assert proc.returncode != 0 and "not both" in proc.stderr


def test_bad_chat_json_names_the_option():
    proc = run_moeserve("generate", "--model", "synthetic:tiny", "--chat", "[{", check=False)
    assert proc.returncode != 0 and "--chat" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
