"""Loss aggregation as per-token weights in torch: ``loss = sum(w * l)`` (reference conventions)."""
from __future__ import annotations

import torch


def _safe_div(num, den):
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def agg_weights(mask: torch.Tensor, agg: str, group_size: int | None = None, max_len=None) -> torch.Tensor:
    """Weights w[i, t] of each aggregation mode; fully masked rows and groups get weight 0 and are not counted."""
    lens = mask.sum(1, keepdim=True)
    per_seq_mean = _safe_div(mask, lens)
    n_seq = (lens > 0).sum().clamp(min=1).to(mask.dtype)
    if agg == "token_mean":
        return mask / mask.sum().clamp(min=1.0)
    if agg in ("seq_mean_token_mean", "seq_mean"):
        return per_seq_mean / n_seq
    if agg == "seq_mean_token_sum":
        return mask / n_seq
    if agg == "seq_mean_token_sum_norm":
        return mask / (float(max_len) * n_seq)
    group_tokens = mask.reshape(-1, group_size * mask.shape[1]).sum(1)
    n_groups = (group_tokens > 0).sum().clamp(min=1).to(mask.dtype)
    if agg == "group_token_mean":
        return _safe_div(mask, group_tokens.repeat_interleave(group_size)[:, None]) / n_groups
    if agg == "group_seq_sum_token_mean":
        return per_seq_mean / n_groups
    raise ValueError(f"agg: unknown aggregation mode {agg!r}")


def agg_units(mask: torch.Tensor, agg: str, group_size: int | None = None) -> torch.Tensor:
    """How many units a mode averages over (tokens, non-empty rows or non-empty groups); the normaliser constant
    ``max_len`` aside, a mode's loss is a mean over these, so micro-batches weighted by their share of units add
    up to the loss of the whole batch (exact gradient accumulation)."""
    if agg == "token_mean":
        return mask.sum()
    if agg in ("group_token_mean", "group_seq_sum_token_mean"):
        return (mask.reshape(-1, group_size * mask.shape[1]).sum(1) > 0).sum().to(mask.dtype)
    if agg in ("seq_mean_token_mean", "seq_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        return (mask.sum(1) > 0).sum().to(mask.dtype)
    raise ValueError(f"agg: unknown aggregation mode {agg!r}")
