"""Loss aggregation as per-token weights: ``loss = sum(w * l)``, so ``dloss/dl = w`` (reference conventions)."""
from __future__ import annotations

import numpy as np


def _safe_div(mask, count):
    """mask / count, 0 where the count is 0 (there the mask is 0 too, so dividing by 1 instead gives it)."""
    return mask / np.maximum(count, 1.0)


def block_sum(x: np.ndarray, blocks: int) -> np.ndarray:
    """Per block of rows, the sum of ``x`` [B, T] (each block summed as NumPy sums it alone)."""
    return np.add.reduce(x.reshape(blocks, -1), 1)


def block_count(x: np.ndarray, blocks: int) -> np.ndarray:
    """Per block of rows, how many entries of the boolean ``x`` are true."""
    return np.add.reduce(x.reshape(blocks, -1), 1, dtype=np.intp)


def _per_row(counts: np.ndarray, rows: int) -> np.ndarray:
    """[blocks] counts -> [B, 1]: each block's count on its ``rows`` rows, at least 1."""
    return np.repeat(np.maximum(counts, 1), rows)[:, None]


def agg_weights(mask: np.ndarray, agg: str, group_size: int | None = None, max_len=None,
                blocks: int = 1) -> np.ndarray:
    """Weights w[i, t] of each aggregation mode; fully masked rows and groups get weight 0 and are not counted.

    ``blocks``: the batch is that many independent batches of equal size stacked by rows (the simulator's seeds),
    each normalised on its own."""
    rows = len(mask) // blocks
    if agg == "token_mean":
        per_block = mask.reshape(blocks, -1)
        return (per_block / np.maximum(block_sum(mask, blocks), 1.0)[:, None]).reshape(mask.shape)
    lens = np.add.reduce(mask, 1, keepdims=True)
    if agg in ("seq_mean_token_mean", "seq_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        n_seq = _per_row(block_count(lens > 0, blocks), rows)
        if agg == "seq_mean_token_sum":
            return mask / n_seq
        if agg == "seq_mean_token_sum_norm":
            return mask / (float(max_len) * n_seq)
        w = _safe_div(mask, lens)
        w /= n_seq
        return w
    group_tokens = np.add.reduce(lens.reshape(-1, group_size), 1)
    n_groups = _per_row(block_count(group_tokens > 0, blocks), rows)
    if agg == "group_token_mean":
        groups = mask.reshape(-1, group_size * mask.shape[1])
        w = _safe_div(groups, group_tokens[:, None]).reshape(mask.shape)
    elif agg == "group_seq_sum_token_mean":
        w = _safe_div(mask, lens)
    else:
        raise ValueError(f"agg: unknown aggregation mode {agg!r}")
    w /= n_groups
    return w
