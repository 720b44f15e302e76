"""Clip-Cov's and KL-Cov's token selection by Cov(log pi, A) (Cui et al. 2505.22617, Sec. 5), in float64.

The three layers call these with their own values converted to float64, so that they select the same tokens; the
random part of Clip-Cov is its seed (or an explicit ``cov_select`` mask that bypasses this module).
"""
from __future__ import annotations

import numpy as np


def token_cov(logp: np.ndarray, adv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """cov_t = (logp_t - mean logp) * (A_t - mean A), means over the batch's unmasked tokens; 0 on padding."""
    on = mask > 0
    if not on.any():
        return np.zeros(mask.shape)
    cov = (logp - logp[on].mean()) * (adv - adv[on].mean())
    return np.where(on, cov, 0.0)


def selection_count(ratio: float, tokens: int) -> int:
    """How many tokens a share ``ratio`` of ``tokens`` selects: at least one when the share is positive (as the
    authors' released code does), none when it is 0."""
    return 0 if ratio == 0 or tokens == 0 else max(1, int(ratio * tokens))


def clip_cov_select(cov, mask, clipped, lb: float, ub: float, ratio: float, seed: int) -> np.ndarray:
    """Clip-Cov: among unmasked tokens that PPO-clip does not clip (``clipped``: A r > A clip(r); the authors'
    code leaves out only these, not tokens capped by delta or the dual clip) with lb < cov < ub,
    ``selection_count`` chosen at random (numpy's PCG64 seeded with ``seed``, over the candidates in row-major
    order)."""
    candidates = np.flatnonzero((mask > 0) & ~clipped & (cov > lb) & (cov < ub))
    k = min(selection_count(ratio, int((mask > 0).sum())), len(candidates))
    chosen = candidates[np.random.default_rng(seed).permutation(len(candidates))[:k]]
    out = np.zeros(mask.shape, dtype=bool)
    out.flat[chosen] = True
    return out


def kl_cov_select(cov, mask, ratio: float) -> np.ndarray:
    """KL-Cov: the ``selection_count`` unmasked tokens of largest cov (ties to the earlier token, row-major)."""
    on = np.flatnonzero(mask > 0)
    k = selection_count(ratio, len(on))
    top = on[np.argsort(-cov.flat[on], kind="stable")[:k]]
    out = np.zeros(mask.shape, dtype=bool)
    out.flat[top] = True
    return out
