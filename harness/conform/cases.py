"""What a conformance check is made of: generated batches with a target's extras, the reference's named
conventions, and the check of one algorithm x knob. The engine (harness.conform.engine) and the targets
(harness.conform.targets) both import this module; it imports neither."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from harness.verify.cases import Case, make_case

#: Step-level batches: rows (groups of STEP_GROUP responses) and padded width; mixed lengths in every batch.
STEP_ROWS, STEP_GROUP, STEP_WIDTH = 8, 4, 6
STEP_FAMILIES = {"mixed": "mixed response lengths (1 to 6 tokens; every row has tokens)",
                 "masked_rows": "mixed lengths with 2 of every 8 rows fully masked (as overlong filtering or masked "
                                "truncated completions leave them)"}
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
    """A generated batch (harness.verify.cases.make_case) of a family: typical, or extreme ratios and small q."""
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


class NotApplicable(ValueError):
    """A grid cell the trainer cannot be configured for (e.g. fewer accumulation steps than generations)."""


@dataclass
class StepCheck:
    """One algorithm x mode of a trainer's optimisation step: ``step(batch, micro, ranks) -> (grad, used)`` splits
    ``batch`` over ``ranks`` data-parallel ranks and micro-batches of ``micro`` rows per rank (None: one
    micro-batch per rank) as the trainer does, and returns the gradient w.r.t. the per-token log-probs after
    accumulation and the ranks' mean, with the batch whose rows it used (a step may use part of ``batch``); it raises
    NotApplicable for a split the trainer does not allow."""

    algorithm: str
    call: str
    knob: str
    step: Callable
    reference: Convention
    note: str = ""
    tolerance: float = TOLERANCE
    batches: Callable | None = None


def step_batch(seed: int, family: str = "mixed", rows: int = STEP_ROWS) -> Batch:
    """A step-level batch: ``rows`` responses in groups of STEP_GROUP, one advantage per response, contiguous
    response masks of mixed lengths (the shortest has 1 token, the longest STEP_WIDTH), typical ratios."""
    if family not in STEP_FAMILIES:
        raise ValueError(f"family: unknown step-level family {family!r}; expected one of {', '.join(STEP_FAMILIES)}")
    rng = np.random.default_rng(30_000 + seed)
    case = make_case(seed, prompts=rows // STEP_GROUP, group_size=STEP_GROUP, length=STEP_WIDTH, extreme=False,
                     small_q=False, seq_adv=True)
    lens = rng.integers(1, STEP_WIDTH + 1, size=rows)
    lens[rng.choice(rows, 2, replace=False)] = (1, STEP_WIDTH)
    if family == "masked_rows":
        lens[rng.choice(rows, 2 * rows // STEP_ROWS, replace=False)] = 0
    mask = (np.arange(STEP_WIDTH)[None, :] < lens[:, None]).astype(float)
    return Batch(case.logp, case.old_logp, case.adv, mask, case.ref_logp, STEP_GROUP)


def shards(n_rows: int, micro: int | None, ranks: int) -> list[list[np.ndarray]]:
    """Row indices per data-parallel rank (contiguous blocks, as a dispatcher chunks a batch) and, within each,
    per micro-batch of ``micro`` rows (None: the rank's whole share in one micro-batch)."""
    if ranks < 1 or n_rows % ranks:
        raise ValueError(f"ranks: expected a positive divisor of the batch's {n_rows} rows, got {ranks!r}")
    per = n_rows // ranks
    size = per if micro is None else micro
    if size < 1 or per % size:
        raise ValueError(f"micro: expected a positive divisor of the {per} rows per rank, got {micro!r}")
    return [[np.arange(r * per + k * size, r * per + (k + 1) * size) for k in range(per // size)]
            for r in range(ranks)]


ADV_READS = "round(adv[:, 0]) as each response's reward, mask, group_size (G contiguous rows per prompt)"


def rollout_batch(seed, family):
    """A generated batch plus the engine's log-probs: old_logp moved by N(0, 0.5) nats per token (N(0, 2) in the
    extreme family)."""
    b = batch_of(seed, family)
    rng = np.random.default_rng(20_000 + seed)
    b.extra["rollout_logp"] = b.old_logp + rng.normal(0.0, 2.0 if family == "extreme" else 0.5, b.mask.shape)
    return b


def advantage_batch(seed, family):
    """Groups of G >= 2 (typical) or with lone responses, G = 1 (lone); rewards are rounded advantages."""
    if family == "lone":
        b = batch_of(seed, "typical")
        return b.take(group_size=1)
    return batch_of(seed, "typical", min_group=2)
