"""Loss aggregation as per-token weights: ``loss = sum(w * l)``, so ``dloss/dl = w`` (reference conventions)."""
from __future__ import annotations

import numpy as np


def _safe_div(num, den):
    return np.divide(num, den, out=np.zeros_like(num, dtype=np.float64), where=den > 0)


def agg_weights(mask: np.ndarray, agg: str, group_size: int | None = None, max_len=None) -> np.ndarray:
    """Weights w[i, t] of each aggregation mode; fully masked rows and groups get weight 0 and are not counted."""
    lens = mask.sum(1, keepdims=True)
    per_seq_mean = _safe_div(mask, lens)
    n_seq = max(int((lens > 0).sum()), 1)
    if agg == "token_mean":
        return mask / max(mask.sum(), 1.0)
    if agg in ("seq_mean_token_mean", "seq_mean"):
        return per_seq_mean / n_seq
    if agg == "seq_mean_token_sum":
        return mask / n_seq
    if agg == "seq_mean_token_sum_norm":
        return mask / (float(max_len) * n_seq)
    groups = mask.reshape(-1, group_size * mask.shape[1])
    group_tokens = groups.sum(1)
    n_groups = max(int((group_tokens > 0).sum()), 1)
    if agg == "group_token_mean":
        per_row = np.repeat(group_tokens, group_size)[:, None]
        return _safe_div(mask, per_row) / n_groups
    if agg == "group_seq_sum_token_mean":
        return per_seq_mean / n_groups
    raise ValueError(f"agg: unknown aggregation mode {agg!r}")
