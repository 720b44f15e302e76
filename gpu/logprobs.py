"""Per-token log-probs and entropy through the output layer in token chunks, never holding [tokens x vocab] logits."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .models import backbone, output_layer

LOGITS_BUDGET = 1 << 26  # logits elements per chunk (256 MiB in float32) when no chunk size is given


def auto_chunk(vocab: int) -> int:
    """Tokens per chunk so that one chunk of logits holds about LOGITS_BUDGET elements."""
    return max(16, LOGITS_BUDGET // max(vocab, 1))


def _chunk_stats(h, weight, bias, targets, temperature):
    """log pi(y_t) = z_y - logsumexp(z) and H = logsumexp(z) - sum softmax(z)*z for z = (h W^T + b)/T."""
    z = F.linear(h, weight, bias).float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, ent


def chunked_logprobs(hidden, weight, targets, bias=None, chunk: int | None = None, temperature: float = 1.0,
                     entropy: bool = True):
    """Log-prob of ``targets`` [N] (and entropy) from ``hidden`` [N, H], ``chunk`` tokens of logits at a time.

    ``chunk`` None picks about 2**26 logits per chunk. In training each chunk is recomputed in the backward pass (activation checkpointing), so peak memory holds one
    chunk of logits, not N of them."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden/targets: expected [N, H] and [N], got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    chunk = auto_chunk(weight.shape[0]) if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"chunk: expected a positive number of tokens, got {chunk}")
    if temperature <= 0:
        raise ValueError(f"temperature: expected > 0, got {temperature}")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, ents = [], []
    for s in range(0, hidden.shape[0], chunk):
        args = (hidden[s:s + chunk], weight, bias, targets[s:s + chunk], temperature)
        lp, en = checkpoint(_chunk_stats, *args, use_reentrant=False) if grad else _chunk_stats(*args)
        logps.append(lp)
        ents.append(en if entropy else en.detach())
    empty = hidden.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(logps) if logps else empty
    return logp, (torch.cat(ents) if ents else empty)


def plain_logprobs(hidden, weight, targets, bias=None, temperature: float = 1.0):
    """The reference computation: all logits at once, log_softmax, gather (for tests and benchmarks)."""
    z = F.linear(hidden, weight, bias).float() / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def sequence_logprobs(model, input_ids, attention_mask, completion_mask, chunk: int | None = None,
                      temperature: float = 1.0):
    """Per-token log-probs and entropies [B, T-1] of ``input_ids[:, 1:]`` under ``model``, zero where
    ``completion_mask[:, 1:]`` is 0; only completion tokens go through the output layer."""
    h = backbone(model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
    sel = completion_mask[:, 1:].bool()
    head = output_layer(model)
    lp, en = chunked_logprobs(h[sel], head.weight, input_ids[:, 1:][sel], bias=head.bias, chunk=chunk,
                              temperature=temperature)
    logp = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device).masked_scatter(sel, lp)
    ent = torch.zeros(sel.shape, dtype=en.dtype, device=en.device).masked_scatter(sel, en)
    return logp, ent
