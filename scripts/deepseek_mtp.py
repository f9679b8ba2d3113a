"""DeepSeek-V3's multi-token prediction (MTP) module, depth 1, over transformers' DeepseekV3.

transformers implements the main model only; this is the reference computation of the MTP
layer that DeepSeek-V3 checkpoints store as decoder layer `num_hidden_layers` (here N):

  model.layers.N.enorm.weight              RMSNorm of the next token's embedding
  model.layers.N.hnorm.weight              RMSNorm of the main model's hidden state
  model.layers.N.eh_proj.weight            [hidden, 2*hidden], over concat(enorm(e), hnorm(h))
  model.layers.N.{self_attn,mlp,...}       one decoder block, like the main layers (MoE here)
  model.layers.N.shared_head.norm.weight   final RMSNorm
  model.layers.N.shared_head.head.weight   output head, a copy of lm_head (shared in training)

At position i, with h_i the main model's last hidden state (after model.norm, as vLLM and
SGLang feed it to their DeepSeek MTP layers) and t_{i+1} the next token:
  x_i = eh_proj(concat(enorm(embed(t_{i+1})), hnorm(h_i)))       # [*, hidden]
  y   = block(x, positions i)                                     # causal over i
  logits_i = head(shared_head.norm(y_i))                         # predicts t_{i+2}
The order of the concatenation (embedding first) is vLLM's / SGLang's. The embedding and
the head are the main model's (shared, as in DeepSeek-V3 training); the checkpoint stores a
copy of the head under shared_head.head (DeepSeek-V3 also stores a copy of the embedding as
model.layers.N.embed_tokens.weight; this repository's default model leaves it out to stay
within its size budget, readers take model.embed_tokens.weight).
"""
import torch
from torch import nn

MTP_EXTRA = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
             "shared_head.head.weight")


def causal_mask(config, x):
    """The block's attention mask for x [B, T, H]: None under SDPA (which is then causal), else
    an additive [1, 1, T, T] mask (eager attention adds it). Built here rather than with
    transformers' masking utilities, whose signature changes between releases."""
    if config._attn_implementation == "sdpa":
        return None
    t = x.shape[1]
    upper = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    return torch.zeros(t, t, dtype=x.dtype, device=x.device).masked_fill(upper, torch.finfo(x.dtype).min)[None, None]


class DeepseekV3MTP(nn.Module):
    """The MTP layer; `block` is a DeepseekV3DecoderLayer built with layer_idx = num_hidden_layers."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3DecoderLayer,
                                                                          DeepseekV3RMSNorm)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = DeepseekV3RMSNorm(hidden, eps=eps)
        self.hnorm = DeepseekV3RMSNorm(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = DeepseekV3DecoderLayer(config, layer_idx=config.num_hidden_layers)
        self.final_norm = DeepseekV3RMSNorm(hidden, eps=eps)  # shared_head.norm

    def hidden(self, model, hidden_states, next_ids, position_ids=None):
        """Final-normed MTP hidden states [B, T, hidden] from the main model's `hidden_states`
        [B, T, hidden] (after model.norm) and the next tokens `next_ids` [B, T]."""
        inner = model.model
        embeds = inner.embed_tokens(next_ids)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden_states)], dim=-1))
        if position_ids is None:
            position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        mask = causal_mask(inner.config, x)
        position_embeddings = inner.rotary_emb(x, position_ids)
        y = self.block(x, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
        return self.final_norm(y)

    def logits(self, model, hidden_states, next_ids, position_ids=None):
        """MTP logits [B, T, vocab]: position i predicts token i+2."""
        return model.lm_head(self.hidden(model, hidden_states, next_ids, position_ids))


def mtp_state_dict(mtp, model, layer_index):
    """The MTP layer's extra tensors under DeepSeek-V3's names (the block is saved separately,
    by transformers' serialization of a decoder layer, see save_with_mtp)."""
    prefix = f"model.layers.{layer_index}."
    return {prefix + "enorm.weight": mtp.enorm.weight, prefix + "hnorm.weight": mtp.hnorm.weight,
            prefix + "eh_proj.weight": mtp.eh_proj.weight,
            prefix + "shared_head.norm.weight": mtp.final_norm.weight,
            prefix + "shared_head.head.weight": model.lm_head.weight}


def save_with_mtp(model, mtp, directory, dtype=torch.bfloat16):
    """Saves `model` with its MTP layer as DeepSeek-V3 stores it: transformers serializes the
    main model plus the MTP block as one more decoder layer (so the block has the layout of
    the other layers), then config.json says num_hidden_layers = N, num_nextn_predict_layers
    = 1 and the extra tensors are added."""
    import copy
    import json
    import pathlib

    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3ForCausalLM
    directory = pathlib.Path(directory)
    n = model.config.num_hidden_layers
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = n + 1
    with torch.device("meta"):
        wide = DeepseekV3ForCausalLM(config)
    # Copies: the cast to `dtype` is in place.
    main, block = copy.deepcopy(model), copy.deepcopy(mtp.block)
    wide.model.embed_tokens, wide.model.norm, wide.lm_head = main.model.embed_tokens, main.model.norm, main.lm_head
    wide.model.layers = torch.nn.ModuleList(list(main.model.layers) + [block])
    wide.to(dtype).save_pretrained(directory, safe_serialization=True)
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    for name, value in mtp_state_dict(mtp, model, n).items():
        tensors[name] = value.detach().to(dtype).contiguous()
    # The score-correction biases stay fp32, as DeepSeek-V3 stores them.
    biases = {name: b for name, b in list(model.named_buffers()) + [
        (f"model.layers.{n}." + k, b) for k, b in mtp.block.named_buffers()] if name.endswith("e_score_correction_bias")}
    for name, b in biases.items():
        if name in tensors:
            tensors[name] = b.detach().float().cpu().contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})
    config_path = directory / "config.json"
    saved = json.loads(config_path.read_text())
    saved["num_hidden_layers"] = n
    saved["num_nextn_predict_layers"] = 1
    config_path.write_text(json.dumps(saved, indent=2) + "\n")


def load_mtp(directory, dtype=torch.float32):
    """(model, mtp) of a saved directory: the main model, and its MTP layer from
    model.layers.N.* (the block loaded by transformers as layer N of an N+1-layer model, so
    that it converts the checkpoint's layout as for the other layers)."""
    import pathlib

    from safetensors import safe_open
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    config = DeepseekV3Config.from_pretrained(directory)
    n = config.num_hidden_layers
    prefix = f"model.layers.{n}."
    path = pathlib.Path(directory) / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        extra = {name: f.get_tensor(prefix + name) for name in MTP_EXTRA if prefix + name in f.keys()}
    missing = [prefix + name for name in MTP_EXTRA if name not in extra]
    if missing:
        raise KeyError(f"{path}: MTP tensors {missing} are missing")
    model = DeepseekV3ForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    wide = DeepseekV3ForCausalLM.from_pretrained(directory, dtype=dtype, num_hidden_layers=n + 1)
    mtp = DeepseekV3MTP(config)
    mtp.block = wide.model.layers[n]
    with torch.no_grad():
        mtp.enorm.weight.copy_(extra["enorm.weight"])
        mtp.hnorm.weight.copy_(extra["hnorm.weight"])
        mtp.eh_proj.weight.copy_(extra["eh_proj.weight"])
        mtp.final_norm.weight.copy_(extra["shared_head.norm.weight"])
    return model, mtp.to(dtype).eval()
