"""Loss aggregation as per-token weights: ``loss = sum(w * l)``, so ``dloss/dl = w`` (reference conventions)."""
from __future__ import annotations

import numpy as np


def _safe_div(mask, count):
    """mask / count, 0 where the count is 0 (there the mask is 0 too, so dividing by 1 instead gives it)."""
    return mask / np.maximum(count, 1.0)


def agg_weights(mask: np.ndarray, agg: str, group_size: int | None = None, max_len=None) -> np.ndarray:
    """Weights w[i, t] of each aggregation mode; fully masked rows and groups get weight 0 and are not counted."""
    if agg == "token_mean":
        return mask / max(mask.sum(), 1.0)
    lens = np.add.reduce(mask, 1, keepdims=True)
    if agg in ("seq_mean_token_mean", "seq_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        n_seq = max(np.count_nonzero(lens), 1)
        if agg == "seq_mean_token_sum":
            return mask / n_seq
        if agg == "seq_mean_token_sum_norm":
            return mask / (float(max_len) * n_seq)
        w = _safe_div(mask, lens)
        w /= n_seq
        return w
    group_tokens = np.add.reduce(lens.reshape(-1, group_size), 1)
    n_groups = max(np.count_nonzero(group_tokens), 1)
    if agg == "group_token_mean":
        groups = mask.reshape(-1, group_size * mask.shape[1])
        w = _safe_div(groups, group_tokens[:, None]).reshape(mask.shape)
    elif agg == "group_seq_sum_token_mean":
        w = _safe_div(mask, lens)
    else:
        raise ValueError(f"agg: unknown aggregation mode {agg!r}")
    w /= n_groups
    return w
