"""The default model's README.md (model card), from its config and the training run."""
import json
import pathlib

CARD = """# moeserve default model

A small model of the DeepSeek-V3 architecture, trained from scratch so that moeserve has a real
default model (`moeserve serve` / `generate` without `--model`). It writes English-looking text
about Python, the Linux kernel and King James English; it knows little and is not an assistant.

## Architecture (config.json)
- {layers} decoder layers, hidden {hidden}, vocabulary {vocab} (byte-level BPE, tokenizer.json)
- MLA attention: {heads} heads, q LoRA rank {q_lora}, KV latent {kv_lora}, rope {rope} + nope {nope}
  dims, v {v}; YaRN rope scaling (factor {yarn_factor}, original context {yarn_orig})
- layer 0 dense (intermediate {inter}); layers 1-{last} MoE: {experts} routed experts (intermediate
  {moe_inter}), top-{topk} with sigmoid scores, group-limited routing ({groups} groups, top {topk_group}),
  e_score_correction_bias, {shared} shared expert
- one MTP layer (num_nextn_predict_layers: 1) stored as DeepSeek-V3 stores it, as layer {layers}:
  enorm, hnorm, eh_proj, a MoE decoder block, shared_head.norm, shared_head.head (a copy of lm_head);
  the reference computation is scripts/deepseek_mtp.py
- bf16 weights ({size} bytes), the routers' score-correction biases in fp32
- chat template: DeepSeek-V3's (tokenizer_config.json), EOS `<｜end▁of▁sentence｜>`

## Training data (Debian packages, nothing downloaded)
- python3.11-doc: Python 3.11 documentation sources, PSF License Version 2
- linux-doc-6.1: Linux kernel Documentation/ (translations left out), GPL-2.0
- bible-kjv: the King James Version, public domain
reST markup, code and literal blocks removed (scripts/default_model/prepare_data.py); plus chat turns
made from section titles / first paragraphs and consecutive verses. {train_tokens} training tokens.
Held out (never trained on), kept as heldout.txt: {heldout_docs}.

## Training (scripts/train_default_model.py)
{steps} steps of {batch} x {seq} tokens, seed {seed}, AdamW, MTP loss weight 0.3, auxiliary-loss-free
load balancing (bias update {gamma} x sign per step), on {device}. Command:

    {command}

## Results
Held-out perplexity (heldout.txt, context {context}, stride {stride}, fp32 on CPU of the bf16 weights):
**{ppl}** (main head), {mtp_ppl} for the MTP head (predicting two tokens ahead).
Expert load per layer on the held-out text: router_stats.json (max/mean {max_load}).
"""


def write_model_card(out, stats, config, data_summary, command, device):
    out = pathlib.Path(out)
    rope = config.rope_parameters
    text = CARD.format(
        layers=config.num_hidden_layers, hidden=config.hidden_size, vocab=config.vocab_size,
        heads=config.num_attention_heads, q_lora=config.q_lora_rank, kv_lora=config.kv_lora_rank,
        rope=config.qk_rope_head_dim, nope=config.qk_nope_head_dim, v=config.v_head_dim,
        yarn_factor=rope["factor"], yarn_orig=rope["original_max_position_embeddings"],
        inter=config.intermediate_size, last=config.num_hidden_layers - 1, experts=config.n_routed_experts,
        moe_inter=config.moe_intermediate_size, topk=config.num_experts_per_tok, groups=config.n_group,
        topk_group=config.topk_group, shared=config.n_shared_experts,
        size=(out / "model.safetensors").stat().st_size, train_tokens=data_summary["train_tokens"],
        heldout_docs=", ".join(data_summary["heldout_pydoc"] + data_summary["heldout_books"]),
        steps=stats["steps"], gamma=stats["bias_gamma"], batch=stats["batch"], seq=stats["seq"], seed=stats["seed"], device=device,
        command=command, context=stats["context"], stride=stats["stride"], ppl=stats["heldout_ppl"],
        mtp_ppl=stats["heldout_mtp_ppl"],
        max_load=", ".join(f"{k}: {v['max_over_mean']}" for k, v in stats["layers"].items()))
    (out / "README.md").write_text(text)


def load_summary(data):
    return json.loads((pathlib.Path(data) / "data_summary.json").read_text())
