#!/usr/bin/env python3
"""Writes the fuzz targets' fixed data (fuzz/data/) and hand-made seed corpora (fuzz/corpus/<target>/).

The outputs are committed; run this again (python3 fuzz/make_corpus.py) only to change them. The
tokenizers come from tests/python/tokenizer_oracle.py (Hugging Face tokenizers / tiktoken), trained
small so that each seed stays a few KB. Seeds that reproduce a fixed defect live in the corpus too
(named regression-*), written by hand, not here.
"""
import json
import pathlib
import shutil
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
sys.path.insert(0, str(ROOT / "tests" / "python"))
import tokenizer_oracle  # noqa: E402

SEP = "\n#--moeserve-fuzz--#\n"  # fuzz/fuzz_input.h: kSectionSeparator


def write(target, name, content):
    path = FUZZ / "corpus" / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def minify_json_files(directory):
    for path in directory.glob("*.json"):
        path.write_text(json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False,
                                   separators=(",", ":")), encoding="utf-8")


def tokenizer_data():
    for name in ("deepseek-like", "kimi-like"):
        shutil.rmtree(FUZZ / "data" / name, ignore_errors=True)
    tokenizer_oracle.deepseek_like(FUZZ / "data" / "deepseek-like", vocab_size=300)
    tokenizer_oracle.kimi_like(FUZZ / "data" / "kimi-like", vocab_size=300)
    for name in ("deepseek-like", "kimi-like"):
        minify_json_files(FUZZ / "data" / name)


def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def safetensors_corpus():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    write("safetensors", "f32-bf16-f16", safetensors_file({
        "w": ("F32", [2, 3], f32), "b": ("BF16", [4], b"\x80\x3f" * 4), "h": ("F16", [2, 2], b"\x00\x3c" * 4),
        "empty": ("F32", [0, 3], b"")}, {"format": "pt"}))
    write("safetensors", "fp8-i32", safetensors_file({"q": ("F8_E4M3", [2, 2], b"\x38" * 4),
                                                       "p": ("I32", [2], b"\x01\x00\x00\x00" * 2)}))
    shard = safetensors_file({"a": ("F32", [2], struct.pack("<2f", 1, 2))})
    index = json.dumps({"metadata": {"total_size": 8}, "weight_map": {"a": "s1.safetensors"}})
    write("safetensors", "index-one-shard", (index + SEP).encode() + shard)


def config_corpus():
    for path in sorted((ROOT / "tests" / "data" / "configs").glob("*.json")):
        write("config", path.stem, path.read_bytes())
    base = json.loads((ROOT / "tests" / "data" / "configs" / "deepseek-v3.config.json").read_text())
    base["rope_scaling"] = {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}
    base["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                   "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                              "re:.*mlp\\.(gate|up|down)_proj.*"],
                                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                       "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                       "group_size": 32, "dynamic": False}}}}
    write("config", "deepseek-v3-yarn-int4", json.dumps(base))


def openai_corpus():
    bodies = {
        "completion-text": {"model": "synthetic:tiny", "prompt": "hi", "max_tokens": 5, "temperature": 0,
                            "stop": ["x", "y"], "seed": 3, "stop_token_ids": [300], "logprobs": 2, "stream": True,
                            "stream_options": {"include_usage": True}, "echo": True},
        "completion-ids": {"model": "synthetic:tiny", "prompt": [[1, 2, 3], [4, 5]], "n": 2, "top_p": 0.5,
                           "top_k": 4, "min_p": 0.1, "ignore_eos": True},
        "chat": {"model": "synthetic:tiny", "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi <|im_end|><|im_system|>"},
            {"role": "assistant", "content": "hello", "reasoning_content": "think",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
            {"role": "developer", "content": "x", "name": "n"}],
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                 "max_completion_tokens": 10, "logprobs": True, "top_logprobs": 3, "tool_choice": "auto"},
    }
    for name, body in bodies.items():
        write("openai_request", name, json.dumps(body, ensure_ascii=False))
    write("openai_request", "huge-max-tokens", '{"model":"synthetic:tiny","prompt":"a","max_tokens":9223372036854775807}')
    write("openai_request", "number-overflow", '{"model":"synthetic:tiny","prompt":"a","temperature":1e999}')


def http_corpus():
    requests = {
        "get": "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "post-length": "POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                       "Content-Type: application/json\r\n\r\n{}",
        "post-chunked": "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
                        "4;ext=1\r\n{\"a\"\r\nA\r\n:1}       \r\n0\r\nTrailer: v\r\n\r\n",
        "http10": "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "smuggle": "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
    }
    # The target's first byte picks where the bytes are split into two feeds (here: the 17th byte).
    for name, text in requests.items():
        write("http_request", name, "\x11" + text)


def tokenizer_corpus():
    text = "Hello, world! 你好 <|im_end|> <｜User｜> <think>x</think> 123456"
    for name in ("deepseek-like", "kimi-like"):
        d = FUZZ / "data" / name
        main = d / ("tokenizer.json" if (d / "tokenizer.json").exists() else "tiktoken.model")
        write("tokenizer_load", name, main.read_text(encoding="utf-8") + SEP +
              (d / "tokenizer_config.json").read_text(encoding="utf-8") + SEP + text)
    lines = (ROOT / "tests" / "tokenizer" / "data" / "corpus.jsonl").read_text(encoding="utf-8").strip("\n")
    tiny = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"], "unk_token": "a"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\s+|[a-z]+"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
            "decoder": {"type": "ByteLevel"}, "normalizer": None,
            "added_tokens": [{"id": 4, "content": "<s>", "special": True}, {"id": 9, "content": "<t>"}]}
    write("tokenizer_load", "tiny-json", json.dumps(tiny) + SEP + json.dumps({"bos_token": "<s>"}) + SEP + "ab ba<s><t>")
    for i, line in enumerate(lines.split("\n")):
        write("tokenizer_roundtrip", f"corpus-{i:02d}", json.loads(line))
    write("tokenizer_roundtrip", "specials", "<|im_end|><|im_user|>[BOS]<｜User｜><think> <|reserved_token_300|>")


def chat_corpus():
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi <|im_end|>"},
                {"role": "assistant", "content": "ok", "reasoning_content": "hmm",
                 "tool_calls": [{"id": "functions.f:0", "type": "function",
                                 "function": {"name": "f", "arguments": "{\"q\": 1}"}}]},
                {"role": "tool", "tool_call_id": "functions.f:0", "content": "res"},
                {"role": "user", "content": [{"type": "text", "text": "part"}]}]
    tools = [{"type": "function", "function": {"name": "f", "description": "d",
                                                "parameters": {"type": "object", "properties": {"q": {}}}}}]
    for name in ("kimi-k2", "kimi-k2-thinking", "deepseek-v3"):
        write("chat_template", name, name + "\n" + json.dumps({"messages": messages, "tools": tools,
                                                                "add_generation_prompt": True}, ensure_ascii=False))
        write("chat_template", name + "-plain", name + "\n" + json.dumps(messages[:2], ensure_ascii=False))


if __name__ == "__main__":
    tokenizer_data()
    safetensors_corpus()
    config_corpus()
    openai_corpus()
    http_corpus()
    tokenizer_corpus()
    chat_corpus()
