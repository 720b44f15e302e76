"""The regime card: what a run set's training regime measured, under one set of names and definitions that the
simulator, the transformer tier, SmolLM2 runs and cluster logs share, and the conditions a claim needs of it.

A claim about clipping is only testable where the clip binds. The card says, per label and step window, how often
it binds, how far the ratios move on the tokens that decide the reward, which tokens the upper clip holds (DAPO
2503.14476 Fig. 3a: exploration tokens have pi_old < 0.2), how far entropy fell, how much headroom is left and how
on-policy the updates are. Each claim names conditions on the card (``Condition``); a card that fails one makes
the claim "not testable here", with the measured value that failed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

#: A decision token: sampled with pi_old below this and trained with a non-zero advantage. The tokens at
#: pi_old >= 0.9 move by float round-off only, and would hide the decision tokens' ratio movement in a median.
DECISION_P_OLD = 0.9
#: An exploration token: pi_old below this (DAPO Fig. 3a, the up-clipped tokens' probabilities).
EXPLORATION_P_OLD = 0.2

#: The exploration axis: where the tokens RL must raise sit, below EXPLORATION_P_OLD at high-entropy positions
#: ("exploration") or above it ("sharpening"). The simulator's ``explore`` knob (sim/feature_lm.py) takes these
#: settings, and the tiny tier's priors (gpu.models.TINY_CHAR_RECIPES) are one each, by model name.
EXPLORE_SETTINGS = ("sharpening", "exploration")
TINY_CHAR_PRIORS: Mapping[str, str] = MappingProxyType({"tiny_char": "exploration",
                                                         "tiny_char_sharpening": "sharpening"})

#: The per-step metrics every layer logs for the card (sim/metrics.py, gpu/step_metrics.py), each defined once.
STEP_METRICS: Mapping[str, str] = MappingProxyType({
    "clip_frac": "token clip ratio: share of trained tokens the clip holds, over the step's updates",
    "zero_adv_frac": "share of trained tokens with A = 0 (they cannot clip, and are counted apart)",
    "clip_frac_active": "share of trained tokens with A != 0 that the clip holds",
    "clip_up_frac": "share of trained tokens with A > 0 and ratio above the upper bound",
    "clip_low_frac": "share of trained tokens with A < 0 and ratio below the lower bound",
    "decision_dev_q50": f"median |r - 1| over decision tokens (pi_old < {DECISION_P_OLD}, A != 0)",
    "decision_dev_q90": f"90th percentile of |r - 1| over decision tokens (pi_old < {DECISION_P_OLD}, A != 0)",
    "decision_frac": f"share of trained tokens that are decision tokens (pi_old < {DECISION_P_OLD}, A != 0): the "
                     "others have A = 0 or are near-certain and barely move, so a token ratio's clip_frac is about "
                     "decision_frac times the decision tokens' clipped share",
    "decision_clip_frac": "clipped tokens per decision token (clip_frac / decision_frac): the clip ratio without the "
                          "share of tokens that cannot move, which differs between environments (98% of the tiny "
                          "tier's trained tokens, about half of feature_lm's)",
    "decision_clip_up_frac": "up-clipped tokens per decision token (clip_up_frac / decision_frac)",
    "upclip_pold_median": "median pi_old of the up-clipped tokens",
    "upclip_pold_lt02": f"share of the up-clipped tokens with pi_old < {EXPLORATION_P_OLD}",
    "lowclip_pold_median": "median pi_old of the down-clipped tokens",
    "lowclip_pold_lt02": f"share of the down-clipped tokens with pi_old < {EXPLORATION_P_OLD}",
    "trunc_frac": "CISPO: share of trained tokens whose importance weight its cap truncates",
    "entropy": "mean per-token entropy of the policy on the step's responses (nats)",
    "entropy_relevant": "the part of entropy at reward-relevant positions (nats)",
    "malformed": "share of generated responses that break the format (truncation included)",
    "accuracy": "share of generated responses that are correct",
    "updates_per_batch": "optimiser updates per rollout batch (epochs x minibatches)",
    "on_policy_frac": "share of token updates made while the policy still equals the sampler (r = 1 exactly)",
    "staleness": "optimiser updates between the sampling policy and the policy of the batch's first update",
})

#: What a clip statistic is for an algorithm without a hard clip: not zero, but not defined.
NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class Entry:
    """One line of the card: ``reduce`` of the step metric ``metric`` over the steps in ``window``."""
    name: str
    metric: str
    window: str  # "start": the first WINDOW_SHARE of steps, "early": the first EARLY_STEPS, "end", "all"
    reduce: str  # "mean" over the window's steps, "fall": 1 - end / start, "headroom": 1 - mean, "max": MAX_STEPS
    meaning: str


#: The first and last share of a run's steps that "start" and "end" average over.
WINDOW_SHARE = 0.1
#: The steps "early" averages over (the clip binds most while the policy still moves).
EARLY_STEPS = 100
#: "max" is the largest mean over this many consecutive logged steps: one step's responses (128 in the tiny tier)
#: are too few to read a 3% share (4 of 128 is 3.1%), so a single-step maximum would read sampling noise.
MAX_STEPS = 10

CARD: tuple[Entry, ...] = (
    Entry("accuracy_start", "accuracy", "start", "mean", "accuracy over the first tenth of the steps"),
    Entry("accuracy_end", "accuracy", "end", "mean", "accuracy over the last tenth of the steps"),
    Entry("headroom", "accuracy", "end", "headroom", "1 - accuracy_end: what an algorithm can still gain"),
    Entry("clip_frac", "clip_frac", "early", "mean", "token clip ratio over the first 100 steps"),
    Entry("zero_adv_frac", "zero_adv_frac", "early", "mean", "share of trained tokens with A = 0"),
    Entry("clip_up_frac", "clip_up_frac", "early", "mean", "up-clipped share over the first 100 steps"),
    Entry("clip_low_frac", "clip_low_frac", "early", "mean", "down-clipped share over the first 100 steps"),
    Entry("decision_dev_q50", "decision_dev_q50", "early", "mean", "median |r - 1| on decision tokens"),
    Entry("decision_dev_q90", "decision_dev_q90", "early", "mean", "90th percentile of |r - 1| on decision tokens"),
    Entry("decision_frac", "decision_frac", "early", "mean", "share of trained tokens that are decision tokens"),
    Entry("decision_clip_frac", "decision_clip_frac", "early", "mean", "clipped tokens per decision token"),
    Entry("decision_clip_up_frac", "decision_clip_up_frac", "early", "mean", "up-clipped tokens per decision token"),
    Entry("upclip_pold_median", "upclip_pold_median", "early", "mean", "median pi_old of up-clipped tokens"),
    Entry("upclip_pold_lt02", "upclip_pold_lt02", "early", "mean", "share of up-clipped tokens below pi_old 0.2"),
    Entry("lowclip_pold_median", "lowclip_pold_median", "early", "mean", "median pi_old of down-clipped tokens"),
    Entry("lowclip_pold_lt02", "lowclip_pold_lt02", "early", "mean",
          "share of down-clipped tokens below pi_old 0.2"),
    Entry("trunc_frac", "trunc_frac", "early", "mean", "CISPO: share of tokens its cap truncates"),
    Entry("entropy_start", "entropy", "start", "mean", "entropy over the first tenth of the steps (nats)"),
    Entry("entropy_fall", "entropy", "all", "fall", "1 - entropy at the end / at the start"),
    Entry("entropy_relevant_start", "entropy_relevant", "start", "mean", "reward-relevant entropy at the start"),
    Entry("entropy_relevant_fall", "entropy_relevant", "all", "fall", "1 - reward-relevant entropy end / start"),
    Entry("malformed_max", "malformed", "all", "max", f"largest malformed share over {MAX_STEPS} consecutive steps"),
    Entry("updates_per_batch", "updates_per_batch", "all", "mean", "optimiser updates per rollout batch"),
    Entry("on_policy_frac", "on_policy_frac", "all", "mean", "share of token updates that are exactly on-policy"),
    Entry("staleness", "staleness", "all", "mean", "updates between sampler and learner"),
)
ENTRIES: Mapping[str, Entry] = MappingProxyType({e.name: e for e in CARD})


def window_steps(steps: list[int], window: str) -> list[int]:
    """The steps of a run (sorted, as logged) that ``window`` covers."""
    if window == "all":
        return list(steps)
    if window == "early":
        first = steps[0] if steps else 0
        return [s for s in steps if s < first + EARLY_STEPS]
    n = max(1, math.ceil(len(steps) * WINDOW_SHARE))
    return list(steps[:n] if window == "start" else steps[-n:])


def reduce_values(entry: Entry, by_step: dict[int, float]) -> float | None:
    """One run's value of ``entry`` from its metric's logged values by step (None where never logged).

    "fall" compares the mean over the first tenth of the logged steps with the mean over the last tenth; "max" is
    the largest mean over MAX_STEPS consecutive logged steps (all of them, when fewer)."""
    steps = sorted(s for s, v in by_step.items() if v is not None and math.isfinite(v))
    if not steps:
        return None
    if entry.reduce == "fall":
        start = _mean([by_step[s] for s in window_steps(steps, "start")])
        end = _mean([by_step[s] for s in window_steps(steps, "end")])
        return 1.0 - end / start if start > 0 else None
    values = [by_step[s] for s in window_steps(steps, entry.window)]
    if entry.reduce == "max":
        width = min(MAX_STEPS, len(values))
        return max(_mean(values[i:i + width]) for i in range(len(values) - width + 1))
    mean = _mean(values)
    return 1.0 - mean if entry.reduce == "headroom" else mean


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}


@dataclass(frozen=True)
class Condition:
    """A claim's need of the card: ``entry op threshold`` on the label ``of`` (an algorithm's name, or "any").
    ``across``: the entry that stands for ``entry`` when two environments' cards are compared (the clip ratios per
    decision token for the per-token ones, whose share of tokens that cannot move differs between environments)."""
    entry: str
    op: str
    threshold: float
    why: str
    of: str = "any"
    across: str | None = None

    def __post_init__(self):
        for name in filter(None, (self.entry, self.across)):
            if name not in ENTRIES:
                raise ValueError(f"entry: expected one of {', '.join(ENTRIES)}, got {name!r}")
        if self.op not in OPS:
            raise ValueError(f"op: expected one of {', '.join(OPS)}, got {self.op!r}")

    def holds(self, value: float | None) -> bool:
        return value is not None and math.isfinite(value) and OPS[self.op](value, self.threshold)

    def text(self) -> str:
        return f"{self.entry} {self.op} {self.threshold:g}"


#: The regime conditions the claims share.
#: A clip binds on at least 0.01% of tokens (runs on real models report about 0.03-1%); below it a claim about the
#: tokens a clip acts on has nothing to read.
CLIP_BINDS = Condition("clip_frac", ">=", 1e-4, "the clip must bind for a clipping rule to matter",
                       across="decision_clip_frac")
UPPER_CLIP_BINDS = Condition("clip_up_frac", ">=", 1e-4, "the upper clip must bind for clip-higher to free tokens",
                             across="decision_clip_up_frac")
RATIOS_MOVE = Condition("decision_dev_q50", ">=", 0.02, "ratios on decision tokens must leave 1 by a tenth of eps")
ENTROPY_FALLS = Condition("entropy_relevant_fall", ">=", 0.2, "a claim about slowing entropy collapse needs a collapse")
HEADROOM = Condition("headroom", ">=", 0.1, "a better algorithm needs accuracy left to gain")
WELL_FORMED = Condition("malformed_max", "<=", 0.03, "format collapse would drive the comparison instead")
OFF_POLICY = Condition("on_policy_frac", "<", 1.0, "an update that is exactly on-policy cannot clip")
EXPLORATION = Condition("upclip_pold_lt02", ">=", 0.5,
                        "DAPO's clip-higher argument is about up-clipped exploration tokens (pi_old < 0.2)")
SHARPENING = Condition("upclip_pold_lt02", "<", 0.5, "most up-clipped tokens are already likely (pi_old >= 0.2)")
