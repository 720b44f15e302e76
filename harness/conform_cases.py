"""What a conformance check is made of: generated batches with a target's extras, the reference's named
conventions, and the check of one algorithm x knob. The engine (harness.conform) and the targets
(harness.targets) both import this module; it imports neither."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .cases import Case, make_case

#: max |target - reference| / max(1, max |reference|) under which float64 results agree. Outside code adds
#: stabilisers (1e-8 in denominators, clamps far outside these inputs' range) that stay below it.
TOLERANCE = 1e-6
FAMILIES = {"typical": {"extreme": False, "small_q": False}, "extreme": {"extreme": True}}


@dataclass
class Batch(Case):
    """A generated case plus row-aligned extras a target needs (token ids)."""

    extra: dict = field(default_factory=dict)

    @property
    def rewards(self) -> np.ndarray:
        """One outcome reward per row (rounded advantages: ties and all-equal groups occur)."""
        return np.round(self.adv[:, 0]) if self.adv.size else np.zeros(len(self.adv))

    def take(self, rows=None, cols=None, group_size=None) -> "Batch":
        rows = np.arange(len(self.mask)) if rows is None else np.asarray(rows, dtype=int)
        cols = np.arange(self.max_len) if cols is None else np.asarray(cols, dtype=int)
        pick = lambda x: x[np.ix_(rows, cols)]  # noqa: E731
        return Batch(pick(self.logp), pick(self.old_logp), pick(self.adv), pick(self.mask), pick(self.ref_logp),
                     group_size or self.group_size, {k: pick(v) for k, v in self.extra.items()})

    def to_json(self) -> dict:
        out = {"group_size": self.group_size, "mask": self.mask.astype(int).tolist()}
        for name, value in (*((n, getattr(self, n)) for n in ("logp", "old_logp", "adv", "ref_logp")),
                            *self.extra.items()):
            out[name] = np.asarray(value).tolist()
        return out


def batch_of(seed: int, family: str = "typical", seq_adv=None, min_group=1) -> Batch:
    """A generated batch (harness.cases.make_case) of a family: typical, or extreme ratios and small q."""
    if family not in FAMILIES:
        raise ValueError(f"family: unknown case family {family!r}; expected one of {', '.join(FAMILIES)}")
    case = make_case(seed, seq_adv=seq_adv, **FAMILIES[family])
    b = Batch(case.logp, case.old_logp, case.adv, case.mask, case.ref_logp, case.group_size)
    if b.group_size < min_group:  # regroup the same rows into fewer, larger groups
        rows = len(b.mask) - len(b.mask) % min_group or min_group
        b = b.take(rows=np.arange(rows) % len(b.mask), group_size=min_group)
    return b


@dataclass(frozen=True)
class Convention:
    """A named reading of the reference: ``fn(batch) -> (value, gradient or None)``; ``named`` is False for a
    variant that the reference does not name (shown as a hint of what the target computes)."""

    label: str
    fn: Callable
    named: bool = True


@dataclass
class Check:
    """One algorithm x knob of a target: ``run(batch) -> (value, grad, batch_used)`` calls the outside code."""

    algorithm: str
    call: str
    knob: str
    run: Callable
    reference: Convention | None
    candidates: list = field(default_factory=list)
    cases: Callable = batch_of
    families: tuple = tuple(FAMILIES)
    exact: Callable | None = None
    note: str = ""
    tolerance: float = TOLERANCE
    reads: str = "logp, old_logp, adv, mask (policy log-probs, sampling log-probs, advantages, response mask)"
