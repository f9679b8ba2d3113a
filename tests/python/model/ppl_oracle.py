"""Sliding-window perplexity as Hugging Face's perplexity guide computes it (the oracle of
`moeserve eval-ppl`): windows of `context` tokens every `stride` tokens, each window's tokens
before the previous window's end masked with -100, transformers' own loss per window."""
import math

import torch


def hf_sliding_window_ppl(model, ids, context, stride):
    """(perplexity, scored tokens) of ids [N] (a 1-D LongTensor) under `model`."""
    nll_sum, n_tokens, prev_end = 0.0, 0, 0
    for begin in range(0, ids.numel(), stride):
        end = min(begin + context, ids.numel())
        trg_len = end - prev_end
        input_ids = ids[begin:end].unsqueeze(0)
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(input_ids, labels=target_ids).loss  # mean over the unmasked shifted labels
        valid = (target_ids[:, 1:] != -100).sum().item()
        nll_sum += loss.item() * valid
        n_tokens += valid
        prev_end = end
        if end == ids.numel():
            break
    return math.exp(nll_sum / n_tokens), n_tokens
