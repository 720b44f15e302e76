"""Per-step metrics of a simulator run, their definitions, and the per-run summary."""
from __future__ import annotations

import math

import numpy as np

from .tabular import CORRECT, MALFORMED, Exact, Rollout

#: Every per-step metric, with its definition (also written into summary.json).
DEFINITIONS = {
    "reward": "mean training reward (the algorithm's scheme, shaping included) over the responses generated",
    "accuracy": "share of generated responses that are correct",
    "accuracy_exact": "exact probability of a correct response, prompt drawn uniformly from the pool",
    "entropy": "exact expected per-token entropy of the policy: sum_s d(s) H(pi(.|s)) / sum_s d(s)",
    "kl_ref": "exact expected per-token KL(pi || pi_ref), weighted like entropy",
    "clip_frac": "token clipping ratio (TCR) averaged over the step's minibatch updates, token-weighted",
    "rur": "response utilisation ratio: share of trained responses with a non-zero advantage",
    "zero_grad_frac": "share of generated groups whose rewards are all equal",
    "resp_len": "mean response length (tokens, EOS included) of the generated responses",
    "len_correct": "mean length of the correct generated responses",
    "len_wrong": "mean length of the incorrect (wrong or malformed) generated responses",
    "len_wrong_exact": "exact expected length of an incorrect response, prompt drawn uniformly from the pool",
    "malformed": "share of generated responses that break the format (truncation included)",
    "truncated": "share of generated responses still running at max_len",
    "gen_per_trained": "responses generated per response trained on (DAPO dynamic sampling > 1)",
    "loss": "mean policy loss over the step's updates",
}
SUMMARY_KEYS = ("reward", "accuracy", "accuracy_exact", "entropy_final", "clip_frac", "rur", "zero_grad_frac",
                "gen_per_trained", "kl_ref_final", "resp_len", "len_wrong")


def _mean(x) -> float | None:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if x.size else None


def rollout_metrics(ro: Rollout, rewards: np.ndarray, group_size: int) -> dict:
    """The metrics of the generated responses of one step."""
    correct = ro.outcome == CORRECT
    groups = rewards.reshape(-1, group_size)
    return {
        "reward": _mean(rewards), "accuracy": _mean(correct),
        "zero_grad_frac": _mean(groups.max(1) == groups.min(1)),
        "resp_len": _mean(ro.lengths), "len_correct": _mean(ro.lengths[correct]),
        "len_wrong": _mean(ro.lengths[~correct]), "malformed": _mean(ro.outcome == MALFORMED),
        "truncated": _mean(ro.truncated),
    }


def exact_metrics(ex: Exact) -> dict:
    return {"accuracy_exact": ex.accuracy, "entropy": ex.entropy, "kl_ref": ex.kl_ref,
            "len_wrong_exact": ex.len_wrong}


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
    }


SUMMARY_DEFINITIONS = {
    "reward": "mean over the last 10% of steps of the per-step reward", "accuracy": "same, for accuracy",
    "accuracy_exact": "same, for accuracy_exact", "entropy_final": "entropy at the last step",
    "kl_ref_final": "kl_ref at the last step",
    "clip_frac": "mean over all steps", "rur": "mean over all steps", "zero_grad_frac": "mean over all steps",
    "gen_per_trained": "mean over all steps", "resp_len": "mean over all steps", "len_wrong": "mean over all steps",
}
