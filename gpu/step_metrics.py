"""Per-step metrics of a real-model step under the simulator's names and the regime card's (sim/metrics.py
DEFINITIONS, spec/regime.py STEP_METRICS), computed here in torch: which side clipped each token and how likely it
was, how far decision tokens' ratios moved, pass@k from the group, lengths of wrong answers, Cov(log pi, A)."""
from __future__ import annotations

import math

import numpy as np
import torch

from spec.regime import DECISION_P_OLD, EXPLORATION_P_OLD
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
    "ratio_dev_median": "median |ratio - 1| of the trained tokens with A != 0 over the step's updates (mostly float "
                        "round-off on near-certain tokens: the card reads decision_dev_q50)",
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


def _cat(parts: list) -> torch.Tensor:
    return torch.cat(parts).double() if parts else torch.zeros(0, dtype=torch.float64)


def _quantile(parts: list, q: float) -> float | None:
    x = _cat(parts)
    return float(np.quantile(x.numpy(), q)) if x.numel() else None


def _share_below(parts: list, bound: float) -> float | None:
    x = _cat(parts)
    return float((x < bound).double().mean()) if x.numel() else None


#: The clip statistics of the regime card, logged as None for an algorithm without a hard clip (SAPO's soft gate,
#: CISPO's truncated weight, KL-Cov, GPG, GMPO's log-space clip): not defined there, and never 0.
CLIP_KEYS = ("clip_frac", "clip_frac_active", "clip_up_frac", "clip_low_frac", "upclip_pold_median",
             "upclip_pold_lt02", "lowclip_pold_median", "lowclip_pold_lt02", "freed_frac", "freed_pold_median",
             "decision_clip_frac", "decision_clip_up_frac")


class StepClips:
    """The regime card's ratio and clip statistics over a step's updates (spec.regime.STEP_METRICS; DAPO Fig. 3a).

    Every update's micro-batch is added with the log-probs it was trained with and those of the sampler (pi_old).
    Upper clip: A > 0 and ratio > hi; lower: A < 0 and ratio < lo, with the algorithm's ratio (token, or GSPO's
    sequence ratio on every token of the row) and bounds (fixed, or DCPO's dynamic ones from pi_old); the clip
    holds exactly those tokens (no dual clip). Decision tokens: pi_old < DECISION_P_OLD and A != 0. CISPO's
    truncation: its weight's bounds [1 - eps_low, 1 + eps_high] (relative cap) or [0, eps_high] (absolute), MiniMax-M1
    2506.13585 Eq. 5. A token update is on-policy when the policy still equals the sampler (``on_policy``).
    """

    def __init__(self, algo: str, hp: dict):
        self.alg, self.hp = ALGORITHMS[algo], hp
        self.hard = self.alg.clip in ("fixed", "dynamic")
        self.truncates = self.alg.clip == "truncated"
        self.tokens = self.zero_adv = self.up = self.low = self.freed = self.truncated = self.on_policy = 0
        self.up_p, self.low_p, self.freed_p, self.dev, self.decision_dev = [], [], [], [], []

    def add(self, logp, old_logp, adv, mask, on_policy: bool = False) -> None:
        """One update's micro-batch: current and old log-probs, advantages, mask ([B, T] each)."""
        logp, old_logp, adv = logp.detach().double(), old_logp.detach().double(), adv.detach().double()
        on = mask > 0
        log_ratio = torch.where(on, logp - old_logp, torch.zeros_like(logp))
        if self.alg.ratio == "token":
            ratio = torch.exp(log_ratio)
        else:
            lens = mask.sum(1, keepdim=True).clamp(min=1).double()
            ratio = torch.exp(log_ratio.sum(1, keepdim=True) / lens).expand_as(log_ratio)
        p_old = torch.exp(torch.where(on, old_logp, torch.zeros_like(old_logp)))
        active = on & (adv != 0)
        n = int(on.sum())
        self.tokens += n
        self.zero_adv += n - int(active.sum())
        self.on_policy += n if on_policy else 0
        dev = (ratio - 1.0).abs()
        self.dev.append(dev[active])
        self.decision_dev.append(dev[active & (p_old < DECISION_P_OLD)])
        if self.truncates:
            rel = self.hp["cap_mode"] == "relative"
            lo, hi = (1 - self.hp["eps_low"], 1 + self.hp["eps_high"]) if rel else (0.0, self.hp["eps_high"])
            self.truncated += int((on & ((ratio < lo) | (ratio > hi))).sum())
        if not self.hard:
            return
        if self.alg.clip == "dynamic":
            lo, hi = dcpo_bounds(p_old, self.hp["eps_low"], self.hp["eps_high"], self.hp["r_max"])
        else:
            lo, hi = 1 - self.hp["eps_low"], 1 + self.hp["eps_high"]
        up, low = on & (adv > 0) & (ratio > hi), on & (adv < 0) & (ratio < lo)
        freed = on & (adv > 0) & (ratio > 1.2) & (ratio <= hi)
        self.up, self.low, self.freed = self.up + int(up.sum()), self.low + int(low.sum()), self.freed + int(
            freed.sum())
        self.up_p.append(p_old[up])
        self.low_p.append(p_old[low])
        self.freed_p.append(p_old[freed])

    def summary(self) -> dict:
        """The step's values under spec.regime's names (None where undefined: no token, no clip, no such token)."""
        n, active, decisions = self.tokens, self.tokens - self.zero_adv, sum(len(d) for d in self.decision_dev)
        out = {"zero_adv_frac": self.zero_adv / n if n else None,
               "decision_dev_q50": _quantile(self.decision_dev, 0.5),
               "decision_dev_q90": _quantile(self.decision_dev, 0.9),
               "decision_frac": decisions / n if n else None,
               "ratio_dev_median": _quantile(self.dev, 0.5),
               "on_policy_frac": self.on_policy / n if n else None,
               "trunc_frac": self.truncated / n if self.truncates and n else None,
               **dict.fromkeys(CLIP_KEYS)}
        if not self.hard or not n:
            return out
        return out | {"clip_frac": (self.up + self.low) / n,
                      "clip_frac_active": (self.up + self.low) / active if active else None,
                      "clip_up_frac": self.up / n, "clip_low_frac": self.low / n,
                      "decision_clip_frac": (self.up + self.low) / decisions if decisions else None,
                      "decision_clip_up_frac": self.up / decisions if decisions else None,
                      "upclip_pold_median": _quantile(self.up_p, 0.5),
                      "upclip_pold_lt02": _share_below(self.up_p, EXPLORATION_P_OLD),
                      "lowclip_pold_median": _quantile(self.low_p, 0.5),
                      "lowclip_pold_lt02": _share_below(self.low_p, EXPLORATION_P_OLD),
                      "freed_frac": self.freed / n, "freed_pold_median": _quantile(self.freed_p, 0.5)}
