#!/usr/bin/env python3
"""Trains the default model (models/default): a small DeepSeek-V3-architecture model.

Input: the folder scripts/default_model/prepare_data.py writes (tokenizer.json,
train_tokens.npy, heldout_tokens.npy, heldout.txt). Output: a Hugging Face model directory
(config.json, model.safetensors with the MTP layer as DeepSeek-V3 stores it, tokenizer.json,
tokenizer_config.json with the DeepSeek-V3 chat template, README.md, router_stats.json) and
train_log.txt (losses, validation and held-out perplexity).

Training, as DeepSeek-V3 describes it at this scale:
  * transformers' DeepseekV3ForCausalLM, fp32 master weights, bf16 autocast on CUDA, AdamW,
    linear warm-up then cosine decay to 10%;
  * the MTP layer (scripts/deepseek_mtp.py) trained jointly, loss L = L_main + lambda L_mtp
    with lambda = 0.3 (DeepSeek-V3's value for the first 10T tokens);
  * auxiliary-loss-free load balancing: after each step, every MoE layer's
    e_score_correction_bias moves by gamma * sign(mean load - expert load) over the step's
    tokens (gamma = 0.001 as in DeepSeek-V3); the sequence-wise auxiliary loss (alpha 1e-4 in
    DeepSeek-V3) is left out, the bias alone balances the load here;
  * the routed experts are computed densely in training (every expert on every token,
    weighted by the router's top-k weights and zero elsewhere), which is the same function
    as transformers' sparse loop without its host synchronisations.
Reproducible: seeded sampling and initialisation, a fixed data order (the batches' offsets
come from a seeded generator), and deterministic kernels (--deterministic strict, the default:
torch.use_deterministic_algorithms(True) with CUBLAS_WORKSPACE_CONFIG, the attention limited
to SDPA's memory-efficient and math kernels, and no op that accumulates with atomics: the
expert loads are one-hot sums, the loss is a log-softmax gather rather than CUDA's NLLLoss);
so a fixed --steps reproduces a run bit for bit on the same GPU and software (with --steps
auto, the first steps measure the speed and fix the step count to fill --budget; the log names
the count, so that `--steps N` reruns it). --measure-only times the first steps and stops
(scripts/default_model/train_twice_gpu.sh uses it to choose the count of two parallel runs).
"""
import argparse
import json
import math
import os
import pathlib
import shutil
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deepseek_mtp import DeepseekV3MTP, load_mtp, save_with_mtp  # noqa: E402
from default_model.model_card import load_summary, write_model_card  # noqa: E402

MTP_LAMBDA = 0.3
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "mscale": 1.0,
        "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}


def model_config(vocab_size, tiny=False):
    from transformers import DeepseekV3Config
    width = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=64, num_hidden_layers=4,
                 num_attention_heads=4, q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
                 qk_rope_head_dim=16, v_head_dim=32)
    if tiny:  # the CPU smoke run
        width.update(hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=2,
                     q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    config = DeepseekV3Config(
        vocab_size=vocab_size, num_key_value_heads=width["num_attention_heads"], n_shared_experts=1,
        n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=2048, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters=dict(YARN), bos_token_id=0, eos_token_id=1, pad_token_id=2,
        initializer_range=0.02, num_nextn_predict_layers=1, **width)
    config._attn_implementation = "sdpa"
    return config


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """All experts on all tokens, weighted ([N, H] -> [N, H]); equal to the sparse loop."""
    n, e, i = hidden_states.shape[0], self.num_experts, self.intermediate_dim
    weights = torch.zeros(n, e, dtype=top_k_weights.dtype, device=hidden_states.device)
    weights.scatter_(1, top_k_index, top_k_weights)                       # [N, E]
    gate_up = F.linear(hidden_states, self.gate_up_proj.reshape(e * 2 * i, -1)).view(n, e, 2 * i)
    gate, up = gate_up.chunk(2, dim=-1)                                   # [N, E, I] each
    act = self.act_fn(gate) * up * weights.unsqueeze(-1).to(gate.dtype)  # [N, E, I]
    down = self.down_proj.permute(1, 0, 2).reshape(self.hidden_dim, e * i)  # [H, E*I]
    return F.linear(act.reshape(n, e * i), down).to(hidden_states.dtype)


def moe_gates(model, mtp):
    gates = [(f"layer {k}", layer.mlp.gate) for k, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    return gates + [(f"layer {model.config.num_hidden_layers} (MTP)", mtp.block.mlp.gate)]


class LoadCounter:
    """Counts each gate's top-k choices (forward hooks on the routers)."""

    def __init__(self, gates):
        self.gates, self.counts = gates, [None] * len(gates)
        self.handles = [gate.register_forward_hook(self._hook(k)) for k, (_, gate) in enumerate(gates)]

    def _hook(self, k):
        def hook(module, inputs, output):
            # The router returns (logits,) weights and indices; the indices are the integer tensor.
            indices = next(o for o in output if not o.is_floating_point())
            n_experts = module.e_score_correction_bias.numel()
            # One-hot sum rather than bincount: the same counts, with no atomics.
            load = F.one_hot(indices.flatten(), n_experts).sum(0).float()           # [E]
            self.counts[k] = load if self.counts[k] is None else self.counts[k] + load
        return hook

    def take(self):
        counts, self.counts = self.counts, [None] * len(self.gates)
        return counts


def update_biases(counter, gamma):
    """DeepSeek-V3's auxiliary-loss-free balancing step over the loads counted since last time;
    returns each layer's max/mean load of the step (a tensor, to read only when logging)."""
    ratios = []
    with torch.no_grad():
        for (_, gate), load in zip(counter.gates, counter.take()):
            if load is not None:
                gate.e_score_correction_bias.add_(gamma * torch.sign(load.mean() - load))
                ratios.append(load.max() / load.mean())
    return torch.stack(ratios)


def losses(model, mtp, batch):
    """(main loss, MTP loss) of a batch [B, T+2]: tokens 0..T-1 predict 1..T, MTP predicts 2..T+1."""
    t = batch.shape[1] - 2
    inputs, labels, next_ids, mtp_labels = batch[:, :t], batch[:, 1:t + 1], batch[:, 1:t + 1], batch[:, 2:]
    hidden = model.model(input_ids=inputs).last_hidden_state                  # [B, T, H]
    logits = model.lm_head(hidden).float()                                    # [B, T, V]
    main = cross_entropy(logits.flatten(0, 1), labels.flatten())
    mtp_logits = mtp.logits(model, hidden, next_ids).float()
    return main, cross_entropy(mtp_logits.flatten(0, 1), mtp_labels.flatten())


def cross_entropy(logits, targets):
    """Mean -log p(target) of logits [N, V] and targets [N]: F.cross_entropy's value, computed
    with a gather (deterministic backward) because CUDA's NLLLoss backward uses atomics."""
    picked = logits.gather(1, targets[:, None])[:, 0]                      # [N]
    return (torch.logsumexp(logits, dim=-1) - picked).mean()


def windows(n, context, stride):
    """HF's perplexity-guide sliding windows over n tokens: (begin, end, first scored index
    in the window); each window scores its tokens past the previous window's end."""
    prev_end = 0
    for begin in range(0, n, stride):
        end = min(begin + context, n)
        yield begin, end, (end - begin) - (end - prev_end)
        prev_end = end
        if end == n:
            break


def scored_nll(logits, targets, first):
    """Sum of -log p(target) over rows first.. of logits [L, V] for targets [L]."""
    logp = torch.log_softmax(logits[first:].float(), dim=-1)
    return -logp.gather(1, targets[first:, None]).sum().item(), targets.numel() - first


def sliding_window_nll(model, ids, context, stride, device, mtp=None):
    """(NLL sum, scored tokens, MTP NLL sum, MTP scored tokens) of ids [N] over the sliding
    windows; within a window token j is scored from position j-1 (main) and j-2 (MTP)."""
    total = [0.0, 0, 0.0, 0]
    ids = ids.to(device)
    with torch.no_grad():
        for begin, end, first in windows(ids.numel(), context, stride):
            window = ids[begin:end].unsqueeze(0)                           # [1, L]
            hidden = model.model(input_ids=window).last_hidden_state      # [1, L, H]
            nll, n = scored_nll(model.lm_head(hidden)[0, :-1], window[0, 1:], max(first - 1, 0))
            total[0], total[1] = total[0] + nll, total[1] + n
            if mtp is not None and window.shape[1] > 2:
                mtp_logits = mtp.logits(model, hidden[:, :-2], window[:, 1:-1])[0]  # predicts window[2:]
                nll, n = scored_nll(mtp_logits, window[0, 2:], max(first - 2, 0))
                total[2], total[3] = total[2] + nll, total[3] + n
    return tuple(total)


class Log:
    def __init__(self, path):
        self.file = open(path, "w")

    def __call__(self, message):
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def schedule(step, steps, warmup, lr):
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def build(args, vocab_size, device):
    from transformers import DeepseekV3ForCausalLM
    torch.manual_seed(args.seed)
    config = model_config(vocab_size, tiny=args.tiny)
    model = DeepseekV3ForCausalLM(config).float().to(device)
    mtp = DeepseekV3MTP(config).float().to(device)
    with torch.no_grad():  # the MTP layer starts like a decoder layer of the main model
        for module in mtp.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, config.initializer_range)
        for name, p in mtp.block.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, config.initializer_range)
    return model, mtp


def use_dense_experts(model, mtp):
    for module in list(model.modules()) + list(mtp.modules()):
        if type(module).__name__ == "DeepseekV3Experts":
            module.forward = types.MethodType(dense_experts_forward, module)


def check_dense_experts(model, mtp, device, log):
    """Trains with the dense expert path if it equals transformers' sparse one (same logits on
    a few tokens), else with transformers' own (slower, same function)."""
    ids = torch.arange(3, 40, device=device).unsqueeze(0) % model.config.vocab_size
    # Without deterministic mode, which transformers' sparse loop may not run under (this
    # forward changes no state: it leaves the run as reproducible as before).
    mode = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(False)
    try:
        with torch.no_grad():
            sparse = model(ids).logits
            use_dense_experts(model, mtp)
            dense = model(ids).logits
        rel = ((dense - sparse).abs().max() / sparse.abs().max()).item()
        log(f"dense experts vs transformers' sparse loop: max rel logit diff {rel:.2e}")
        if rel < 1e-4:
            return
    except Exception as error:  # another transformers release's experts interface
        log(f"dense experts unusable ({type(error).__name__}: {error})")
    finally:
        torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
    for module in list(model.modules()) + list(mtp.modules()):
        module.__dict__.pop("forward", None)
    log("training with transformers' experts")


def make_optimizer(args, model, mtp, device):
    """AdamW: weight decay on matrices but the routers'; each group's lr is --lr x its scale."""
    named = list(model.named_parameters()) + [("mtp." + k, p) for k, p in mtp.named_parameters()]
    router = [p for k, p in named if k.endswith("mlp.gate.weight")]
    decay = [p for k, p in named if p.dim() >= 2 and not k.endswith("mlp.gate.weight")]
    no_decay = [p for _, p in named if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1, "scale": 1.0},
                             {"params": no_decay, "weight_decay": 0.0, "scale": 1.0},
                             {"params": router, "weight_decay": 0.0, "scale": args.router_lr_scale}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    return opt, [p for _, p in named]


def make_deterministic(mode, device):
    """Deterministic kernels (see the module docstring): 'strict' raises on an op without a
    deterministic kernel, 'warn' only warns (to find such an op), 'off' leaves torch's defaults."""
    if mode == "off":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
    torch.use_deterministic_algorithms(True, warn_only=mode == "warn")
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    if device.type == "cuda":
        # MLA's q/k (48) and v (32) head sizes differ; the memory-efficient kernel (one key
        # split in deterministic mode) or the math one runs, never flash or cuDNN attention.
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)


class StepCount:
    """The run's step count: --steps N, or with --steps auto the count that fills --budget at
    the speed of steps 10..--measure-steps (rounded down to hundreds, at most --max-steps)."""

    def __init__(self, args, log):
        self.args, self.log, self.start = args, log, time.time()
        self.measure_start = self.start
        self.auto = args.steps == "auto" and not args.measure_only
        if args.measure_only:
            self.planned = args.measure_steps
        else:
            self.planned = args.max_steps if self.auto else int(args.steps)

    def before(self, step):
        args = self.args
        if self.auto and step == args.measure_steps:
            per_step = (time.time() - self.measure_start) / (args.measure_steps - 10)
            fit = int((args.budget - (time.time() - self.start)) / per_step) + step
            self.planned = max(step + 1, min(args.max_steps, fit // 100 * 100))
            self.log(f"measured {per_step * 1000:.1f} ms/step: --steps auto fixes {self.planned} steps "
                     f"(rerun with --steps {self.planned})")
        if step == 10:
            self.measure_start = time.time()

    def stop_clock(self, step):
        """After the last step (before its logging and validation): the seconds per step since
        step 10, the speed --measure-only reports."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.per_step = (time.time() - self.measure_start) / max(1, step - 10)

    def elapsed(self):
        return time.time() - self.start

    def out_of_time(self):
        return self.elapsed() > self.args.budget + self.args.grace


def train_step(model, mtp, opt, params, batch, counter, gamma):
    """One optimizer step and bias update: (main loss, MTP loss, max/mean load per layer)."""
    with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=batch.device.type == "cuda"):
        main, mtp_loss = losses(model, mtp, batch)
        loss = main + MTP_LAMBDA * mtp_loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return main, mtp_loss, update_biases(counter, gamma)


def validation_ppl(model, mtp, val_tokens, seq):
    model.eval(), mtp.eval()
    device = val_tokens.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        nll, n, _, _ = sliding_window_nll(model, val_tokens[:seq * 8], seq, seq, device)
    model.train(), mtp.train()
    return math.exp(nll / n)


def train(args, model, mtp, tokens, log):
    """Trains until the step count (or the time limit); returns (steps, seconds). The last 2%
    of the tokens are the validation slice (never sampled)."""
    device = tokens.device
    val_len = max(args.seq * 4, tokens.numel() // 50)
    train_tokens, val_tokens = tokens[:-val_len], tokens[-val_len:]
    opt, params = make_optimizer(args, model, mtp, device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    counter = LoadCounter(moe_gates(model, mtp))
    offsets = torch.arange(args.seq + 2, device=device)
    count, step = StepCount(args, log), 0
    while step < count.planned:
        count.before(step)
        lr = schedule(step, count.planned, args.warmup, args.lr)
        for group in opt.param_groups:
            group["lr"] = lr * group["scale"]
        starts = torch.randint(0, train_tokens.numel() - args.seq - 2, (args.batch,), device=device, generator=gen)
        main, mtp_loss, balance = train_step(model, mtp, opt, params, train_tokens[starts[:, None] + offsets],
                                             counter, args.bias_gamma)
        step += 1
        last = step == count.planned
        if last:
            count.stop_clock(step)
        if step % args.log_every == 0 or last:
            loads = " ".join(f"{x:.2f}" for x in balance.tolist())
            log(f"step {step}/{count.planned} lr {lr:.2e} loss {main.item():.4f} mtp_loss {mtp_loss.item():.4f} "
                f"max/mean expert load {loads} elapsed {count.elapsed():.0f}s")
        if step % args.eval_every == 0 or last:
            log(f"step {step}: validation ppl {validation_ppl(model, mtp, val_tokens, args.seq):.3f}")
        if count.out_of_time():
            log(f"stopped by time at step {step} of {count.planned} (the run does not reproduce a fixed count)")
            break
    counter.take()
    for handle in counter.handles:
        handle.remove()
    return step, count


def load_fractions(counter):
    """Expert load per MoE layer (fraction of the top-k choices) from a LoadCounter."""
    layers = {}
    for (name, _), load in zip(counter.gates, counter.take()):
        frac = (load / load.sum()).tolist()
        layers[name] = {"load_fraction": [round(x, 5) for x in frac], "max_over_mean": round(max(frac) * len(frac), 4),
                        "min_over_mean": round(min(frac) * len(frac), 4)}
    for handle in counter.handles:
        handle.remove()
    return layers


def write_tokenizer_files(data, chat_template, out):
    shutil.copy(data / "tokenizer.json", out / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<｜begin▁of▁sentence｜>",
              "eos_token": "<｜end▁of▁sentence｜>", "pad_token": "<｜▁pad▁｜>", "add_bos_token": False,
              "add_eos_token": False, "model_max_length": 2048, "clean_up_tokenization_spaces": False,
              "chat_template": chat_template.read_text()}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def evaluate_saved(out, heldout, context, stride, log):
    """Held-out perplexity of the saved (bf16) weights in fp32 on CPU, main and MTP heads, and
    the expert load per MoE layer over the same windows (router_stats.json's content)."""
    model, mtp = load_mtp(out, dtype=torch.float32)
    counter = LoadCounter(moe_gates(model, mtp))
    nll, n, mnll, mn = sliding_window_nll(model, heldout.cpu(), context, stride, torch.device("cpu"), mtp=mtp)
    ppl, mtp_ppl = math.exp(nll / n), math.exp(mnll / mn)
    log(f"held-out perplexity (saved bf16 weights, fp32 CPU, context {context} stride {stride}): {ppl:.4f} "
        f"over {n} tokens; MTP head (predicting t+2): {mtp_ppl:.4f}")
    return {"heldout_ppl": round(ppl, 4), "heldout_mtp_ppl": round(mtp_ppl, 4), "heldout_scored_tokens": n,
            "context": context, "stride": stride, "experts_per_token": model.config.num_experts_per_tok,
            "note": "load_fraction: share of the top-k choices each routed expert got over the held-out "
                    "windows (each window's tokens, overlaps counted again); uniform is 1/n_routed_experts",
            "layers": load_fractions(counter)}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder of prepare_data.py's output")
    parser.add_argument("--chat-template", required=True, help="the DeepSeek-V3 Jinja template file")
    parser.add_argument("--out", required=True, help="model directory to write")
    parser.add_argument("--log", help="log file (default OUT/train_log.txt)")
    parser.add_argument("--steps", default="auto", help="optimizer steps, or 'auto' (fill --budget)")
    parser.add_argument("--max-steps", type=int, default=6000)
    parser.add_argument("--budget", type=float, default=380.0, help="seconds of training for --steps auto")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds past --budget before stopping")
    parser.add_argument("--measure-steps", type=int, default=60)
    parser.add_argument("--measure-only", action="store_true",
                        help="train --measure-steps steps, write OUT/measure.json (seconds per step), stop")
    parser.add_argument("--deterministic", choices=["strict", "warn", "off"], default="strict")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--bias-gamma", type=float, default=1e-2,
                        help="bias update speed (DeepSeek-V3: 1e-3 at lr 2.2e-4; scaled with the lr here)")
    parser.add_argument("--router-lr-scale", type=float, default=1.0, help="the routers' lr / --lr")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens to score (default all)")
    parser.add_argument("--tiny", action="store_true", help="a tiny config (CPU smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args()


def load_tokens(data, device):
    """(training tokens [N] on device, held-out tokens [M], vocabulary size). The held-out text
    is encoded as `moeserve eval-ppl --text heldout.txt` encodes it: no special tokens."""
    from tokenizers import Tokenizer
    tokens = torch.from_numpy(np.load(data / "train_tokens.npy").astype(np.int64)).to(device)
    text = (data / "heldout.txt").read_text(encoding="utf-8")
    heldout = torch.tensor(Tokenizer.from_file(str(data / "tokenizer.json")).encode(text, add_special_tokens=False).ids)
    vocab = json.loads((data / "tokenizer.json").read_text())
    vocab_size = len(vocab["model"]["vocab"]) + sum(1 for t in vocab["added_tokens"]
                                                    if t["content"] not in vocab["model"]["vocab"])
    return tokens, heldout, vocab_size


def save_and_evaluate(args, steps, model, mtp, heldout, data, out, log):
    """Writes the model directory (weights, tokenizer, router_stats.json, model card) and logs
    the held-out perplexity and the weights' SHA-256 (two runs compare by it)."""
    import hashlib
    model.eval(), mtp.eval()
    model.config.architectures = ["DeepseekV3ForCausalLM"]
    save_with_mtp(model.cpu(), mtp.cpu(), out)
    (out / "generation_config.json").unlink(missing_ok=True)
    write_tokenizer_files(data, pathlib.Path(args.chat_template), out)
    stats = evaluate_saved(out, heldout[:args.eval_tokens], args.seq, args.seq // 2, log)
    stats.update(steps=steps, seed=args.seed, batch=args.batch, seq=args.seq, bias_gamma=args.bias_gamma)
    (out / "router_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    write_model_card(out, stats, model.config, load_summary(data), " ".join(sys.argv), device_name)
    for name, layer in stats["layers"].items():
        log(f"router {name}: max/mean load {layer['max_over_mean']}, min/mean {layer['min_over_mean']}")
    for path in out.iterdir():
        path.chmod(0o644)
    weights = (out / "model.safetensors").read_bytes()
    log(f"model.safetensors {len(weights)} bytes, sha256 {hashlib.sha256(weights).hexdigest()}; "
        f"done in {time.time() - log_start:.0f}s")


def main():
    args = parse_args()
    data, out = pathlib.Path(args.data), pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(args.log or out / "train_log.txt")
    log(f"command: {' '.join(sys.argv)}")
    log(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
        + f", deterministic {args.deterministic}")
    device = torch.device(args.device)
    make_deterministic(args.deterministic, device)
    torch.backends.cuda.matmul.allow_tf32 = False
    tokens, heldout, vocab_size = load_tokens(data, device)
    model, mtp = build(args, vocab_size, device)
    n_params = sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in mtp.parameters())
    log(f"train tokens {tokens.numel()}, held-out tokens {heldout.numel()}, vocab {vocab_size}, "
        f"parameters {n_params} (MTP included, head shared)")
    check_dense_experts(model, mtp, device, log)
    model.train(), mtp.train()
    steps, count = train(args, model, mtp, tokens, log)
    if args.measure_only:
        (out / "measure.json").write_text(json.dumps({"steps": steps, "seconds_per_step": count.per_step,
                                                      "startup_seconds": count.start - log_start}) + "\n")
        log(f"measured {count.per_step * 1000:.1f} ms/step over steps 10..{steps}")
        return
    log(f"trained {steps} steps of {args.batch}x{args.seq} tokens in {count.elapsed():.0f}s "
        f"({steps * args.batch * args.seq / tokens.numel():.1f} epochs)")
    save_and_evaluate(args, steps, model, mtp, heldout, data, out, log)


if __name__ == "__main__":
    log_start = time.time()
    main()
