"""Generated batches for the differential checks: empty and length-1 rows, groups, extreme ratios, small q."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Case:
    """One [B, T] batch with everything a policy loss may need."""

    logp: np.ndarray
    old_logp: np.ndarray
    adv: np.ndarray
    mask: np.ndarray
    ref_logp: np.ndarray
    group_size: int

    @property
    def max_len(self) -> int:
        return self.mask.shape[1]

    @property
    def rollout_logp(self) -> np.ndarray:
        """The sampling engine's log-probs, for rollout corrections: old_logp moved by twice the case's random
        reference offset (ref_logp - logp, N(0, 0.3)), so exp(old - rollout) spreads over about [0.3, 3]."""
        return self.old_logp + 2.0 * (self.ref_logp - self.logp)


def make_case(seed: int, prompts: int | None = None, group_size: int | None = None, length: int | None = None,
              extreme: bool | None = None, small_q: bool | None = None, seq_adv: bool | None = None) -> Case:
    """A random batch; unset options are drawn from the seed so that a range of seeds covers every feature."""
    rng = np.random.default_rng(seed)
    pick = lambda value, draw: draw() if value is None else value  # noqa: E731
    prompts = pick(prompts, lambda: int(rng.integers(1, 4)))
    group_size = pick(group_size, lambda: int(rng.integers(1, 5)))
    length = pick(length, lambda: int(rng.integers(1, 6)))
    extreme = pick(extreme, lambda: bool(rng.random() < 0.3))
    small_q = pick(small_q, lambda: bool(rng.random() < 0.3))
    seq_adv = pick(seq_adv, lambda: bool(rng.random() < 0.5))
    rows = prompts * group_size
    lens = rng.integers(0, length + 1, size=rows)
    lens[rng.random(rows) < 0.2] = 1  # length-1 rows
    mask = (np.arange(length)[None, :] < lens[:, None]).astype(float)
    if rng.random() < 0.2:  # holes inside a row, as multi-turn masks have
        mask *= rng.random(mask.shape) < 0.8
    old_logp = -rng.exponential(6.0 if small_q else 1.0, size=(rows, length))
    scale = rng.choice([0.02, 0.2, 1.0])
    log_ratio = rng.normal(0.0, scale, size=(rows, length))
    if extreme:
        log_ratio = np.where(rng.random(log_ratio.shape) < 0.3, rng.choice([-20.0, 20.0], log_ratio.shape),
                             log_ratio)
    adv = rng.normal(size=(rows, 1)) * np.ones((1, length)) if seq_adv else rng.normal(size=(rows, length))
    adv[rng.random(rows) < 0.15] = 0.0
    logp = old_logp + log_ratio
    ref_logp = logp + rng.normal(0.0, 0.3, size=logp.shape)
    return Case(logp, old_logp, adv, mask, ref_logp, group_size)
