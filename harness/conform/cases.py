"""What a conformance check is made of: generated batches with a target's extras, the reference's named
conventions, and the check of one algorithm x knob. The engine (harness.conform.engine) and the targets
(harness.conform.targets) both import this module; it imports neither."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from spec.registry import DIVERGENCE_CLIPS, get_algorithm

from harness.verify.cases import Case, make_case

#: Step-level batches: rows (groups of STEP_GROUP responses) and padded width; mixed lengths in every batch.
STEP_ROWS, STEP_GROUP, STEP_WIDTH = 8, 4, 6
STEP_FAMILIES = {"mixed": "mixed response lengths (1 to 6 tokens; every row has tokens)",
                 "masked_rows": "mixed lengths with 2 of every 8 rows fully masked (as overlong filtering or masked "
                                "truncated completions leave them)"}
#: max |target - reference| / max(1, max |reference|) under which float64 results agree. Outside code adds
#: stabilisers (1e-8 in denominators, clamps far outside these inputs' range) that stay below it.
TOLERANCE = 1e-6
#: Roundings on the longest path from an input to a loss or gradient element, for a target that computes in a
#: narrower float than float64: logp and old_logp rounded (2), the log-ratio and its exponential (2), the clip,
#: the product with the advantage and the minimum (3), the weight and the sum with a float accumulator (2), and
#: the backward pass through the same operations (7): 16, each of at most eps relative; and the exponential turns
#: the log-ratio's absolute error, eps * |logp|, into a relative one, with |logp| and |log-ratio| < 2^8 in the
#: generated batches (log-ratios up to 100 on log-probs down to about -40).
ROUNDINGS = 16 * 2 ** 8


def tolerance_of(dtype: str) -> float:
    """The tolerance for a target that computes in ``dtype``: ROUNDINGS times the dtype's machine epsilon, never
    below TOLERANCE: float64 1e-6, float32 4.9e-4, bfloat16 32, float16 3.9. Past 1 (bfloat16, float16) no value
    is held to the reference, only finiteness, raises and shapes: their 8 and 11 bits cannot tell a convention from
    rounding on these batches."""
    import torch
    try:
        eps = torch.finfo(getattr(torch, dtype)).eps
    except (AttributeError, TypeError):
        raise ValueError(f"dtype: expected a torch floating dtype (float64, float32, bfloat16, float16), got "
                         f"{dtype!r}") from None
    return max(TOLERANCE, ROUNDINGS * eps)
FAMILIES = {"typical": {"extreme": False, "small_q": False}, "extreme": {"extreme": True}}
#: What each case family holds (the report's preamble lists them). far_ref and ties are built by the engine from a
#: check's typical batches (``family_batch``), for the checks whose reference reads ref_logp or has bounds.
FAMILY_TEXT = {
    "typical": "mixed lengths, empty and length-1 rows, several groups, log-ratios N(0, <= 1)",
    "extreme": "30% of the tokens at log-ratios +-20, +-25, +-50 or +-100 (past every clamp the frameworks apply), "
               "mixed within rows, and small sampling probabilities",
    "far_ref": "typical batches (a third as many) with the reference log-probs 5, 12, 25 or 30 nats above or below "
               "the policy's on 40% of the tokens (checks that read ref_logp)",
    "ties": "typical batches (a third as many) with half the tokens exactly at a bound of the reference (r = 1 - "
            "eps_low or 1 + eps_high, DCPO's bounds at the token's q, DPPO's thresholds at the token's mu, the dual "
            "clip c, the two-sided clip delta, CISPO's cap, GMPO's log-space bounds, the rollout weight at the TIS "
            "cap or the MIS bounds; half the rows' weight at a sequence MIS or rejection band's edge), equal in "
            "float64",
    "lone": "prompts with a single response",
    "groups": "advantages: 2 to 4 groups of G = 8, 3, 5 or 2 responses, 0/1 and continuous rewards, a constant "
              "group of a value no binary float holds (0.3, 0.6, 0.7, 0.9), ragged response masks",
    "ragged": "advantages: groups of different sizes (a partial group, down to a lone response), by group id",
    "nonfinite": "advantages: as groups, with one or two rewards NaN, +inf or -inf (a missing reward: no part in "
                 "its group's statistics, advantage 0)",
    "one_token": "advantages: as groups, with a single unmasked token in the batch (REINFORCE++'s whitening over "
                 "one value: its variance 0, not NaN)",
}
#: Families built on the typical batches hold a bound or an offset on many tokens of every batch: a third of the
#: seeds covers them.
SEED_SHARE = {"far_ref": 3, "ties": 3}
#: |log-ratio| values of the extreme family: the clamps at 20 (verl, OpenRLHF, SkyRL) and 10 on log s, and past them.
EXTREME_LOG_RATIOS = (20.0, 25.0, 50.0, 100.0)
#: Offsets (nats) of the reference log-probs in the far_ref family: k3 = e^d - d - 1 is 142 at d = 5.
FAR_REF_OFFSETS = (-30.0, -25.0, -12.0, -5.0, 5.0, 12.0, 25.0, 30.0)


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
    if family == "extreme":  # the generator's +-20 tokens spread over every clamp and past it
        rng = np.random.default_rng(60_000 + seed)
        lr = b.logp - b.old_logp
        far = np.abs(lr) == 20.0
        b.logp = np.where(far, b.old_logp + np.sign(lr) * rng.choice(EXTREME_LOG_RATIOS, lr.shape), b.logp)
    if b.group_size < min_group:  # regroup the same rows into fewer, larger groups
        rows = len(b.mask) - len(b.mask) % min_group or min_group
        b = b.take(rows=np.arange(rows) % len(b.mask), group_size=min_group)
    return b


def far_ref(b: Batch, seed: int) -> Batch:
    """``b`` with the reference log-probs moved by FAR_REF_OFFSETS nats on about 40% of the tokens."""
    rng = np.random.default_rng(70_000 + seed)
    jump = rng.choice(FAR_REF_OFFSETS, b.mask.shape) * (rng.random(b.mask.shape) < 0.4)
    return replace(b, ref_logp=b.ref_logp + jump, extra=dict(b.extra))


def exact_offset(base, value, log_space: bool = False) -> np.ndarray:
    """y with exp(base - y) == value (base - y == value with ``log_space``) in float64 as torch computes it,
    searched within 8 ulps of base - log(value); where no such y exists, the nearest start (a tie within an ulp)."""
    import torch
    base, value = np.asarray(base, dtype=float), np.broadcast_to(np.asarray(value, dtype=float), np.shape(base))
    start = base - (value if log_space else np.log(value))
    out, found = start.copy(), np.zeros(base.shape, dtype=bool)
    for step in (0, *(s * k for k in range(1, 9) for s in (1, -1))):
        y = start.copy()
        for _ in range(abs(step)):
            y = np.nextafter(y, np.inf if step > 0 else -np.inf)
        got = base - y if log_space else torch.exp(torch.from_numpy(base - y)).numpy()
        hit = ~found & (got == value)
        out[hit], found = y[hit], found | hit
    return out


def lay_log_ratio(logp, log_ratio) -> np.ndarray:
    """Old log-probs giving ``logp`` the ratios exp(log_ratio) bit for bit where possible (a target that computes
    its own logp keeps a batch's exact ties this way)."""
    import torch
    return exact_offset(logp, torch.exp(torch.as_tensor(np.asarray(log_ratio, dtype=float))).numpy())


def dppo_ratio_bounds(old_logp, kind: str, eps_low: float, eps_high: float) -> tuple[np.ndarray, np.ndarray]:
    """The ratios pi / mu (mu = exp(old_logp)) at which DPPO's trust-region mask switches (Qi et al. 2602.04879):
    Binary-TV at pi - mu = -eps_low and +eps_high; Binary-KL where KL(Bern(mu) || Bern(pi)) reaches eps_low below
    mu and eps_high above it (bisection on log pi, the inside end kept). NaN where no probability pi reaches the
    bound: mu + eps_high >= 1 or mu <= eps_low (TV), mu = 1, or a KL bound past pi = mu e^-60."""
    y = np.minimum(np.asarray(old_logp, dtype=float), 0.0)
    mu = np.exp(y)
    if kind == "binary_tv":
        with np.errstate(divide="ignore"):
            return (np.where(mu > eps_low, 1.0 - eps_low / mu, np.nan),
                    np.where(mu + eps_high < 1.0, 1.0 + eps_high / mu, np.nan))

    def kl(x):  # KL(Bern(mu) || Bern(e^x)), x <= 0; +inf at x = 0 for mu < 1
        with np.errstate(divide="ignore", invalid="ignore"):
            rest = np.where(mu < 1, (1 - mu) * (np.log1p(-mu) - np.log1p(-np.exp(x))), 0.0)
        return mu * (y - x) + rest

    def crossing(out, eps):  # kl(out) > eps >= kl(y) = 0: the ratio at the inside end of the crossing
        inside = y.copy()
        for _ in range(80):
            mid = (out + inside) / 2
            over = kl(mid) > eps
            out, inside = np.where(over, mid, out), np.where(over, inside, mid)
        return np.exp(inside - y)
    far = y - 60.0
    lo = np.where((y < 0) & (kl(far) > eps_low), crossing(far, eps_low), np.nan)
    hi = np.where(y < 0, crossing(np.full_like(y, -1e-300), eps_high), np.nan)
    return lo, hi


def _on_threshold(logp, old_logp, above, kind: str, eps_low: float, eps_high: float) -> tuple:
    """(logp, old_logp), each moved by at most 8 ulps, where DPPO's divergence, as the gpu layer computes it
    (pi - mu, or the binary KL), equals its threshold exactly (eps_high above mu, -eps_low or eps_low below), where
    such a pair is found; unchanged elsewhere."""
    import torch

    from gpu.losses import _binary_kl

    def ulps(v, k):
        for _ in range(abs(k)):
            v = np.nextafter(v, np.inf if k > 0 else -np.inf)
        return v
    if kind == "binary_tv":
        div, goal = lambda x, y: torch.exp(x) - torch.exp(y), np.where(above, eps_high, -eps_low)  # noqa: E731
    else:
        div, goal = _binary_kl, np.where(above, eps_high, eps_low)
    x0, y0 = np.asarray(logp, dtype=float), np.asarray(old_logp, dtype=float)
    out_x, out_y, found = x0.copy(), y0.copy(), np.zeros(x0.shape, dtype=bool)
    steps = (0, *(s * k for k in range(1, 9) for s in (1, -1)))
    for i, j in itertools.product(steps, steps):
        x, y = np.minimum(ulps(x0, i), 0.0), np.minimum(ulps(y0, j), 0.0)
        with np.errstate(invalid="ignore"):
            hit = ~found & (div(torch.from_numpy(x), torch.from_numpy(y)).numpy() == goal)
        out_x[hit], out_y[hit], found = x[hit], y[hit], found | hit
    return out_x, out_y


def _row_log_rho(b: Batch, statistic: str) -> np.ndarray:
    """Each row's log sequence weight over its unmasked tokens, broadcast to [B, T]: the sum of log rho
    (``product``) or its mean (``geometric_mean``), rho = exp(old_logp - rollout_logp)."""
    on = b.mask > 0
    row = np.where(on, b.old_logp - b.extra["rollout_logp"], 0.0).sum(1, keepdims=True)
    if statistic == "geometric_mean":
        row = row / np.maximum(on.sum(1, keepdims=True), 1)
    return np.broadcast_to(row, b.mask.shape)


def at_ties(b: Batch, ties: dict, seed: int) -> Batch:
    """``b`` with about half of its unmasked tokens moved exactly onto a bound in ``ties`` (see Convention): the
    old log-probs for "ratio" and "log_ratio", the rollout log-probs for "rollout" (when the batch has them), the
    policy's log-probs for "dcpo" and "dppo" (whose bounds depend on the old probability); for "rollout_row", half
    of the rows with tokens, ROW_TIES at most, their rollout log-probs moved evenly so that the row's weight sits on
    a bound."""
    rng = np.random.default_rng(80_000 + seed)
    out = replace(b, extra=dict(b.extra))
    for quantity, values in ties.items():
        if quantity in ("rollout", "rollout_row") and "rollout_logp" not in b.extra:
            continue
        pick = (rng.random(b.mask.shape) < 0.5) & (b.mask > 0)
        if quantity == "rollout_row":
            statistic, *bounds = values
            on = b.mask > 0
            live = np.flatnonzero(on.any(1))
            rows = np.zeros((len(b.mask), 1), dtype=bool)
            rows[rng.permutation(live)[:min(ROW_TIES, (len(live) + 1) // 2)]] = True
            target = np.log(rng.choice(np.asarray(bounds, dtype=float), (len(b.mask), 1)))
            per_token = 1.0 if statistic == "geometric_mean" else 1.0 / np.maximum(on.sum(1, keepdims=True), 1)
            shift = (_row_log_rho(out, statistic)[:, :1] - target) * per_token
            out.extra["rollout_logp"] = np.where(rows & on, out.extra["rollout_logp"] + shift,
                                                 out.extra["rollout_logp"])
            continue
        if quantity in ("dcpo", "dppo"):
            if quantity == "dcpo":
                import torch

                import gpu
                bounds = [t.numpy() for t in gpu.dcpo_bounds(torch.from_numpy(np.exp(out.old_logp)), *values)]
            else:
                bounds = list(dppo_ratio_bounds(out.old_logp, *values))
            low = rng.random(b.mask.shape) < 0.5
            value = np.where(np.isnan(bounds[0]) | ~low & ~np.isnan(bounds[1]), bounds[1], bounds[0])
            pick &= ~np.isnan(value)
            value = np.where(pick, value, 1.0)
            logp, old = -exact_offset(-out.old_logp, value), out.old_logp  # exp(logp - old) == bound
            if quantity == "dppo":  # then on the threshold itself, as the mask compares it, where ulps get there
                logp, old = _on_threshold(logp, old, value > 1, *values)
            out.logp, out.old_logp = np.where(pick, logp, out.logp), np.where(pick, old, out.old_logp)
            continue
        value = rng.choice(np.asarray(values, dtype=float), b.mask.shape)
        if quantity == "rollout":
            rollout = exact_offset(out.old_logp, value)
            out.extra["rollout_logp"] = np.where(pick, rollout, out.extra["rollout_logp"])
        else:
            old = exact_offset(out.logp, value, log_space=quantity == "log_ratio")
            out.old_logp = np.where(pick, old, out.old_logp)
    return out


#: At most this many rows are tied on a rollout band in a batch: the engine bounds a tie-break there by taking their
#: sides in every combination (2^ROW_TIES).
ROW_TIES = 5
#: How far past a bound (in log space) ``tie_sides`` puts a tie: above float64's rounding, far below any tolerance.
TIE_STEP = 1e-9


def tie_sides(ties: dict | None, b: Batch, rho: float, per_row: bool = False) -> tuple[list[Batch], np.ndarray]:
    """The one-sided limits of ``b`` at its ties, and where they are: every token whose quantity in ``ties`` (see
    Convention) lies within a relative ``rho`` of one of its bounds (with ``per_row``, every token of a row whose
    sequence ratio exp(mean log-ratio) does; for rollout_row, every token of a row whose weight does) put TIE_STEP
    inside that bound (towards a ratio of 1, inside every bound's range), then TIE_STEP outside, by the policy's
    log-probs for ratio, log_ratio, dcpo and dppo, by the rollout log-probs for rollout and rollout_row (evenly over
    the row), each combination once; ([], no token) when none is at a bound. At a clip bound the branches agree in
    value, not in gradient; at DPPO's thresholds and the MIS and rejection bands the value jumps too. A target may
    take either side (a comparison, ``torch.min`` or ``torch.where``, breaks by rounding, tie by tie) or split it
    (``torch.min`` of two equal values halves the gradient between the surrogate and its clip), and a float tie may
    not be representable at all in the dtype it computes in (a log-ratio rounded to float32, a sequence mean, a
    probability difference): ``rho`` is that dtype's tolerance."""
    at = np.zeros(b.mask.shape, bool)
    if not ties or not b.mask.size:
        return [], at
    on, lr = b.mask > 0, b.logp - b.old_logp
    lens = np.maximum(on.sum(1, keepdims=True), 1)
    if per_row:
        lr = np.broadcast_to(np.where(on, lr, 0.0).sum(1, keepdims=True) / lens, lr.shape)
    # per kind: the log-space move onto the nearest bound, the way inside (sign towards 0), where there is a tie
    moves = {kind: [np.zeros(lr.shape), np.zeros(lr.shape), at.copy()] for kind in ("policy", "rollout")}

    def land(kind, log_q, log_bound, per_token=1.0):
        move, inward, hit = moves[kind]
        near = on & ~hit & (np.abs(log_q - log_bound) <= rho)
        move[near] = ((log_bound - log_q) * per_token)[near]
        inward[near] = np.broadcast_to(-np.sign(log_bound) * per_token, lr.shape)[near]
        hit[near] = True

    for quantity, values in ties.items():
        per_token = 1.0
        if quantity == "dcpo":
            import torch

            import gpu
            values = [np.log(t.numpy()) for t in gpu.dcpo_bounds(torch.from_numpy(np.exp(b.old_logp)), *values)]
        elif quantity == "dppo":
            values = [np.log(v) for v in dppo_ratio_bounds(b.old_logp, *values)]
        elif quantity == "rollout_row":
            statistic, *values = values
            values = [np.log(v) for v in values]
            per_token = 1.0 if statistic == "geometric_mean" else 1.0 / lens
        elif quantity in ("ratio", "rollout"):
            values = [np.log(v) for v in values]
        for log_bound in values:
            log_bound = np.broadcast_to(log_bound, lr.shape)
            if quantity not in ("rollout", "rollout_row"):
                land("policy", lr, log_bound)
            elif "rollout_logp" in b.extra:
                log_q = (b.old_logp - b.extra["rollout_logp"] if quantity == "rollout" else
                         _row_log_rho(b, statistic))
                land("rollout", log_q, log_bound, per_token)
    step = lambda kind, side: np.where(moves[kind][2], moves[kind][0] + side * TIE_STEP * moves[kind][1], 0.0)  # noqa: E731
    sides = []
    for mine, out in itertools.product(*((1, -1) if moves[k][2].any() else (0,) for k in ("policy", "rollout"))):
        if mine or out:
            side = replace(b, logp=b.logp + step("policy", mine), extra=dict(b.extra))
            if out:
                side.extra["rollout_logp"] = b.extra["rollout_logp"] - step("rollout", out)
            sides.append(side)
    return sides, moves["policy"][2] | moves["rollout"][2]


def bind_params(signature: dict, adapter: dict, aliases: dict) -> dict:
    """Our argument name -> a user callable's parameter name (``signature["params"]``): the one the adapter gives
    for it (a ValueError when the callable has no such parameter), else the first of ``aliases[ours]`` it has."""
    names = [n for n, _ in signature["params"]]
    binding = {}
    for ours, known in aliases.items():
        given = adapter.get(ours)
        if given is not None and given not in names:
            raise ValueError(f"adapter: {ours}={given!r}, but the callable has no parameter {given!r} (it has "
                             f"{', '.join(names) or 'none'})")
        found = [given] if given is not None else [a for a in known if a in names]
        if found:
            binding[ours] = found[0]
    return binding


@dataclass(frozen=True)
class Convention:
    """A named reading of the reference: ``fn(batch) -> (value, gradient or None)``; ``named`` is False for a
    variant that the reference does not name (shown as a hint of what the target computes).

    ``ties``: the values at which the convention switches branch, by quantity ("ratio" exp(logp - old_logp),
    "log_ratio" logp - old_logp, "rollout" exp(old_logp - rollout_logp); "dcpo": (eps_low, eps_high, r_max) of
    DCPO's bounds of the ratio, which depend on each token's q; "dppo": (binary_tv or binary_kl, eps_low,
    eps_high) of DPPO's thresholds, which depend on each token's mu; "rollout_row": (product or geometric_mean,
    low, high), the band of a row's weight), for the ties family; ``far_ref``: whether
    it reads ref_logp (for the far_ref family); ``policy``: (algorithm, hp, rows_counted) of a policy-loss
    convention, which the clamp variants rebuild; ``base`` and ``part``: a variant is ``base`` with one change,
    ``part``, named in words (e.g. "clamps the log-ratio at +-20"); ``linear``: how its value follows from its
    gradient g token by token, up to a term continuous at every bound: "logp" for a loss sum_t c_t logp_t with c_t
    held constant (CISPO, DPPO, VESPO, GPG; value sum_t g_t logp_t), "sum" for its surrogate sum_t c_t, "" for
    neither."""

    label: str
    fn: Callable
    named: bool = True
    ties: dict | None = None
    far_ref: bool = False
    policy: tuple | None = None
    base: "Convention | None" = None
    part: str = ""
    linear: str = ""


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
    families: tuple | None = None
    exact: Callable | None = None
    note: str = ""
    tolerance: float | None = None
    reads: str = "logp, old_logp, adv, mask (policy log-probs, sampling log-probs, advantages, response mask)"
    dtype: str = "float64"

    def __post_init__(self):
        """By default: the tolerance of the dtype the target computes in (``tolerance_of``); typical and extreme,
        with far_ref when the reference reads ref_logp and ties when it has bounds."""
        if self.tolerance is None:
            self.tolerance = tolerance_of(self.dtype)
        if self.families is None:
            conv = self.reference
            self.families = ("typical", "extreme") + (("far_ref",) if conv and conv.far_ref else ()) + (
                ("ties",) if conv and conv.ties else ())

    def batch(self, seed: int, family: str) -> Batch:
        """The family's generated batch for this check (far_ref and ties from its typical batch); for a reference
        that reads pi = exp(logp) as a probability (DPPO), every token whose logp is above 0 moved down with its
        old_logp, the log-ratio kept."""
        typical = "typical" if family in ("far_ref", "ties") else family
        b = self.cases(seed, typical)
        policy = self.reference.policy if self.reference is not None else None
        if policy is not None and get_algorithm(policy[0]).clip in DIVERGENCE_CLIPS:
            above = np.maximum(b.logp, 0.0)
            b = replace(b, logp=b.logp - above, old_logp=b.old_logp - above, extra=dict(b.extra))
        if family == "far_ref":
            return far_ref(b, seed)
        if family == "ties":
            return at_ties(b, self.reference.ties, seed)
        return b


class NotApplicable(ValueError):
    """A grid cell the trainer cannot be configured for (e.g. fewer accumulation steps than generations)."""


@dataclass
class StepCheck:
    """One algorithm x mode of a trainer's optimisation step: ``step(batch, micro, ranks) -> (grad, used)`` splits
    ``batch`` over ``ranks`` data-parallel ranks and micro-batches of ``micro`` rows per rank (None: one
    micro-batch per rank) as the trainer does, and returns the gradient w.r.t. the per-token log-probs after
    accumulation and the ranks' mean, with the batch whose rows it used (a step may use part of ``batch``); it raises
    NotApplicable for a split the trainer does not allow. ``candidates``: steps a trainer may take instead, by
    name, each ``f(batch, micro, ranks) -> gradient`` on the rows used."""

    algorithm: str
    call: str
    knob: str
    step: Callable
    reference: Convention
    note: str = ""
    tolerance: float = TOLERANCE
    batches: Callable | None = None
    candidates: dict = field(default_factory=dict)


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


def gdpo_batch(seed, family):
    """An advantage batch (groups of G >= 2) with a second reward per response, ``reward_2`` (0, 0.5 or 1, held by
    each of the row's columns), for GDPO's two rewards."""
    b = advantage_batch(seed, family)
    rng = np.random.default_rng(90_000 + seed)
    b.extra["reward_2"] = np.repeat(rng.choice([0.0, 0.5, 1.0], (len(b.mask), 1)), b.max_len, 1)
    return b


def advantage_batch(seed, family):
    """Groups of G >= 2 (typical) or with lone responses, G = 1 (lone); rewards are rounded advantages."""
    if family == "lone":
        b = batch_of(seed, "typical")
        return b.take(group_size=1)
    return batch_of(seed, "typical", min_group=2)
