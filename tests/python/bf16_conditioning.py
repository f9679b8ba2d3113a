"""How well the parity checkpoints survive bf16: transformers bf16 against transformers fp32.

For each config in checkpoints.CONFIGS this measures, on the prompts of
scripts/gpu/parity_vs_transformers.py:
  * the normalised logit error max |bf16 - fp32| / max |fp32| over all prompt positions;
  * the fraction of prompt positions whose argmax agrees;
  * whether 32-step greedy continuations (generate, do_sample=False, eos_token_id=None) of
    the bf16 and fp32 models are identical for every prompt, and how many leading steps agree;
  * the smallest fp32 top-1/top-2 logit gap over the prompt positions (the margin bf16 noise
    has to cross to flip an argmax), and the smallest ratio of that gap to the largest bf16
    logit error at the same position over all 129 decisions (prompts + greedy steps);
  * the same error/agreement/greedy numbers with SDPA instead of eager attention in bf16.
The checkpoints are meant to be bf16-conditioned (see checkpoints.py): agreement >= 99.5% and
identical greedy continuations for every config. A bf16 runtime (moeserve CUDA) can only be
held to "as good as transformers' own bf16", so these numbers bound what the GPU check can ask.

    python3 tests/python/bf16_conditioning.py [--device cpu|cuda] [--threads N] [--json PATH]
    python3 tests/python/bf16_conditioning.py --search [--workers N] [--configs NAME ...]  # re-derive checkpoints.SEEDS

`measure(model, device)` is importable so the GPU script can log the same numbers.
"""
import argparse
import copy
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from checkpoints import CONFIGS, make_model  # noqa: E402

# Same prompts as scripts/gpu/parity_vs_transformers.py.
PROMPTS = [[5, 17, 42, 99, 3, 250, 7, 1, 64, 128, 33, 2, 91, 8, 19, 77, 140, 201, 66, 9, 12, 180, 45, 3],
           [200, 4], [11, 12, 13, 14, 15, 16, 17]]
GREEDY = 32


def _logits(model, device):
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            out.append(model(torch.tensor([p], device=device)).logits[0].float().cpu())
    return torch.cat(out)


def _greedy(model, device):
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([p], device=device)
            gen = model.generate(ids, max_new_tokens=GREEDY, do_sample=False, use_cache=True,
                                 eos_token_id=None, pad_token_id=0)
            out.append(gen[0, len(p):].tolist())
    return out


def _bf16(model, device, attn):
    low = copy.deepcopy(model).to(device).to(torch.bfloat16).eval()
    low.set_attn_implementation(attn)
    return low


def measure(model, device="cpu", greedy=True, attn="eager"):
    """bf16-vs-fp32 agreement of a fp32 transformers model (left unchanged); `attn` is the
    bf16 model's attention implementation (the fp32 reference stays eager)."""
    fp32 = copy.deepcopy(model).to(device).float().eval()
    bf16 = _bf16(model, device, attn)
    truth, low = _logits(fp32, device), _logits(bf16, device)
    top2 = truth.topk(2, dim=-1).values
    entry = {
        "hf_bf16_error": float((low - truth).abs().max() / truth.abs().max()),
        "hf_bf16_argmax_agreement": float((low.argmax(-1) == truth.argmax(-1)).float().mean()),
        "max_abs_logit": float(truth.abs().max()),
        "min_top2_gap": float((top2[:, 0] - top2[:, 1]).min()),
    }
    if greedy:
        ref, got = _greedy(fp32, device), _greedy(bf16, device)
        entry["greedy_bf16_equals_fp32"] = ref == got
        entry["greedy_steps_equal"] = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                                       for x, y in zip(got, ref)]
        entry["min_margin_ratio"] = _margin(fp32, [bf16], ref, device)
        entry["min_router_margin"] = _router_margin(fp32, [bf16], ref, device)
    return entry


def _margin(fp32, lows, ref, device):
    """Smallest margin over every decision (prompt positions and the fp32 greedy steps `ref`,
    teacher-forced): fp32 top-2 gap / largest bf16 logit error at that position (over the
    bf16 models `lows`). A flip needs the errors of the two top logits to differ by the gap,
    so a ratio above 2 rules one out; below 1 the gap is within the noise of some logit."""
    ratios = []
    with torch.no_grad():
        for p, cont in zip(PROMPTS, ref):
            ids = torch.tensor([p + cont[:-1]], device=device)
            a = fp32(ids).logits[0].float().cpu()
            err = torch.stack([(low(ids).logits[0].float().cpu() - a).abs().amax(-1) for low in lows]).amax(0)
            top2 = a.topk(2, dim=-1).values
            ratios.append((top2[:, 0] - top2[:, 1]) / err.clamp_min(1e-9))
    return float(torch.cat(ratios).min())


def _router_logits(model, ids):
    """The fp32 router logits [positions, experts] of every MoE layer for one sequence."""
    captured = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out: captured.append(out[0].float().cpu()))
             for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return captured


def _router_margin(fp32, lows, ref, device):
    """Smallest routing margin over every MoE layer and decision position (prompts and the fp32
    greedy steps `ref`, teacher-forced): the fp32 gap between the last chosen and the first
    unchosen expert score (and, with group-limited routing, group score: a sum of two scores,
    so its noise counts twice), over the largest bf16 error of any expert score at that
    position (over the bf16 models `lows`). Below 1 an expert choice can flip under bf16
    rounding, moving the token's hidden state far more than rounding does. Reported by
    measure(), not used to choose SEEDS: on the GPU it did not predict which checkpoints
    moeserve's bf16 path keeps on the fp32 path (2026-11-30: q_lora_grouped_dense0 seed 311,
    router margin 0.011, kept every argmax; seed 1272, 0.129, lost 2 of 33)."""
    cfg = fp32.config
    experts, groups = cfg.n_routed_experts, cfg.n_group
    ratios = []
    with torch.no_grad():
        for p, cont in zip(PROMPTS, ref):
            ids = torch.tensor([p + cont[:-1]], device=device)
            truth = _router_logits(fp32, ids)
            noisy = [_router_logits(low, ids) for low in lows]
            for layer, logits in enumerate(truth):
                scores = logits.double().sigmoid()
                noise = torch.stack([(n[layer].double().sigmoid() - scores).abs().amax(-1) for n in noisy]).amax(0)
                bias = fp32.model.layers[[i for i, l in enumerate(fp32.model.layers) if hasattr(l.mlp, "gate")][layer]]
                choice = scores + bias.mlp.gate.e_score_correction_bias.double().cpu()
                ratio = torch.full((choice.shape[0],), float("inf"), dtype=torch.float64)
                if groups > 1:
                    group_scores = choice.view(-1, groups, experts // groups).topk(2, dim=-1)[0].sum(-1)
                    ordered = group_scores.sort(dim=-1, descending=True).values
                    gap = ordered[:, cfg.topk_group - 1] - ordered[:, cfg.topk_group]
                    ratio = torch.minimum(ratio, gap / (2 * noise).clamp_min(1e-12))
                    keep = torch.zeros_like(group_scores, dtype=torch.bool)
                    keep.scatter_(1, group_scores.topk(cfg.topk_group, dim=-1).indices, True)
                    choice = choice.masked_fill(~keep.repeat_interleave(experts // groups, dim=1), float("-inf"))
                ordered = choice.sort(dim=-1, descending=True).values
                gap = ordered[:, cfg.num_experts_per_tok - 1] - ordered[:, cfg.num_experts_per_tok]
                ratios.append(torch.minimum(ratio, gap / noise.clamp_min(1e-12)))
    return float(torch.cat(ratios).min()) if ratios else float("inf")


def conditioned(entry):
    return entry["hf_bf16_argmax_agreement"] >= 0.995 and entry.get("greedy_bf16_equals_fp32", True)


SEARCH_SEEDS = 2600  # seeds [0, SEARCH_SEEDS) are candidates
SEARCH_FINALISTS = 4  # best by the eager margin, re-measured with eager and SDPA


def margin_of(model, device="cpu", attns=("eager",)):
    """The smallest fp32-gap / bf16-error ratio over every decision (see _margin) with the
    bf16 models of `attns`, or -1 when one of them leaves the fp32 greedy path."""
    fp32 = copy.deepcopy(model).to(device).float().eval()
    ref = _greedy(fp32, device)
    lows = []
    for attn in attns:
        low = _bf16(model, device, attn)
        if _greedy(low, device) != ref or not torch.equal(_logits(low, device).argmax(-1), _logits(fp32, device).argmax(-1)):
            return -1.0
        lows.append(low)
    return _margin(fp32, lows, ref, device)


def _eager_margin(name_seed_device):
    name, seed, device = name_seed_device
    torch.set_num_threads(1)
    return margin_of(make_model(name, seed), device), seed


def search(name, device="cpu", seeds=SEARCH_SEEDS, finalists=SEARCH_FINALISTS, log=None, workers=1):
    """The most bf16-robust seed of checkpoint `name` among [0, seeds): the one whose smallest
    decision margin (fp32 top-2 gap over the largest transformers-bf16 logit error, eager and
    SDPA) is largest. Only the transformers oracle is consulted, never moeserve. `workers`
    processes share the eager pass (one thread each; the result does not depend on it)."""
    jobs = [(name, s, device) for s in range(seeds)]
    if workers > 1:
        import multiprocessing
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            eager = sorted(pool.map(_eager_margin, jobs, chunksize=8), reverse=True)
    else:
        eager = sorted(map(_eager_margin, jobs), reverse=True)
    best = max((margin_of(make_model(name, s), device, ("eager", "sdpa")), s) for _, s in eager[:finalists])
    if log:
        log(f"{name}: eager margins of the finalists {[(s, round(m, 3)) for m, s in eager[:finalists]]}; "
            f"chosen seed {best[1]} (eager+sdpa margin {best[0]:.3f})")
    return best[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--configs", nargs="*", default=sorted(CONFIGS))
    parser.add_argument("--search", action="store_true", help="print the smallest conditioned seed per config")
    parser.add_argument("--workers", type=int, default=1, help="processes for --search's eager pass")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.search:
        for name in args.configs:
            seed = search(name, device=args.device, log=lambda m: print(m, file=sys.stderr, flush=True),
                          workers=args.workers)
            print(f'    "{name}": {seed},', flush=True)
        return 0
    report, ok = {}, True
    for name in args.configs:
        model = make_model(name)
        entry = measure(model, args.device)
        sdpa = measure(model, args.device, attn="sdpa")
        entry["sdpa"] = {k: sdpa[k] for k in ("hf_bf16_error", "hf_bf16_argmax_agreement", "greedy_bf16_equals_fp32")}
        entry["conditioned"] = conditioned(entry) and conditioned(sdpa)
        ok &= entry["conditioned"]
        report[name] = entry
        print(f"{name:26s} err {entry['hf_bf16_error']:.4f}  argmax {entry['hf_bf16_argmax_agreement']:.4f}  "
              f"greedy {'same' if entry['greedy_bf16_equals_fp32'] else 'DIFF'} {entry['greedy_steps_equal']}  "
              f"max|logit| {entry['max_abs_logit']:.2f}  min gap {entry['min_top2_gap']:.3f}  "
              f"margin {entry['min_margin_ratio']:.2f}  router margin {entry['min_router_margin']:.2f}  "
              f"[sdpa err {sdpa['hf_bf16_error']:.4f} argmax {sdpa['hf_bf16_argmax_agreement']:.4f} "
              f"greedy {'same' if sdpa['greedy_bf16_equals_fp32'] else 'DIFF'}]", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    print("bf16 conditioning:", "OK" if ok else "POOR")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
