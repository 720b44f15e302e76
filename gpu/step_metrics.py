"""Per-step metrics of a real-model step under the simulator's names and definitions (sim/metrics.py DEFINITIONS),
computed here in torch: which side clipped each token, pass@k from the group, lengths of wrong answers,
Cov(log pi, A)."""
from __future__ import annotations

import math

import numpy as np
import torch

from spec.registry import ALGORITHMS

from .losses import dcpo_bounds

#: The metrics this module adds to metrics.jsonl, each with its definition.
DEFINITIONS = {
    "clip_up_frac": "share of trained tokens with A > 0 and ratio above the upper bound, over the step's updates",
    "clip_low_frac": "share of trained tokens with A < 0 and ratio below the lower bound, over the step's updates",
    "upclip_pold_median": "median sampling probability pi_old of the up-clipped tokens (DAPO Fig. 3a)",
    "upclip_pold_lt02": "share of the up-clipped tokens with pi_old < 0.2 (DAPO Fig. 3a)",
    "freed_frac": "share of trained tokens with A > 0 and 1.2 < ratio <= upper bound (what eps_high > 0.2 frees)",
    "freed_pold_median": "median pi_old of those tokens",
    "ratio_dev_median": "median |ratio - 1| of the trained tokens with A != 0 over the step's updates",
    "cov_logp_adv": "Cov(log pi_old(y_t), A_t) over the trained batch's tokens (Cui et al. 2505.22617 Eq. 4)",
    "pass@k": "pass@k estimated from each group of G samples (Chen et al. 2107.03374 Eq. 1: 1 - C(G-c, k)/C(G, k)), "
              "averaged over the step's prompts; k = 1 and k = G",
    "resp_len": "mean response length (tokens) of the generated responses",
    "len_correct": "mean length of the correct generated responses",
    "len_wrong": "mean length of the incorrect generated responses",
    "zero_grad_frac": "share of generated groups whose rewards are all equal",
    "gen_per_trained": "responses generated per response trained on (DAPO dynamic sampling > 1)",
}


def pass_at_k(correct: torch.Tensor, group_size: int, k: int) -> float:
    """Chen et al. 2107.03374 Eq. 1: mean over groups of 1 - C(n - c, k) / C(n, k), n = group_size, c correct."""
    if not 1 <= k <= group_size:
        raise ValueError(f"k: expected 1 <= k <= group_size ({group_size}), got {k}")
    c = correct.reshape(-1, group_size).sum(1).tolist()
    n = group_size
    return float(np.mean([1.0 - math.comb(n - int(ci), k) / math.comb(n, k) for ci in c]))


def rollout_metrics(lengths: torch.Tensor, correct: torch.Tensor, rewards: torch.Tensor, group_size: int,
                    trained: int) -> dict:
    """The simulator's response metrics over every generated response of a step (dynamic-sampling rounds
    included), and pass@1 / pass@G from the groups."""
    ok = correct.bool()
    groups = rewards.reshape(-1, group_size)

    def mean(x):
        return float(x.float().mean()) if x.numel() else None

    return {"resp_len": mean(lengths), "len_correct": mean(lengths[ok]), "len_wrong": mean(lengths[~ok]),
            "zero_grad_frac": mean(groups.max(1).values == groups.min(1).values),
            "gen_per_trained": len(lengths) / trained if trained else None,
            "pass@1": pass_at_k(correct, group_size, 1), f"pass@{group_size}": pass_at_k(correct, group_size,
                                                                                          group_size)}


def batch_cov(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> float | None:
    """Cov(log pi(y_t), A_t) over the masked tokens of a batch (population covariance)."""
    on = mask > 0
    if int(on.sum()) < 2:
        return None
    x, a = logp[on].double(), adv[on].double()
    return float(((x - x.mean()) * (a - a.mean())).mean())


def _median(parts: list) -> float | None:
    x = torch.cat(parts) if parts else torch.zeros(0)
    return float(np.median(x.double().numpy())) if x.numel() else None


class StepClips:
    """Which side clipped each trained token over a step's updates (DAPO Fig. 3a).

    Upper: A > 0 and ratio > hi; lower: A < 0 and ratio < lo, with the algorithm's ratio (token, or GSPO's
    sequence ratio on every token of the row) and bounds (fixed, or DCPO's dynamic ones from pi_old). Algorithms
    without a fixed or dynamic clip (SAPO's soft gate, CISPO's truncated weight) get only the ratio's spread.
    """

    def __init__(self, algo: str, hp: dict):
        self.alg, self.hp = ALGORITHMS[algo], hp
        self.fixed = self.alg.clip in ("fixed", "dynamic")
        self.tokens, self.up, self.low, self.freed = 0, 0, 0, 0
        self.up_p, self.freed_p, self.dev = [], [], []

    def add(self, logp, old_logp, adv, mask) -> None:
        """One update's micro-batch: current and old log-probs, advantages, mask ([B, T] each)."""
        logp, old_logp, adv = logp.detach().double(), old_logp.detach().double(), adv.detach().double()
        on = mask > 0
        log_ratio = torch.where(on, logp - old_logp, torch.zeros_like(logp))
        if self.alg.ratio == "token":
            ratio = torch.exp(log_ratio)
        else:
            lens = mask.sum(1, keepdim=True).clamp(min=1).double()
            ratio = torch.exp(log_ratio.sum(1, keepdim=True) / lens).expand_as(log_ratio)
        self.dev.append((ratio[on & (adv != 0)] - 1.0).abs())
        if not self.fixed:
            return
        p_old = torch.exp(torch.where(on, old_logp, torch.zeros_like(old_logp)))
        if self.alg.clip == "dynamic":
            lo, hi = dcpo_bounds(p_old, self.hp["eps_low"], self.hp["eps_high"], self.hp["r_max"])
        else:
            lo, hi = 1 - self.hp["eps_low"], 1 + self.hp["eps_high"]
        up, low = on & (adv > 0) & (ratio > hi), on & (adv < 0) & (ratio < lo)
        freed = on & (adv > 0) & (ratio > 1.2) & (ratio <= hi)
        self.tokens += int(on.sum())
        self.up, self.low, self.freed = self.up + int(up.sum()), self.low + int(low.sum()), self.freed + int(
            freed.sum())
        self.up_p.append(p_old[up])
        self.freed_p.append(p_old[freed])

    def summary(self) -> dict:
        out = {"ratio_dev_median": _median(self.dev)}
        if not self.fixed or not self.tokens:
            return out
        up_p = torch.cat(self.up_p)
        return out | {"clip_up_frac": self.up / self.tokens, "clip_low_frac": self.low / self.tokens,
                      "upclip_pold_median": _median(self.up_p),
                      "upclip_pold_lt02": float((up_p < 0.2).double().mean()) if up_p.numel() else None,
                      "freed_frac": self.freed / self.tokens, "freed_pold_median": _median(self.freed_p)}
