"""Per-step metrics of a simulator run, their definitions, and the per-run summary."""
from __future__ import annotations

import math

import numpy as np

from spec.registry import ALGORITHMS
from spec.regime import DECISION_P_OLD, EXPLORATION_P_OLD, STEP_METRICS

from .aggregation import block_count
from .losses import check_dcpo_q, dcpo_bounds
from .tabular import CORRECT, MALFORMED, Rollout, Snapshot, dot, row_sum

PASS_K = (1, 8, 64)

#: Every per-step metric, with its definition (also written into summary.json).
DEFINITIONS = {
    "reward": "mean training reward (the algorithm's scheme, shaping included) over the responses generated",
    "accuracy_exact": "exact probability of a correct response, prompt drawn uniformly from the pool",
    "entropy": "exact expected per-token entropy of the policy: sum_s d(s) H(pi(.|s)) / sum_s d(s)",
    "kl_ref": "exact expected per-token KL(pi || pi_ref), weighted like entropy",
    "rur": "response utilisation ratio: share of trained responses with a non-zero advantage",
    "zero_grad_frac": "share of generated groups whose rewards are all equal",
    "resp_len": "mean response length (tokens, EOS included) of the generated responses",
    "len_correct": "mean length of the correct generated responses",
    "len_wrong": "mean length of the incorrect (wrong or malformed) generated responses",
    "len_wrong_exact": "exact expected length of an incorrect response, prompt drawn uniformly from the pool",
    "truncated": "share of generated responses still running at max_len",
    "gen_per_trained": "responses generated per response trained on (DAPO dynamic sampling > 1)",
    "loss": "mean policy loss over the step's updates",
    "entropy_decision": "exact reward-relevant part of entropy: entropy of the choice among token classes that "
                        "lead to different next states or outcomes (the rest is a choice among interchangeable "
                        "tokens)",
    "entropy_within": "exact reward-irrelevant part: entropy - entropy_decision (toy LM: mostly the filler choice)",
    "entropy_correct": "feature_lm: exact entropy among the acceptable tokens of answer positions reached on track",
    "entropy_ordinary": "feature_lm: exact contribution of on-track ordinary answer positions to entropy, "
                        "sum_c w(c) H(c) over those contexts (the four contributions add up to entropy)",
    "entropy_fork": "feature_lm: the same for on-track forking positions",
    "entropy_end": "feature_lm: the same for the EOS decision after the answer",
    "entropy_offtrack": "feature_lm: the same for off-track contexts",
    "entropy_relevant": "feature_lm: entropy_ordinary + entropy_fork, the reward-relevant answer positions",
    "malformed_exact": "feature_lm: exact probability of a truncated (malformed) response",
    "entropy_hard": "exact per-token entropy of the responses to the third of prompts hardest at the start",
    "entropy_easy": "same for the easiest third",
    **{f"pass@{k}": f"exact pass@{k}: mean over the pool of 1 - (1 - success_p)^{k}" for k in PASS_K},
    "upclip_fork_share": "feature_lm: share of the up-clipped tokens that sit at forking positions",
    "freed_frac": "share of trained tokens with A > 0 and 1.2 < ratio <= upper bound (what eps_high > 0.2 frees)",
    "freed_pold_median": "median pi_old of those tokens",
    "ratio_dev_median": "median |ratio - 1| of the trained tokens with A != 0 over the step's updates",
    # the regime card's metrics, as spec.regime defines them for every layer (the simulator's entropy and
    # entropy_relevant are exact expectations, defined above)
    **{k: v for k, v in STEP_METRICS.items() if k not in ("entropy", "entropy_relevant")},
    "cov_logp_adv": "Cov(log pi_old(y_t), A_t) over the trained batch's tokens (Cui et al. 2505.22617 Eq. 4)",
    "cov_interval": "sum of cov_logp_adv over the steps since the previous exact evaluation",
    "entropy_change": "measured change of the exact entropy since the previous exact evaluation",
    "entropy_change_rows": "the same at fixed row weights: sum_c w(c) (H_c(new) - H_c(old))",
    "entropy_change_pred": "first-order prediction of entropy_change_rows: -sum_c w(c) Cov_{pi_c}(log pi_c, dz_c) "
                           "(Cui et al. Lemma 1, dz the logit change)",
}
FINAL_KEYS = ("entropy_decision", "entropy_within", "entropy_correct", "entropy_ordinary", "entropy_fork",
              "entropy_end", "entropy_offtrack", "entropy_relevant", "entropy_hard", "entropy_easy",
              "malformed_exact")
STEP_MEANS = ("ratio_dev_median", "decision_dev_q50", "decision_dev_q90", "decision_frac", "decision_clip_frac",
              "decision_clip_up_frac", "zero_adv_frac", "clip_frac_active", "clip_up_frac", "clip_low_frac",
              "upclip_pold_median", "upclip_pold_lt02", "lowclip_pold_median", "lowclip_pold_lt02", "upclip_fork_share",
              "freed_frac", "freed_pold_median", "trunc_frac", "updates_per_batch", "on_policy_frac", "staleness")
SUMMARY_KEYS = ("reward", "accuracy", "accuracy_exact", "entropy_final", "clip_frac", "rur", "zero_grad_frac",
                "gen_per_trained", "kl_ref_final", "resp_len", "len_wrong", "entropy_initial", "entropy_half_step",
                *(k + "_final" for k in FINAL_KEYS), *(f"pass@{k}_{w}" for k in PASS_K for w in ("peak", "final",
                                                                                                 "drop")),
                *STEP_MEANS, "cov_entropy_corr", "law_corr", "law_rel_err")


def _mean(x) -> float | None:
    """``x.mean()`` as NumPy computes it (the sum, then over the count), without its overhead; None if empty."""
    x = np.asarray(x, dtype=float)
    return float(np.add.reduce(x, None) / x.size) if x.size else None


def _ratio(count, n) -> float | None:
    """count / n (the mean of n values summing to the integer ``count``, exactly as ``_mean``), None if n = 0."""
    return float(count / n) if n else None


def rollout_metrics(ro: Rollout, rewards: np.ndarray, group_size: int) -> dict:
    """The metrics of the generated responses of one step."""
    correct = ro.outcome == CORRECT
    groups = rewards.reshape(-1, group_size)
    n, n_correct = len(correct), np.count_nonzero(correct)
    len_sum, len_correct = ro.lengths.sum(), ro.lengths[correct].sum()  # integers: their sums are exact
    return {
        "reward": _mean(rewards), "accuracy": _ratio(n_correct, n),
        "zero_grad_frac": _ratio(np.count_nonzero(groups.max(1) == groups.min(1)), len(groups)),
        "resp_len": _ratio(len_sum, n), "len_correct": _ratio(len_correct, n_correct),
        "len_wrong": _ratio(len_sum - len_correct, n - n_correct),
        "malformed": _ratio(np.count_nonzero(ro.outcome == MALFORMED), n),
        "truncated": _ratio(np.count_nonzero(ro.truncated), n),
    }


def exact_metrics(snap: Snapshot, hard: np.ndarray, easy: np.ndarray) -> dict:
    """The snapshot's exact metrics, pass@k, and the entropy of the initially hardest and easiest prompts."""
    out = dict(snap.values)
    fail = 1.0 - snap.success
    for k in PASS_K:
        out[f"pass@{k}"] = _mean(1.0 - fail ** k)
    out["entropy_hard"] = _mean(snap.prompt_entropy[hard])
    out["entropy_easy"] = _mean(snap.prompt_entropy[easy])
    return out


def entropy_law(old: Snapshot, new: Snapshot) -> dict:
    """Measured entropy change between two snapshots and its first-order prediction (Cui et al. Lemma 1):
    H(pi_c + dz) - H(pi_c) ~= -Cov_{a ~ pi_c}(log pi_c(a), dz_c(a)) per context c, weighted by old row weights."""
    dz = new.logits - old.logits
    h_old, h_new = old.row_entropy, new.row_entropy
    pi_logp_dz = old.pi * old.logp
    pi_logp_dz *= dz
    dz *= old.pi  # pi * dz, in place: no more [R, V] temporaries than needed
    cov = row_sum(pi_logp_dz) + h_old * row_sum(dz)
    return {"entropy_change": new.values["entropy"] - old.values["entropy"],
            "entropy_change_rows": float(dot(old.weight, h_new - h_old)),
            "entropy_change_pred": float(-dot(old.weight, cov))}


def batch_cov(logp: np.ndarray, adv: np.ndarray, mask: np.ndarray) -> float | None:
    """Cov(log pi(y_t), A_t) over the masked tokens of a batch."""
    on = mask > 0
    n = np.count_nonzero(on)
    if n < 2:
        return None
    x, a = logp[on], adv[on]
    x -= np.add.reduce(x) / n  # x.mean(), in place
    a -= np.add.reduce(a) / n
    x *= a
    return float(np.add.reduce(x) / n)


#: Kinds of clip (spec.registry) under which a loss holds no token: SAPO's soft gate, CISPO's truncated weight,
#: VESPO's sequence kernel, and none at all (GPG, KL-Cov). Their clip_frac is None: not defined there, and never 0.
NO_CLIP = frozenset({"soft", "truncated", "gamma", "off"})

#: The clip statistics of the regime card, None for an algorithm without a hard clip (SAPO's soft gate, CISPO's
#: truncated weight, GMPO's log-space clip, KL-Cov, GPG): not defined there, and never 0.
CLIP_KEYS = ("clip_frac_active", "clip_up_frac", "clip_low_frac", "upclip_pold_median", "upclip_pold_lt02",
             "lowclip_pold_median", "lowclip_pold_lt02", "upclip_fork_share", "freed_frac", "freed_pold_median",
             "decision_clip_frac", "decision_clip_up_frac")


class _Picks:
    """Values picked per block over a step's updates (each update's picks in block order, ``counts`` of them per
    block), laid out once at the end as one row per block, sorted, NaN after the values: every block's order
    statistics from one sort."""

    def __init__(self, blocks: int):
        self.blocks, self.parts, self.counts = blocks, [], []

    def add(self, values: np.ndarray, counts: np.ndarray):
        self.parts.append(values)
        self.counts.append(counts)

    def sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the [blocks, m] grid of each block's values sorted, NaN-padded; each block's count; whether a block
        holds a NaN)."""
        if not self.parts:
            return np.zeros((self.blocks, 0)), np.zeros(self.blocks, dtype=np.intp), np.zeros(self.blocks, bool)
        values = np.concatenate(self.parts)
        block = np.concatenate([np.repeat(np.arange(self.blocks), c) for c in self.counts])
        n = np.add.reduce(self.counts, dtype=np.intp)
        order = np.argsort(block, kind="stable")
        start = np.cumsum(n) - n
        grid = np.full((self.blocks, int(n.max(initial=0))), np.nan)
        grid[block[order], np.arange(len(order)) - start[block[order]]] = values[order]
        nan = np.bincount(block, weights=np.isnan(values), minlength=self.blocks) > 0
        grid.sort(axis=1)
        return grid, n, nan


def _quantiles(grid: np.ndarray, n: np.ndarray, nan: np.ndarray, q: float) -> np.ndarray:
    """Each row's ``np.quantile(x, q)`` (linear method: its virtual index, neighbours and interpolation, NaN for a
    row holding one) of the first ``n`` sorted values of ``grid``'s rows (``_Picks.sorted``); rows with n = 0 get
    NaN."""
    some = n > 0
    virtual = (n - 1) * np.float64(q)
    above = virtual >= n - 1
    prev = np.where(above, -1, np.floor(virtual)).astype(np.intp)
    nxt = np.where(above, -1, prev + 1)
    gamma = virtual - prev
    rows, last = np.arange(len(n)), np.maximum(n - 1, 0)
    take = lambda i: grid[rows, np.where(i < 0, last, i)] if grid.shape[1] else np.full(len(n), np.nan)
    a, b = take(prev), take(nxt)
    diff = b - a
    with np.errstate(invalid="ignore"):  # inf - inf, as np.quantile meets it
        out = a + diff * gamma
        out = np.where(gamma >= 0.5, b - diff * (1 - gamma), out)
    return np.where(nan | ~some, np.nan, out)


def _medians(grid: np.ndarray, n: np.ndarray, nan: np.ndarray) -> np.ndarray:
    """Each row's ``np.median`` of its first ``n`` sorted values (``_Picks.sorted``); NaN where n = 0."""
    if not grid.shape[1]:
        return np.full(len(n), np.nan)
    rows, h = np.arange(len(n)), n // 2
    upper = grid[rows, np.minimum(h, grid.shape[1] - 1)]
    lower = grid[rows, np.maximum(h - 1, 0)]
    out = np.where(n % 2 == 1, upper, (lower + upper) / 2)
    return np.where(nan | (n == 0), np.nan, out)


class StepClips:
    """The regime card's ratio and clip statistics over a step's updates (spec.regime.STEP_METRICS; DAPO Fig. 3a).

    Upper: A > 0 and ratio > hi; lower: A < 0 and ratio < lo, with the algorithm's ratio (token, or GSPO's
    sequence ratio on every token of the row) and bounds (fixed, or DCPO's dynamic ones). Decision tokens:
    pi_old < DECISION_P_OLD and A != 0 (the tokens at pi_old near 1 move by round-off only). Algorithms without a
    hard clip get None for ``CLIP_KEYS``; CISPO's trunc_frac is its loss's own statistic, None for the others. A
    token update is on-policy when the policy still equals the sampler (``on_policy``). ``blocks``: the updates'
    rows are that many stacked runs of equal size (the simulator's seeds), each counted on its own; every block's
    medians and quantiles come from one sort at the end of the step.
    """

    def __init__(self, algo: str, hp: dict, blocks: int = 1):
        self.alg, self.hp, self.blocks = ALGORITHMS[algo], hp, blocks
        self.fixed = self.alg.clip in ("fixed", "dynamic")
        self.tokens, self.zero_adv, self.on_policy, self.up, self.low, self.freed, self.up_fork, self.n_decision = \
            np.zeros((8, blocks))
        self.up_p, self.low_p, self.freed_p, self.dev, self.decision = (_Picks(blocks) for _ in range(5))
        self.has_fork = False

    def _count(self, x):
        return block_count(x, self.blocks)

    def _keep(self, picks: _Picks, values, where, counts=None):
        """Add each block's ``values[where]`` (``counts``: how many per block, if known) to ``picks``."""
        picks.add(values[where], self._count(where) if counts is None else counts)

    def add(self, logp, old_logp, adv, mask, fork=None, token_ratio=None, bounds=None,
            on_policy=False) -> np.ndarray:
        """One update's tokens; ``fork`` [B, T] (optional) marks tokens at forking positions; ``on_policy`` (one
        flag, or one per block): the policy trained still equals the one that sampled them. Returns, per block,
        how many tokens PPO-clip with eps 0.2 would give no gradient (A > 0 and r > 1.2, or A < 0 and r < 0.8,
        token ratio): the tokens CISPO keeps learning from (MiniMax-M1 Sec. 3.1). ``token_ratio`` and ``bounds``
        (optional) are what ``policy_terms`` keeps of the same update, so as not to compute them again."""
        on = mask > 0
        log_ratio = None if token_ratio is not None and self.alg.ratio == "token" else \
            np.where(on, logp - old_logp, 0.0)
        if token_ratio is None:
            token_ratio = np.exp(log_ratio)
        pos, neg = adv > 0, adv < 0
        pos &= on
        neg &= on
        zeroed = self._count((pos & (token_ratio > 1.2)) | (neg & (token_ratio < 0.8))).astype(float)
        if self.alg.ratio == "token":
            ratio = token_ratio
        else:
            lens = np.maximum(mask.sum(1, keepdims=True), 1.0)
            ratio = np.repeat(np.exp(log_ratio.sum(1, keepdims=True) / lens), mask.shape[1], axis=1)
        active = on & (adv != 0)
        n_on, n_active = self._count(on), self._count(active)
        self.tokens += n_on
        self.zero_adv += n_on - n_active
        self.on_policy += n_on * np.asarray(on_policy)
        dev = np.abs(ratio[active] - 1.0)
        self.dev.add(dev, n_active)
        decision = np.exp(old_logp[active]) < DECISION_P_OLD  # pi_old far from 1
        n_decision = np.bincount(np.repeat(np.arange(self.blocks), n_active), weights=decision,
                                 minlength=self.blocks).astype(np.intp)
        self.n_decision += n_decision
        self._keep(self.decision, dev, decision, n_decision)
        if not self.fixed:
            return zeroed
        if bounds is not None:  # DCPO's from policy_terms, q checked as dcpo_bounds checks it
            q, lo, hi = bounds
            check_dcpo_q(q, self.hp["eps_low"], self.hp["eps_high"], self.hp["r_max"])
        elif self.alg.clip == "dynamic":
            lo, hi = dcpo_bounds(np.exp(np.where(on, old_logp, 0.0)), self.hp["eps_low"], self.hp["eps_high"],
                                 self.hp["r_max"])
        else:
            lo, hi = 1 - self.hp["eps_low"], 1 + self.hp["eps_high"]
        up, low = pos & (ratio > hi), neg & (ratio < lo)
        freed = pos & (ratio > 1.2) & (ratio <= hi)
        counts = [self._count(x) for x in (up, low, freed)]
        self.up += counts[0]
        self.low += counts[1]
        self.freed += counts[2]
        for picks, where, n in zip((self.up_p, self.low_p, self.freed_p), (up, low, freed), counts):
            self._keep(picks, old_logp, where, n)  # pi_old = exp(old_logp) taken in summary
        if fork is not None:
            self.has_fork = True
            self.up_fork += self._count(up & fork)
        return zeroed

    def summary(self) -> list[dict]:
        """Per block, the step's shares and medians."""
        dev, n_dev, nan_dev = self.dev.sorted()
        decision = self.decision.sorted()
        cols = {"ratio_dev_median": _present(_medians(dev, n_dev, nan_dev), n_dev),
                "decision_dev_q50": _present(_medians(*decision), decision[1]),
                "decision_dev_q90": _present(_quantiles(*decision, 0.9), decision[1])}
        if self.fixed:
            for name, picks in (("upclip", self.up_p), ("lowclip", self.low_p), ("freed", self.freed_p)):
                grid, n, nan = picks.sorted()
                grid = np.exp(grid)  # pi_old, in the same order; the NaN padding stays NaN
                cols[f"{name}_pold_median"] = _present(_medians(grid, n, nan), n)
                cols[f"{name}_pold_lt02"] = [_ratio(k, m) for k, m in
                                             zip(np.count_nonzero(grid < EXPLORATION_P_OLD, axis=1), n)]
        return [self._summary(i, {k: v[i] for k, v in cols.items()}) for i in range(self.blocks)]

    def _summary(self, i: int, col: dict) -> dict:
        tokens, up, low = self.tokens[i], self.up[i], self.low[i]
        out = {"ratio_dev_median": col["ratio_dev_median"], "decision_dev_q50": col["decision_dev_q50"],
               "decision_dev_q90": col["decision_dev_q90"], "decision_frac": _ratio(self.n_decision[i], tokens),
               "zero_adv_frac": _ratio(self.zero_adv[i], tokens),
               "on_policy_frac": _ratio(self.on_policy[i], tokens)}
        if self.alg.clip != "truncated":
            out["trunc_frac"] = None
        if not self.fixed or not tokens:
            return out | dict.fromkeys(CLIP_KEYS)
        return out | {"clip_frac_active": _ratio(up + low, tokens - self.zero_adv[i]),
                      "clip_up_frac": float(up / tokens), "clip_low_frac": float(low / tokens),
                      "decision_clip_frac": _ratio(up + low, self.n_decision[i]),
                      "decision_clip_up_frac": _ratio(up, self.n_decision[i]),
                      "upclip_pold_median": col["upclip_pold_median"], "upclip_pold_lt02": col["upclip_pold_lt02"],
                      "lowclip_pold_median": col["lowclip_pold_median"],
                      "lowclip_pold_lt02": col["lowclip_pold_lt02"],
                      "upclip_fork_share": float(self.up_fork[i] / up) if self.has_fork and up else None,
                      "freed_frac": float(self.freed[i] / tokens), "freed_pold_median": col["freed_pold_median"]}


def _present(values: np.ndarray, n: np.ndarray) -> list:
    """Each block's value as a float, None where it had no tokens."""
    return [float(v) if k else None for v, k in zip(values, n)]


def clean(record: dict) -> dict:
    """JSON-safe: NaN and inf become None, NumPy scalars plain floats."""
    out = {}
    for k, v in record.items():
        if isinstance(v, (float, np.floating)):
            v = float(v)
            v = v if math.isfinite(v) else None
        elif isinstance(v, np.integer):
            v = int(v)
        out[k] = v
    return out


def summarise_run(records: list[dict], tail: float = 0.1) -> dict:
    """One run's summary: reward and accuracy over the last ``tail`` of the steps, rates over all steps."""
    def col(key, rows):
        vals = [r.get(key) for r in rows]
        vals = [v for v in vals if v is not None]
        return float(np.mean(vals)) if vals else None

    last = records[-max(1, int(round(len(records) * tail))):]
    return {
        "reward": col("reward", last), "accuracy": col("accuracy", last),
        "accuracy_exact": col("accuracy_exact", last),
        "entropy_final": records[-1].get("entropy"), "kl_ref_final": records[-1].get("kl_ref"),
        "clip_frac": col("clip_frac", records), "rur": col("rur", records),
        "zero_grad_frac": col("zero_grad_frac", records), "gen_per_trained": col("gen_per_trained", records),
        "resp_len": col("resp_len", records), "len_wrong": col("len_wrong", records),
        **entropy_summary(records), **{k + "_final": records[-1].get(k) for k in FINAL_KEYS},
        **pass_summary(records), **{k: col(k, records) for k in STEP_MEANS}, **law_summary(records),
    }


def entropy_summary(records: list[dict]) -> dict:
    """Initial entropy and the first step at which the exact entropy is at most half of it (None: never)."""
    first = records[0].get("entropy")
    half = next((r["step"] for r in records if first is not None and r.get("entropy") is not None
                 and r["entropy"] <= first / 2), None)
    return {"entropy_initial": first, "entropy_half_step": half}


def pass_summary(records: list[dict]) -> dict:
    """Peak, final and peak-to-final drop of each exact pass@k curve."""
    out = {}
    for k in PASS_K:
        vals = [r[f"pass@{k}"] for r in records if r.get(f"pass@{k}") is not None]
        peak, final = (max(vals), vals[-1]) if vals else (None, None)
        out.update({f"pass@{k}_peak": peak, f"pass@{k}_final": final,
                    f"pass@{k}_drop": None if peak is None else peak - final})
    return out


def _corr(x, y) -> float | None:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return None
    x, y = x - x.mean(), y - y.mean()  # Pearson's r by fixed-order sums (np.corrcoef calls BLAS)
    return float(dot(x, y) / np.sqrt(dot(x, x) * dot(y, y)))


def law_summary(records: list[dict]) -> dict:
    """Cui et al. over the evaluation intervals: correlation of the summed batch Cov(log pi, A) with the measured
    entropy change, and of the first-order prediction with the fixed-weight change (with its relative error)."""
    rows = [r for r in records if r.get("entropy_change_rows") is not None]
    meas = [r["entropy_change_rows"] for r in rows]
    pred = [r["entropy_change_pred"] for r in rows]
    cov_rows = [r for r in rows if r.get("cov_interval") is not None]
    denom = float(np.abs(meas).sum()) if rows else 0.0
    return {"cov_entropy_corr": _corr([r["cov_interval"] for r in cov_rows], [r["entropy_change"] for r in cov_rows]),
            "law_corr": _corr(pred, meas),
            "law_rel_err": float(np.abs(np.subtract(pred, meas)).sum() / denom) if denom > 0 else None}


SUMMARY_DEFINITIONS = {
    "reward": "mean over the last 10% of steps of the per-step reward", "accuracy": "same, for accuracy",
    "accuracy_exact": "same, for accuracy_exact", "entropy_final": "entropy at the last step",
    "kl_ref_final": "kl_ref at the last step",
    "clip_frac": "mean over all steps", "rur": "mean over all steps", "zero_grad_frac": "mean over all steps",
    "gen_per_trained": "mean over all steps", "resp_len": "mean over all steps", "len_wrong": "mean over all steps",
    "entropy_initial": "entropy at the first step",
    "entropy_half_step": "first step whose entropy is at most half of entropy_initial (None: never)",
    **{k + "_final": f"{k} at the last step" for k in FINAL_KEYS},
    **{f"pass@{k}_{w}": f"{w} of exact pass@{k} over the evaluated steps (drop = peak - final)" for k in PASS_K
       for w in ("peak", "final", "drop")},
    **{k: "mean over the steps that have it" for k in STEP_MEANS},
    "cov_entropy_corr": "correlation over evaluation intervals of the summed cov_logp_adv with entropy_change "
                        "(Cui et al.: negative)",
    "law_corr": "correlation of entropy_change_pred with entropy_change_rows over evaluation intervals",
    "law_rel_err": "sum |entropy_change_pred - entropy_change_rows| / sum |entropy_change_rows|",
}
