"""The regime card of a run set (spec/regime.py): per label, each card entry measured on every seed's logged
steps and averaged over seeds, with the entries a run set's logs cannot supply named as such.

Any run set the reports read gets one: a simulator sweep, tier, SmolLM2 or ``cliplab train`` run folders
(``rundirs.load_runs``) and cluster logs (``cluster.load``); all arrive as runs whose records carry the card's step
metrics under their cliplab names. A clip statistic an algorithm cannot have (no hard clip: SAPO's soft gate,
CISPO's truncated weight, an algorithm without a clip) reads "n/a", never 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from spec.regime import CARD, CLIP_BINDS, ENTRIES, NOT_APPLICABLE, UPPER_CLIP_BINDS, Entry, reduce_values
from spec.registry import ALGORITHMS

from harness.reports.rundirs import fmt, md

#: Card entries that are clip statistics of a hard clip (fixed or dynamic bounds).
HARD_CLIP_ENTRIES = ("clip_frac", "clip_up_frac", "clip_low_frac", "upclip_pold_median", "upclip_pold_lt02",
                     "lowclip_pold_median", "lowclip_pold_lt02", "decision_clip_frac", "decision_clip_up_frac")
#: Entries shown as percentages.
PERCENT = ("accuracy_start", "accuracy_end", "headroom", "clip_frac", "zero_adv_frac", "clip_up_frac",
           "clip_low_frac", "upclip_pold_lt02", "lowclip_pold_lt02", "trunc_frac", "entropy_fall",
           "entropy_relevant_fall", "malformed_max", "on_policy_frac")


@dataclass(frozen=True)
class CardValue:
    """One entry of one label: the mean over the seeds that logged it (None where none did), how many seeds,
    and whether the entry is undefined for the algorithm (``applicable`` False: "n/a")."""
    value: float | None
    seeds: int
    applicable: bool = True

    def text(self, entry: str) -> str:
        if not self.applicable:
            return NOT_APPLICABLE
        if self.value is None:
            return "not logged"
        return fmt(self.value, pct=entry in PERCENT)


def applicable(algo: str | None, entry: str) -> bool:
    """Whether ``entry`` is defined for ``algo``: hard-clip statistics only for a fixed or dynamic clip,
    ``trunc_frac`` only for a truncated weight (CISPO); anything for an algorithm the registry does not know."""
    alg = ALGORITHMS.get(algo) if algo else None
    if alg is None:
        return True
    if entry in HARD_CLIP_ENTRIES:
        return alg.clip in ("fixed", "dynamic")
    if entry == "trunc_frac":
        return alg.clip == "truncated"
    return True


def _by_step(records: list[dict], metric: str) -> dict[int, float]:
    out = {}
    for i, rec in enumerate(records):
        v = rec.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[int(rec.get("step", i))] = float(v)
    return out


def entry_value(runs: list[dict], entry: Entry) -> CardValue:
    """``entry`` (a card entry, or one of its metric over another window) of one label's runs (each with ``algo``
    and ``records``): its mean over the seeds that logged it."""
    if not applicable(runs[0].get("algo") if runs else None, entry.name):
        return CardValue(None, 0, applicable=False)
    values = [v for r in runs if (v := reduce_values(entry, _by_step(r["records"], entry.metric))) is not None]
    return CardValue(math.fsum(values) / len(values) if values else None, len(values))


def label_card(runs: list[dict], names=None) -> dict[str, CardValue]:
    """One label's card from its runs (each with ``algo`` and ``records``): every entry, or those ``names``d."""
    return {e.name: entry_value(runs, e) for e in CARD if names is None or e.name in names}


def run_set_card(runs: list[dict]) -> dict[str, dict[str, CardValue]]:
    """Every label's card, labels in the order first seen."""
    by_label: dict[str, list[dict]] = {}
    for r in runs:
        by_label.setdefault(r["label"], []).append(r)
    return {label: label_card(rs) for label, rs in by_label.items()}


def supplied(cards: dict[str, dict[str, CardValue]]) -> list[str]:
    """The card entries some label of the run set logs."""
    return [e.name for e in CARD if any(c[e.name].value is not None for c in cards.values())]


def card_lines(cards: dict[str, dict[str, CardValue]], title: str = "## Regime card") -> list[str]:
    """A markdown table: one row per card entry the run set logs, one column per label; then the entries no log
    supplies, named in one line."""
    labels = list(cards)
    shown = supplied(cards)
    if not labels:
        return []
    lines = [title, "", "What the runs' regime measured (spec/regime.py defines each entry; steps windows: start and "
             "end are the first and last tenth of the logged steps, early the first 100). \"n/a\": the algorithm "
             "has no such clip.", "", "| entry | " + " | ".join(md(lbl) for lbl in labels) + " |",
             "|---|" + "---|" * len(labels)]
    for name in shown:
        lines.append(f"| {name} | " + " | ".join(cards[lbl][name].text(name) for lbl in labels) + " |")
    missing = [e.name for e in CARD if e.name not in shown]
    if missing:
        lines += ["", "Not logged by these runs: " + ", ".join(missing) + "."]
    return lines + [""]


#: How far two values of a card entry may lie apart and still match: ("log", factor) for shares and movements,
#: ("linear", width) for quantities in [0, 1].
TOLERANCES = {"clip_frac": ("log", 2.0), "clip_up_frac": ("log", 2.0), "clip_low_frac": ("log", 2.0),
              "decision_dev_q50": ("log", 2.0), "decision_dev_q90": ("log", 2.0), "trunc_frac": ("log", 2.0),
              "decision_frac": ("log", 2.0), "decision_clip_frac": ("log", 2.0),
              "decision_clip_up_frac": ("log", 2.0),
              "upclip_pold_lt02": ("linear", 0.1), "lowclip_pold_lt02": ("linear", 0.1),
              "accuracy_start": ("linear", 0.1), "accuracy_end": ("linear", 0.1), "headroom": ("linear", 0.1),
              "entropy_fall": ("linear", 0.1), "entropy_relevant_fall": ("linear", 0.1),
              "malformed_max": ("linear", 0.03), "on_policy_frac": ("linear", 0.1)}
#: The entries a fit (``cliplab sim --match``) targets and a comparison of two labels' cards reads.
FIT_ENTRIES = ("decision_clip_frac", "decision_clip_up_frac", "clip_frac", "clip_up_frac", "decision_dev_q50",
               "decision_dev_q90", "upclip_pold_lt02", "accuracy_start", "accuracy_end", "entropy_fall",
               "entropy_relevant_fall")
#: An entry a fit leaves out where the target supplies the one it maps to: the clip conditions' ``across`` entries,
#: the clip ratios per decision token, stand for the clip ratios per token, whose share of tokens that cannot move
#: the simulator's short answers cannot copy (decision tokens are 2.0% of the tiny tier's trained tokens, 41-57% of
#: feature_lm's).
FIT_INSTEAD = {c.across: c.entry for c in (CLIP_BINDS, UPPER_CLIP_BINDS)}
#: A fit's record (``cliplab sim --match``: harness.runs.match.Fit.record), beside the ablation's runs.
FIT_FILE = "fit.json"
LOG_FLOOR = 1e-4  # a share below this reads as this: a clip that binds on under 0.01% of tokens does not bind
MISSING = 3.0  # the residual of an entry the simulator's run did not produce (no up-clipped token, say)


def residual(entry: str, fitted: float | None, target: float) -> float:
    """``fitted`` against ``target`` in units of the entry's tolerance (``TOLERANCES``: a share or a ratio movement
    within a factor of 2, an accuracy, a share of tokens below pi_old 0.2 or an entropy fall within 0.1, the
    malformed share within 0.03); |residual| <= 1 is a match."""
    if fitted is None or not math.isfinite(fitted):
        return MISSING
    scale, width = TOLERANCES[entry]
    if scale == "log":
        return math.log(max(fitted, LOG_FLOOR) / max(target, LOG_FLOOR)) / math.log(width)
    return (fitted - target) / width
