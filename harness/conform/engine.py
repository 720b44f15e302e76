"""``cliplab conform TARGET``: drive an outside implementation and the reference with the same batches, and say
for each algorithm, mode, knob and case family whether they agree, differ or the target raises, with every
distinct finding: the named convention the target matches instead, a clamp found on top of it, a NaN or an
exception, each with its largest difference and a minimal input."""
from __future__ import annotations

import itertools
import json
import re
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from spec.records import write_text
from spec.registry import (AGG_MODES, CAP_MODES, HPARAMS, KL_KINDS, POLICY_ALGORITHMS, ROLLOUT_CORRECTIONS,
                           get_algorithm)

from harness.conform.cases import (FAMILY_TEXT, ROW_TIES, SEED_SHARE, TOLERANCE, Batch, Check, Convention,
                                   tie_sides)
from harness.verify.layers import scaled_diff

def _diff(got, want, band=None) -> tuple[float, float]:
    """Scaled differences of value and gradient; inf where the target is not finite and the reference is. With
    ``band`` ((low value, low gradient), (high value, high gradient)), the distance from it: at a tie, either
    one-sided limit and anything between them (torch.min's half split) agrees."""
    def one(a, b, low=None, high=None):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if not np.array_equal(np.isfinite(a), np.isfinite(b)):
            return float("inf")
        a, b = np.nan_to_num(a), np.nan_to_num(b)
        if low is not None:
            b = np.clip(a, np.nan_to_num(low), np.nan_to_num(high))
        return scaled_diff(a, b)
    low, high = band or ((None, None), (None, None))
    return (one(got[0], want[0], low[0], high[0]),
            0.0 if got[1] is None or want[1] is None else one(got[1], want[1], low[1], high[1]))


def _expect(check: Check, conv: Convention, used: Batch):
    """The convention's (value, gradient) on ``used`` and, where a token sits at one of its bounds within the
    check's tolerance, the band that a tie-break may give there (None elsewhere): between the one-sided limits,
    and, for the gradient at the tied tokens, between them and 0 (the gradient of the clipped surrogate, which
    torch.min of two equal values averages in). Each tie may fall on its own side (a float tie falls either way
    tie by tie): where the value jumps at a bound (DPPO's mask, MIS), the value's band adds up each tie's jump
    (``_value_band``), and rows tied on a rollout band are taken in their combinations (``_row_sides``)."""
    from harness.conform.targets.reference import per_row_ratio
    want = conv.fn(used)
    sides, at = tie_sides(conv.ties, used, check.tolerance, per_row=per_row_ratio(conv))
    if not sides:
        return want, None
    values = [conv.fn(side) for side in sides]
    rows = _row_sides(conv, used, sides, want)
    every = [want, *values, *rows]
    stack = lambda k, pick: pick([np.asarray(w[k], dtype=float) for w in every], axis=0)  # noqa: E731
    value_band = (stack(0, np.min), stack(0, np.max)) if rows else _value_band(check, conv, used, want, values, at)
    if want[1] is None or any(w[1] is None for w in every):
        return want, ((value_band[0], None), (value_band[1], None))
    low, high = stack(1, np.min), stack(1, np.max)
    return want, ((value_band[0], np.where(at, np.minimum(low, 0.0), low)),
                  (value_band[1], np.where(at, np.maximum(high, 0.0), high)))


def _row_sides(conv: Convention, used: Batch, sides: list, want) -> list:
    """For rows tied on a rollout band (seq_mis, seq_rs, geo_rs): the convention's (value, gradient) with each tied
    row's rollout log-probs on either side, in every combination (a row's side may change every other row's part,
    as in a mean over the rows kept); past 2^ROW_TIES combinations (cases.ROW_TIES: more rows than the ties family
    places), each row moved alone, and the reference's value plus the sums of their jumps down and up (the rows'
    parts then add up). [] without such ties."""
    if "rollout_row" not in (conv.ties or {}):
        return []
    versions = {s.extra["rollout_logp"].tobytes(): s.extra["rollout_logp"] for s in sides
                if "rollout_logp" in s.extra and s.extra["rollout_logp"] is not used.extra.get("rollout_logp")}
    versions = list(versions.values())
    tied = np.flatnonzero(np.any([(v != used.extra["rollout_logp"]).any(1) for v in versions], axis=0)) \
        if versions else []
    if not len(tied):
        return []

    def moved(choice):
        out = replace(used, extra=dict(used.extra))
        out.extra["rollout_logp"] = used.extra["rollout_logp"].copy()
        for i, k in choice:
            out.extra["rollout_logp"][i] = versions[k][i]
        return conv.fn(out)
    if len(versions) ** len(tied) <= 2 ** ROW_TIES:
        return [moved(zip(tied, c)) for c in itertools.product(range(len(versions)), repeat=len(tied))]
    alone = [moved([(i, k)]) for i in tied for k in range(len(versions))]
    jumps = np.array([float(v[0]) - float(want[0]) for v in alone]).reshape(len(tied), len(versions))
    low, high = np.minimum(jumps.min(1), 0.0).sum(), np.maximum(jumps.max(1), 0.0).sum()
    return alone + [(float(want[0]) + low, want[1]), (float(want[0]) + high, want[1])]


def _value_band(check: Check, conv: Convention, used: Batch, want, values: list, at) -> tuple:
    """The loss values a tie-break may give: between the one-sided limits where the value is continuous at the
    bounds; where it jumps, for a loss linear in logp (DPPO, CISPO, VESPO, GPG: value sum_t g_t logp_t, g its
    gradient, or its surrogate sum_t g_t; Convention.linear), the reference's value plus each tie's jump (a token's,
    or a row's for a sequence ratio) in either direction that its other side gives, each tie on its own side."""
    from harness.conform.targets.reference import per_row_ratio
    ends = [np.asarray(v[0], dtype=float) for v in values]
    plain = (np.min([want[0], *ends], axis=0), np.max([want[0], *ends], axis=0))
    if np.ndim(want[0]) != 0 or not conv.linear or want[1] is None:
        return plain
    value = float(want[0])
    if all(abs(float(e) - value) <= check.tolerance * max(1.0, abs(value)) for e in ends):
        return plain
    factor = used.logp if conv.linear == "logp" else 1.0  # the value: sum_t g_t logp_t, or sum_t g_t
    jumps = [(np.asarray(v[1], dtype=float) - want[1]) * factor * at for v in values]
    jumps = [j.sum(1) if per_row_ratio(conv) else j for j in jumps]
    down = np.minimum.reduce([np.minimum(j, 0.0) for j in jumps]).sum()
    up = np.maximum.reduce([np.maximum(j, 0.0) for j in jumps]).sum()
    return min(plain[0], value + down), max(plain[1], value + up)


def _differs(check: Check, batch: Batch, conv: Convention) -> bool:
    try:
        value, grad, used = check.run(batch)
        d = _diff((value, grad), *_expect(check, conv, used))
    except Exception:  # noqa: BLE001 (the target is outside code and may raise anything)
        return False
    return max(d) > check.tolerance


def _raises(check: Check, batch: Batch) -> str | None:
    """The target's error on ``batch`` as one line, or None."""
    try:
        check.run(batch)
    except Exception as exc:  # noqa: BLE001 (the target is outside code and may raise anything)
        return error_line(exc)
    return None


def _non_finite(check: Check, batch: Batch) -> bool:
    try:
        value, grad, _ = check.run(batch)
    except Exception:  # noqa: BLE001 (the target is outside code and may raise anything)
        return False
    return not _finite(value, grad)


def _non_finite_text(runs: list) -> str:
    """``NaN`` or ``inf``, in the value, the gradient or both, over the cases (batch, used, value, grad)."""
    bad = lambda x: x is not None and not np.isfinite(np.asarray(x, dtype=float)).all()  # noqa: E731
    nan = any(np.isnan(np.asarray(x, dtype=float)).any() for _, _, v, g in runs for x in (v, g) if x is not None)
    where = [w for w, k in (("value", 2), ("gradient", 3)) if any(bad(r[k]) for r in runs)]
    return f"{'NaN' if nan else 'inf'} in the {' and the '.join(where)}"


def _finite(value, grad) -> bool:
    return bool(np.isfinite(np.asarray(value, dtype=float)).all()
                and (grad is None or np.isfinite(np.asarray(grad, dtype=float)).all()))


def error_line(exc: BaseException) -> str:
    """``Type: message (at file:line)`` on one line; a worker's error comes with its own place already."""
    from harness.conform.targets.remote import TargetError
    if isinstance(exc, TargetError):
        return str(exc).split(": ", 1)[-1].splitlines()[0][:200]
    frames = traceback.extract_tb(exc.__traceback__)
    place = getattr(exc, "where", None) or (f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}"
                                            if frames else "")
    where = f" (at {place})" if place else ""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0][:160] if message else ''}{where}"


def shrink(check: Check, batch: Batch, conv: Convention, budget: int = 300, agree: Convention | None = None) -> Batch:
    """Fewest groups, rows, columns and unmasked tokens (then simplest values) on which target and ``conv`` differ
    (and, given ``agree``, target and ``agree`` do not)."""
    return _shrink(batch, lambda b: _differs(check, b, conv) and (agree is None or not _differs(check, b, agree)),
                   budget)


def _shrink(batch: Batch, keeps: Callable[[Batch], bool], budget: int = 300) -> Batch:
    """The smallest batch derived from ``batch`` (groups, responses, columns, tokens removed; numbers rounded) on
    which ``keeps`` still holds."""
    calls = [0]

    def still(b, limit=budget):  # never down to a batch without tokens: those are reported apart
        calls[0] += 1
        return b.mask.sum() > 0 and calls[0] <= limit and keeps(b)

    for r in range(len(batch.mask)):  # most findings show on one response: try each alone first
        single = batch.take(rows=[r], group_size=1)
        if len(batch.mask) > 1 and still(single):
            batch = single
            break
    changed = True
    while changed and calls[0] < budget:
        changed = False
        g, n_rows = batch.group_size, len(batch.mask)
        tries = []
        for k in range(n_rows // g):  # drop a group
            if n_rows > g:
                tries.append(lambda b, k=k: b.take(rows=[r for r in range(len(b.mask)) if r // g != k]))
        for j in range(g):  # drop the j-th response of every group
            if g > 1:
                tries.append(lambda b, j=j: b.take(rows=[r for r in range(len(b.mask)) if r % g != j],
                                                   group_size=g - 1))
        for t in range(batch.max_len):  # drop a column
            if batch.max_len > 1:
                tries.append(lambda b, t=t: b.take(cols=[c for c in range(b.max_len) if c != t]))
        for i, t in zip(*np.nonzero(batch.mask)):  # mask a token out
            tries.append(lambda b, i=i, t=t: replace(b, mask=_unset(b.mask, i, t)))
        for attempt in tries:
            smaller = attempt(batch)
            if still(smaller):
                batch, changed = smaller, True
                break
    for digits in (0, 1, 2):  # simpler numbers, whole arrays at a time
        for name in ("adv", "logp", "old_logp", "ref_logp"):
            simpler = replace(batch, **{name: np.round(getattr(batch, name), digits)})
            if name == "logp":  # keep the log-ratio where it was: round the old log-probs with it
                simpler = replace(simpler, old_logp=simpler.logp - (batch.logp - batch.old_logp).round(digits))
            if not np.array_equal(getattr(simpler, name), getattr(batch, name)) and still(simpler, budget + 12):
                batch = simpler
    return batch


def _unset(mask, i, t):
    out = mask.copy()
    out[i, t] = 0.0
    return out


def run_check(check: Check, seeds: int = 30) -> list[dict]:
    """One record per case family (see ``_run_family``): ``seeds`` batches each, a share of them for the families
    of SEED_SHARE."""
    seen = _Seen()
    return [_run_family(check, family, max(1, seeds // SEED_SHARE.get(family, 1)), seen)
            for family in check.families]


@dataclass
class _Seen:
    """What a check's earlier families found: the minimal input of each finding (not shrunk again) and the
    conventions matched (preferred again where they still match)."""

    minimal: dict = field(default_factory=dict)
    matched: list = field(default_factory=list)


def _run_family(check: Check, family: str, seeds: int, seen: _Seen | None = None) -> dict:
    """The record of one check on one case family: what was called (algorithm, call, knob, family, reference,
    note, reads), ``cases`` compared, ``loss_diff`` and ``grad_diff`` (largest scaled differences from the
    reference), the conventions it ``matches`` (and ``value_matches``, ``grad_matches``), ``target_errors``,
    and the verdict: ``kind`` ("agrees", "differs", "raises", or "no reference" for a check without one) and
    ``findings``, each a dict ``{"name", "max_err", "cases", "of", "family", "minimal_input"}`` (``max_err`` None
    for a raise; ``minimal_input`` from ``_describe``)."""
    row = {"algorithm": check.algorithm, "call": check.call, "knob": check.knob, "family": family,
           "tolerance": check.tolerance, "reference": check.reference.label if check.reference else None,
           "note": check.note,
           "reads": check.reads, "loss_diff": None, "grad_diff": None, "matches": []}
    runs, raised, empty = [], {}, None
    for seed in range(seeds):
        batch = check.batch(seed, family)
        try:
            value, grad, used = check.run(batch)
        except Exception as exc:  # noqa: BLE001 (the target is outside code and may raise anything)
            raised.setdefault(error_line(exc), []).append(batch)
            continue
        if batch.mask.sum() == 0:  # a batch without tokens is reported apart: it would hide every other match
            empty = empty or (used, value)
            continue
        if check.reference is not None and not _representable(check, used):
            row["out_of_range"] = row.get("out_of_range", 0) + 1
            continue
        runs.append((batch, used, value, grad))
    row["cases"], row["target_errors"] = len(runs), sorted(raised)
    seen = seen or _Seen()
    findings = [_raise_finding(check, family, seeds, message, batches, seen) for message, batches in raised.items()]
    if empty is not None and check.reference is not None:
        findings += _empty_finding(check, family, *empty)
    if runs and check.reference is None:
        row.update(_match_labels(_matches(check, _Cases(check, runs))))
    elif runs:
        findings += _differences(check, family, seeds, runs, row, seen)
    row["findings"] = findings
    row["kind"] = ("raises" if raised else "differs" if findings else
                   "no reference" if check.reference is None else "agrees")
    return row


def _representable(check: Check, used: Batch) -> bool:
    """Whether the reference's value and gradient on ``used`` fit in the dtype the target computes in (a float32
    loss cannot give exp(100) = 2.7e43): a case past its range is not compared."""
    if check.dtype == "float64":
        return True
    import torch
    top = torch.finfo(getattr(torch, check.dtype)).max
    return all(x is None or np.all(np.abs(np.asarray(x, dtype=float)) <= top) for x in check.reference.fn(used))


def _raise_finding(check: Check, family: str, seeds: int, message: str, batches: list, seen: _Seen) -> dict:
    """A raise: how often, and the smallest batch on which the target still raises the same error."""
    if message not in seen.minimal:
        small = _shrink(batches[0], lambda b: _raises(check, b) == message)
        seen.minimal[message] = {"rows": int(len(small.mask)), "tokens": int(small.mask.sum()),
                                 "input": small.to_json(), "error": message}
    return {"name": f"raises {message} on {len(batches)} of {seeds} cases", "max_err": None,
            "cases": len(batches), "of": seeds, "family": family, "minimal_input": seen.minimal[message],
            "accept": [[f"raises={message.split(':')[0].split()[0]}"]]}


def _empty_finding(check: Check, family: str, used: Batch, value) -> list:
    """What the target returns on a batch whose mask is all zero, where the reference's loss is 0."""
    want = check.reference.fn(used)[0]
    err = max(_diff((value, None), (want, None)))
    if err <= check.tolerance:
        return []
    got = _short(value)
    return [{"name": f"returns {got} on a batch without tokens (the reference gives {_short(want)})",
             "max_err": err, "cases": 1, "of": 1, "family": family,
             "accept": [[f"empty_batch={got.lstrip('-') if got.lstrip('-') in ('nan', 'inf') else 'value'}"]],
             "minimal_input": {"rows": int(len(used.mask)), "tokens": 0, "input": used.to_json(),
                               "target": _plain(value), "reference": _plain(want)}}]


def _short(x) -> str:
    arr = np.asarray(x, dtype=float)
    return f"{float(arr):.4g}" if arr.ndim == 0 else "values"


class _Cases:
    """The compared cases of one family, (batch, batch used, value, gradient) each, and the scaled differences of
    the target from each convention (at ties: from the band between its one-sided limits), computed once per
    convention and case."""

    def __init__(self, check: Check, runs: list):
        self.check, self.runs, self._memo = check, runs, {}

    def expected(self, conv: Convention, k: int):
        """The convention's (value, gradient) on case ``k`` and its band at ties (``_expect``), computed once."""
        key = (id(conv), k)
        if key not in self._memo:  # the convention is kept with its numbers: its id stays its own
            self._memo[key] = (conv, *_expect(self.check, conv, self.runs[k][1]))
        return self._memo[key][1:]

    def diff(self, conv: Convention, k: int) -> tuple[float, float]:
        _, _, value, grad = self.runs[k]
        return _diff((value, grad), *self.expected(conv, k))

    def strict(self, conv: Convention, k: int) -> tuple[float, float]:
        """As ``diff``, with the convention's own tie-break (its value at the tie) instead of the band."""
        _, _, value, grad = self.runs[k]
        return _diff((value, grad), self.expected(conv, k)[0])

    def worst(self, conv: Convention) -> float:
        return max(max(self.diff(conv, k)) for k in range(len(self.runs)))


def _differences(check: Check, family: str, seeds: int, runs: list, row: dict, seen: _Seen) -> list:
    """Findings against the reference: non-finite results apart, then what the rest matches instead, split into
    one finding per change (a clamp apart from the convention it clamps)."""
    cases, findings = _Cases(check, runs), []
    diffs = [cases.diff(check.reference, k) for k in range(len(runs))]
    row["loss_diff"], row["grad_diff"] = max(d[0] for d in diffs), max(d[1] for d in diffs)
    bad_finite = [r for r, d in zip(runs, diffs) if not _finite(r[2], r[3]) and max(d) == float("inf")]
    if bad_finite:
        what = _non_finite_text(bad_finite)
        if what not in seen.minimal:
            seen.minimal[what] = _describe(check, _shrink(bad_finite[0][0], lambda b: _non_finite(check, b)))
        findings.append({"name": f"returns {what} where the reference is finite, on {len(bad_finite)} of {seeds} "
                                 "cases", "max_err": float("inf"), "cases": len(bad_finite), "of": seeds,
                         "family": family, "minimal_input": seen.minimal[what],
                         "accept": [[f"non_finite={'nan' if what.startswith('NaN') else 'inf'}"]]})
        cases = _Cases(check, [r for r in runs if not any(r is b for b in bad_finite)])
    if not cases.runs or cases.worst(check.reference) <= check.tolerance:
        tie_break = cases.runs and _tie_break(check, cases)
        if tie_break:
            row["tie_break"] = tie_break
        return findings
    full, value_only, grad_only = _matches(check, cases)
    row.update(_match_labels((full, value_only, grad_only)))
    if not full:
        near_family = [c for c in value_only + grad_only if in_family(check, c)]
        hints = [f"{what} matches {', '.join(_label(c) for c in found if c in near_family)}"
                 for what, found in (("value", value_only), ("gradient", grad_only))
                 if any(c in near_family for c in found)]
        name = "matches none of the reference's conventions" + "".join(f"; {h}" for h in hints)
        near = (near_family + [check.reference])[0]  # the minimal input shows what even it misses
        return findings + [_finding(check, family, seeds, name, cases, near, seen)]
    best = min(full, key=lambda c: c.label not in seen.matched)  # as on an earlier family, if it still matches
    seen.matched.append(best.label)
    if best.base is None:
        return findings + [_finding(check, family, seeds, f"matches {_label(best)}", cases, check.reference, seen,
                                    accept=_accepting(check, [c for c in full if c.base is None]))]
    findings.append(_finding(check, family, seeds, best.part, cases, best.base, seen,
                             accept=_accepting_part(best.part)))
    if best.base.label != check.reference.label:
        base = _finding(check, family, seeds, f"matches {_label(best.base)}", cases, check.reference, seen,
                        agree=best.base, accept=_accepting(check, [best.base]))
        findings += [base] if base else []
    return findings


def _tie_break(check: Check, cases: _Cases) -> str | None:
    """How the target breaks the reference's ties, where it agrees with the reference's band and not with the
    reference's own choice at the tie (the unclipped branch, or the weight kept, wins): a tie-break convention."""
    split = other = False
    for k in range(len(cases.runs)):
        if max(cases.strict(check.reference, k)) <= check.tolerance:
            continue
        grad = cases.runs[k][3]
        want, band = cases.expected(check.reference, k)
        if band is None or grad is None or band[0][1] is None:
            continue
        grad, off = np.asarray(grad, dtype=float), np.abs(np.asarray(grad) - want[1]) > check.tolerance
        at_side = np.minimum(np.abs(grad - band[0][1]), np.abs(grad - band[1][1])) <= check.tolerance
        other |= bool((off & at_side).any())
        split |= bool((off & ~at_side).any())
    if not (split or other):
        return None
    how = " and ".join(w for w, on in (("takes the other branch", other), ("splits the gradient between the two "
                                                                          "branches (as torch.min does between "
                                                                          "equal values)", split)) if on)
    return (f"at exact ties on its bounds it {how}, where the reference's unclipped branch (or kept weight) wins: "
            "a tie-break convention, within the one-sided limits")


def _finding(check: Check, family: str, seeds: int, name: str, cases: _Cases, against: Convention, seen: _Seen,
             agree: Convention | None = None, accept: list | None = None) -> dict | None:
    """A finding: the cases on which the target differs from ``against`` (and agrees with ``agree``), the largest
    difference, the smallest input that shows it and ``accept``, the --accept items that let it pass (any one
    list of them, all its items; absent where it can only be baselined); None when no case shows it alone."""
    errs = []
    for k in range(len(cases.runs)):
        err = max(cases.diff(against, k))
        if err > check.tolerance and (agree is None or max(cases.diff(agree, k)) <= check.tolerance):
            errs.append((err, k))
    if not errs:
        return None
    if name not in seen.minimal:
        small = shrink(check, cases.runs[max(errs)[1]][0], against, agree=agree)
        seen.minimal[name] = _describe(check, small, against)
    return {"name": name, "max_err": max(errs)[0], "cases": len(errs), "of": seeds, "family": family,
            "minimal_input": seen.minimal[name], **({"accept": accept} if accept else {})}


def _describe(check: Check, batch: Batch, against: Convention | None = None) -> dict:
    """The minimal input: its size and arrays, the target's value (and gradient) and the reference's; when the
    finding is against another convention (a clamp found on top of it), that convention's too."""
    value, grad, used = check.run(batch)
    want = check.reference.fn(used)
    out = {"rows": int(len(used.mask)), "tokens": int(used.mask.sum()), "input": used.to_json(),
           "target": _plain(value), "reference": _plain(want[0])}
    if grad is not None and want[1] is not None:
        out["target_grad"], out["reference_grad"] = _plain(grad), _plain(want[1])
        out["grad_differs"] = _grad_differs(check, used, grad, *_expect(check, against or check.reference, used))
    if against is not None and against.label != check.reference.label:
        other = against.fn(used)
        out["compared_with"] = {"label": _label(against), "value": _plain(other[0])}
        if other[1] is not None:
            out["compared_with"]["grad"] = _plain(other[1])
    if check.exact is not None:
        out["reference_exact"] = _plain(check.exact(used))
    return out


def _grad_differs(check: Check, used: Batch, grad, want, band, most: int = 3) -> list[dict]:
    """The gradient's elements that differ from the convention (outside the band between its one-sided limits,
    at a tie), largest first: row, token, both values and the region in words."""
    from harness.conform.targets.reference import region
    grad, ref_grad = np.asarray(grad, dtype=float), np.asarray(want[1], dtype=float)
    nearest = ref_grad if band is None or band[0][1] is None else np.clip(grad, band[0][1], band[1][1])
    gap = np.abs(np.nan_to_num(grad - nearest, nan=np.inf))
    gap[~(gap > check.tolerance * max(1.0, float(np.abs(ref_grad).max(initial=0.0))))] = -1.0
    out = []
    for flat in np.argsort(-gap, axis=None)[:most]:
        i, t = (int(x) for x in np.unravel_index(flat, gap.shape))
        if gap[i, t] < 0:
            break
        text = region(check.reference, used, i, t, float(grad[i, t]), float(ref_grad[i, t]))
        out.append({"row": i, "token": t, "target": float(grad[i, t]), "reference": float(ref_grad[i, t]),
                    **({"region": text} if text else {})})
    return out


def _plain(x):
    arr = np.asarray(x, dtype=float)
    return float(arr) if arr.ndim == 0 else np.round(arr, 12).tolist()


def _candidates(check: Check) -> list[Convention]:
    """The clamp, cap and floor variants (targets.reference.VARIANTS) of the reference and of each candidate."""
    from harness.conform.targets.reference import VARIANTS
    convs = ([check.reference] if check.reference else []) + list(check.candidates)
    return [v for c in convs for make in VARIANTS if (v := make(c)) is not None]


def _matches(check: Check, cases: _Cases) -> tuple[list, list, list]:
    """The candidate conventions that reproduce the target on every case: value and gradient, value only, gradient
    only; the clamp variants are tried (for both) when no plain candidate reproduces both."""
    full, value_only, grad_only = _match(check, cases, check.candidates)
    return (full or _match(check, cases, _candidates(check))[0]), value_only, grad_only


def _match(check: Check, cases: _Cases, candidates) -> tuple[list, list, list]:
    full, value_only, grad_only = [], [], []
    has_grad = all(g is not None for _, _, _, g in cases.runs)
    for conv in candidates:
        ok_val, ok_grad = True, has_grad
        try:
            for k in range(len(cases.runs)):  # stop at the first case on which neither value nor gradient matches
                d = cases.diff(conv, k)
                ok_val, ok_grad = ok_val and d[0] <= check.tolerance, ok_grad and d[1] <= check.tolerance
                if not (ok_val or ok_grad):
                    break
        except ValueError:
            continue
        if ok_val and (ok_grad or not has_grad):
            full.append(conv)
        elif ok_val:
            value_only.append(conv)
        elif ok_grad:
            grad_only.append(conv)
    return full, value_only, grad_only


def _label(conv: Convention) -> str:
    return conv.label if conv.named else conv.label + " (not a reference convention)"


def _match_labels(matched) -> dict:
    full, value_only, grad_only = matched
    return {"matches": [_label(c) for c in full], "value_matches": [_label(c) for c in value_only],
            "grad_matches": [_label(c) for c in grad_only]}


def conform(target, seeds: int = 30, only: Callable[[Check], bool] | None = None, adapter=None) -> dict:
    """Run every check of ``target`` (a framework name, module:function, a Python function computing a policy loss,
    or a target object) and return the report."""
    import torch
    check_seeds(seeds)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is an order of magnitude faster on shared cores
    tgt = None
    try:
        with torch.enable_grad():  # the reference's gradients, even under the caller's torch.no_grad()
            tgt = target_of(target, adapter)
            checks = [c for c in tgt.checks() if only is None or only(c)]
            rows = [row for check in checks for row in run_check(check, seeds)]
    finally:
        torch.set_num_threads(threads)
        if hasattr(tgt, "close"):  # a target's worker process ends with its report
            tgt.close()
    return {"target": tgt.name, "versions": tgt.versions,
            "tolerance": getattr(tgt, "tolerance", None) or max((c.tolerance for c in checks), default=TOLERANCE),
            "seeds": seeds,
            "how": tgt.how, "rows": rows}


def _tolerances(report) -> str:
    """The tolerance the report's checks are held to: one number, or each dtype's where the checks differ."""
    tolerances = sorted({r["tolerance"] for r in report["rows"]} or {report["tolerance"]})
    if len(tolerances) == 1:
        return f"{tolerances[0]:g}"
    return "the tolerance of the dtype the check runs in (" + ", ".join(f"{t:g}" for t in tolerances) + ")"


def check_seeds(seeds) -> None:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds: expected a positive integer (generated batches per check and family), got {seeds!r}")


def target_of(target, adapter=None):
    """A target object: ``target`` itself if it is one, a framework's or module:function's by name, or a Python
    function's (with ``adapter`` a dict or key=value text)."""
    if hasattr(target, "checks"):
        return target
    if isinstance(target, str):
        from harness.conform.targets import load_target
        return load_target(target, adapter)
    from harness.conform.targets.callable import CallableTarget
    return CallableTarget(target, adapter)


#: How severe each kind of verdict is: a cell or a check shows its worst.
KIND_RANK = {"agrees": 0, "no reference": 1, "differs": 2, "raises": 3}


def check_records(report: dict) -> list[dict]:
    """One record per check (its family rows merged): algorithm, call, knob, reference, the worst ``kind`` and every
    distinct ``findings`` entry (the same name on several families once, with those families in ``families``)."""
    records = {}
    for row in report["rows"]:
        key = (row["algorithm"], row["call"], row["knob"])
        rec = records.setdefault(key, {"algorithm": row["algorithm"], "call": row["call"], "knob": row["knob"],
                                       "reference": row["reference"], "kind": row["kind"], "findings": []})
        if KIND_RANK[row["kind"]] > KIND_RANK[rec["kind"]]:
            rec["kind"] = row["kind"]
        for f in row["findings"]:
            same = next((g for g in rec["findings"] if g["name"] == f["name"]), None)
            if same is None:
                rec["findings"].append({**f, "families": [f["family"]]})
            else:
                same["families"].append(f["family"])
    return list(records.values())


def verdict(row: dict, findings: list | None = None) -> str:
    """One line: the kind, then the name of every finding (or of ``findings``): what the target matches instead,
    clamps, raises."""
    if row["kind"] == "raises" and not row["cases"] and findings is None:
        return "target raised on every case: " + "; ".join(row["target_errors"])
    names = [f["name"] for f in (row["findings"] if findings is None else findings)]
    names += [f"tie-break: {row['tie_break']}"] if row.get("tie_break") else []
    if row["kind"] == "no reference":
        names = names or ["matches " + ", ".join(row["matches"]) if row.get("matches") else
                          "matches none of the reference's conventions"]
    return "; ".join([row["kind"], *names])


def diff_anchor(index: int) -> str:
    """The HTML anchor of a report page's ``index``-th finding (the matrix links to it)."""
    return f"diff-{index}"


def markdown(report: dict) -> str:
    """The report as commit-ready markdown: a summary table, then each finding with its minimal input."""
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    families = sorted({r["family"] for r in report["rows"]}, key=list(FAMILY_TEXT).index)
    lines = [f"# Conformance: {report['target']}", "", f"Versions: {versions}. {report['how']}", "",
             f"Each check runs {report['seeds']} generated batches per family: "
             + "; ".join(f"{f}: {FAMILY_TEXT[f]}" for f in families) + ". A batch whose mask is all zero is "
             "compared apart. "
             f"Agreement means max |target - reference| / max(1, |reference|) <= {_tolerances(report)} for the "
             "loss (or values) and for its gradient. A target that raises is never dropped: its error is a "
             "finding of its own.", "",
             "| algorithm | target call | knob | family | cases | max loss diff | max grad diff | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
    index = 0
    for r in report["rows"]:
        links = []
        for f in r["findings"]:
            links.append(f"[{f['name']}](#{diff_anchor(index)})")
            index += 1
        text = "; ".join([r["kind"], *links]) if links else verdict(r)
        lines.append(f"| {r['algorithm']} | `{r['call']}` | {r['knob']} | {r['family']} | {r['cases']} | "
                     f"{fmt(r.get('loss_diff'))} | {fmt(r.get('grad_diff'))} | {text.replace('|', '/')} |")
    if index:
        lines += ["", "## Findings and their minimal inputs", ""]
    index, first = 0, {}
    for r in report["rows"]:
        for f in r["findings"]:
            counted = f["name"].endswith(" cases") or f["max_err"] is None
            size = "" if f["max_err"] is None else f"largest difference {float(f['max_err']):.3g}"
            size += "" if counted else f", on {f['cases']} of {f['of']} cases"
            shown = first.setdefault(json.dumps(strict_json(f["minimal_input"]), sort_keys=True), index)
            lines += [f'<a id="{diff_anchor(index)}"></a>', "",
                      f"### {index}. {r['algorithm']}: `{r['call']}`, {r['knob']} ({r['family']})", "",
                      f"{r['kind'].capitalize()}: {f['name']}" + (f" ({size})" if size else "") + ".",
                      *([r["note"]] if r["note"] else []), "",
                      *(finding_lines(f["minimal_input"], r["reads"]) if shown == index else
                        [f"Minimal input: the one of [finding {shown}](#{diff_anchor(shown)})."]), ""]
            index += 1
    return "\n".join(lines) + "\n"


def finding_lines(m: dict, reads: str) -> list[str]:
    """A finding's minimal input as markdown lines."""
    lines = [f"Minimal input ({m['rows']} rows, {m['tokens']} tokens; the check reads {reads}): "
             f"`{json.dumps(strict_json(m['input']))}`", ""]
    if "error" in m:
        return lines + [f"- target raises: `{m['error']}`"]
    lines += [f"- target: `{json.dumps(strict_json(m['target']))}`",
              f"- reference: `{json.dumps(strict_json(m['reference']))}`"]
    if "reference_exact" in m:
        lines.append(f"- reference, exact (sympy): `{json.dumps(strict_json(m['reference_exact']))}`")
    if "compared_with" in m:
        lines.append(f"- {m['compared_with']['label']}: `{json.dumps(strict_json(m['compared_with']['value']))}`")
    if "target_grad" in m:
        lines += [f"- target gradient: `{json.dumps(strict_json(m['target_grad']))}`",
                  f"- reference gradient: `{json.dumps(strict_json(m['reference_grad']))}`"]
        lines += [f"- gradient differs at {_element_text(e)}" for e in m.get("grad_differs", ())]
        if "grad" in m.get("compared_with", {}):
            lines.append(f"- {m['compared_with']['label']}, gradient: "
                         f"`{json.dumps(strict_json(m['compared_with']['grad']))}`")
    return lines


def _element_text(e: dict) -> str:
    """One differing gradient element in words: where, both values, and its region."""
    return (f"row {e['row']}, token {e['token']}: target {e['target']:.6g}, reference {e['reference']:.6g}"
            + (f" ({e['region']})" if e.get("region") else ""))


def strict_json(obj):
    """The report with non-finite numbers written as strings ("inf", "nan"), so that any JSON reader takes it."""
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def file_stem(target: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in target)


def write_report(report: dict, out: str | Path) -> None:
    """``<out>/<target>.md`` and ``.json``, each written atomically."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = file_stem(report["target"])
    write_text(folder / f"{stem}.md", markdown(report))
    write_text(folder / f"{stem}.json", json.dumps(strict_json(report), indent=1, sort_keys=True) + "\n")


# ---- the command: verdict kinds, accepted conventions, console lines, exit code ------------------------------------

#: Verdict kinds that fail ``cliplab conform`` (exit 1) and ``assert_conforms``. The others: agrees, accepted
#: (differs, and matches a convention the user accepts), not implemented, no reference (nothing claimed).
FAILING = ("differs", "raises")
CHOICES = {"agg": tuple(AGG_MODES), "kl": KL_KINDS, "cap_mode": CAP_MODES,
           "rollout_correction": (*ROLLOUT_CORRECTIONS, "None"), "empty_rows": ("counted",),
           "non_finite": ("nan", "inf"), "empty_batch": ("nan", "inf", "value"), "rejected_rows": ("dropped",),
           "value": ("surrogate",)}
#: The other forms of a loss (targets.reference.VARIANTS) that are not numbers, by their --accept item and the words
#: that name them in findings.
FORMS = {"rejected_rows=dropped": "leaves the rejected rows out of the loss mask", "value=surrogate": "takes the "
         "surrogate"}
#: The clamps, caps and floors (targets.reference.VARIANTS), by their name in --accept and in findings' words.
CLAMPS = {"log_ratio_clamp": re.compile(r"clamps the log-ratio at \+-(\S+) "),
          "seq_log_ratio_cap": re.compile(r"caps the log of the sequence ratio at (\S+) "),
          "k3_cap": re.compile(r"caps each token's k3 term at (\S+) "),
          "ratio_truncation": re.compile(r"truncates the ratio in its weight at (\S+) ")}
NUMERIC = (*(k for k in HPARAMS if k not in CHOICES and k != "cov_seed"), *CLAMPS)
EXCEPTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def minimal_of(row: dict) -> dict | None:
    """The minimal input of a row's first finding that has values to compare (not a raise)."""
    return next((f["minimal_input"] for f in row["findings"] if "target" in f["minimal_input"]), None)


def parse_accept(entries) -> dict:
    """``--accept`` entries: KEY=VALUE items (comma-separated), or files of them, one a line, ``#`` comments;
    -> {key: {values}}. An entry that names no known convention is a ValueError listing the known ones."""
    items = []
    for entry in entries or ():
        if "=" in entry:
            items += entry.split(",")
            continue
        try:
            items += [line.split("#")[0] for line in Path(entry).read_text().splitlines()]
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"accept: {entry!r} is neither KEY=VALUE nor a readable file of them "
                             f"({getattr(exc, 'strerror', None) or exc})") from None
    accepted = {}
    for item in filter(None, (i.strip() for i in items)):
        key, _, value = (x.strip() for x in item.partition("="))
        if not (value in CHOICES.get(key, ()) or key in NUMERIC and isinstance(_setting(value), (float, type(None)))
                or key == "raises" and EXCEPTION.fullmatch(value)):
            known = [f"{k}={v}" for k, values in CHOICES.items() for v in values]
            raise ValueError(f"accept: {item!r} names no known convention; known: {', '.join(known)}, "
                             f"raises=EXCEPTION, or KEY=NUMBER for {', '.join(NUMERIC)}")
        accepted.setdefault(key, set()).add(_setting(value))
    return accepted


def _setting(text: str):
    """A setting's value as labels write it: a finite number, None, or a name (nan and inf among them)."""
    if text == "None":
        return None
    try:
        number = float(text)
    except ValueError:
        return text
    return number if np.isfinite(number) else text


def _accepting(check: Check, convs) -> list:
    """The --accept items that let a target matching one of ``convs`` pass: for each policy convention of the
    reference's algorithm, the settings that either reads and in which they differ (``empty_rows=counted`` for
    empty rows counted in a mean over sequences); a convention of another algorithm or kind gives none."""
    ref = check.reference.policy if check.reference is not None else None
    out = []
    for conv in convs:
        if conv.policy is None or ref is None or conv.policy[0] != ref[0]:
            continue
        alg = get_algorithm(ref[0])
        got, want = {**alg.defaults, **conv.policy[1]}, {**alg.defaults, **ref[1]}
        items = [f"{k}={_text(got.get(k))}" for k in sorted(set(alg.reads(got)) | set(alg.reads(want)))
                 if got.get(k) != want.get(k)]
        items += ["empty_rows=counted"] if conv.policy[2] and not ref[2] else []
        out.append(items)
    return [items for items in out if items]


def _text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _accepting_part(part: str) -> list:
    """The --accept item of a clamp, cap or floor found on top of a convention (e.g. log_ratio_clamp=20), or of
    another form of it (FORMS, e.g. rejected_rows=dropped)."""
    return ([[f"{key}={found[1]}"] for key, pattern in CLAMPS.items() if (found := pattern.match(part))]
            + [[item] for item, words in FORMS.items() if part.startswith(words)])


def accepted_by(finding: dict, accepted: dict) -> str | None:
    """The --accept items (as text) that let ``finding`` pass, or None."""
    for items in finding.get("accept") or ():
        if all(_setting(v) in accepted.get(k, ()) for k, _, v in (i.partition("=") for i in items)):
            return ",".join(items)
    return None


def in_family(check: Check, conv: Convention) -> bool:
    """Whether ``conv`` is in the family of the check's reference algorithm (targets.reference.FAMILIES); a
    convention that is not a policy loss's (an aggregation, a KL estimator) is compared within its own kind."""
    from harness.conform.targets.reference import family_of
    mine = check.reference.policy if check.reference is not None else None
    return mine is None or conv.policy is None or family_of(conv.policy[0]) == family_of(mine[0])


def closest(check: Check, minimal: dict) -> str | None:
    """The known convention of the reference's family nearest to the target on a minimal input, with the largest
    scaled difference there; "none close" when the reference itself is nearest."""
    data = dict(minimal["input"])
    group_size = data.pop("group_size")
    arrays = {k: np.asarray(v, dtype=float) for k, v in data.items()}
    core = {k: arrays.pop(k) for k in ("logp", "old_logp", "adv", "mask", "ref_logp")}
    try:
        value, grad, used = check.run(Batch(**core, group_size=group_size, extra=arrays))
    except Exception:  # noqa: BLE001 (the target is outside code)
        return None
    best = None
    for conv in [c for c in (check.reference, *check.candidates) if c is not None and in_family(check, c)]:
        try:
            gap = max(_diff((value, grad), *_expect(check, conv, used)))
        except ValueError:
            continue
        if best is None or gap < best[0]:
            best = (gap, conv)
    if best is None:
        return None
    if best[1] is check.reference:
        return f"none close in {check.algorithm}'s family (the reference itself is nearest, off by {best[0]:.2e} there)"
    return f"{_label(best[1])} (off by {best[0]:.2e} there)"


def settle(target, report: dict, accepted: dict | None = None, base: dict | None = None) -> dict:
    """Give each finding that an --accept item lets pass ``accepted`` (the items), each row its ``outcome`` (its
    kind, or accepted when every finding is) and, where it differs, the ``closest`` known convention:
    the first it matches (a named one first), else the nearest on its minimal input; ``report["ok"]``: no row
    differs or raises. With ``base`` (baseline.read_baseline), each finding is marked known, new or grown, and a
    row whose findings are each accepted or known is ``baselined``."""
    from harness.conform.baseline import apply_baseline, passes
    if base is not None:
        apply_baseline(report, base)
    checks = None
    for row in report["rows"]:
        row["outcome"] = row["kind"]
        for f in row["findings"]:
            items = accepted_by(f, accepted or {})
            if items:
                f["accepted"] = items
        if row["outcome"] in FAILING and row["findings"] and all(f.get("accepted") for f in row["findings"]):
            row["outcome"] = "accepted"
        elif row["outcome"] in FAILING and row["findings"] and all(passes(f) for f in row["findings"]):
            row["outcome"] = "baselined"
        if row["outcome"] != "differs":
            continue
        checks = checks or {(c.algorithm, c.call, c.knob): c for c in target.checks()}
        check = checks.get((row["algorithm"], row["call"], row["knob"]))
        matches = [m for m in row.get("matches") or () if check is None or any(
            _label(c) == m and in_family(check, c) for c in (*check.candidates, *_candidates(check)))]
        if matches:
            named = [m for m in matches if not m.endswith("(not a reference convention)")]
            row["closest"] = (named or matches)[0]
        elif minimal_of(row):
            row["closest"] = check and closest(check, minimal_of(row))
    report["ok"] = not any(r["outcome"] in FAILING for r in report["rows"])
    return report


def console_lines(report: dict, failing_only: bool = False) -> list[str]:
    """Each check on a line (outcome, algorithm, knob, family, verdict); under each difference its largest errors,
    its minimal input, both values and the closest known convention; then a summary line."""
    from harness.conform.baseline import passes, summary
    fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
    lines = []
    for r in report["rows"]:
        if failing_only and r["outcome"] not in FAILING:
            continue
        # under a baseline, a failing check shows only what is new or grown
        shown = [f for f in r["findings"] if not ("baseline" in report and r["outcome"] in FAILING and passes(f))]
        lines.append(f"{r['outcome'].upper() if r['outcome'] in FAILING else r['outcome']:<8} {r['algorithm']} "
                     f"[{r['knob']}] {r['family']}: "
                     f"{verdict(r, shown if len(shown) < len(r['findings']) else None)}")
        if r["outcome"] not in (*FAILING, "accepted"):
            continue
        if r.get("loss_diff") is not None:
            lines.append(f"    largest difference over {r['cases']} batches: loss {fmt(r['loss_diff'])}, gradient "
                         f"{fmt(r['grad_diff'])} (tolerance {r['tolerance']:g}, scaled by max(1, |reference|))")
        for f in shown:
            m = f["minimal_input"]
            status = f" [{f['baseline']}]" if f.get("baseline", "known") != "known" else ""
            lines += [f"    {f['name']}" + ("" if f["max_err"] is None else f" (largest error {fmt(f['max_err'])})")
                      + status,
                      f"      minimal input (rows: {m['rows']}, tokens: {m['tokens']}; reads {r['reads']}): "
                      f"{json.dumps(m['input'])}"]
            if "error" in m:
                lines.append(f"      raises {m['error']}")
            else:
                exact = f" (exact: {json.dumps(m['reference_exact'])})" if "reference_exact" in m else ""
                lines.append(f"      target {json.dumps(m['target'])}, reference {json.dumps(m['reference'])}{exact}")
                lines += [f"      gradient differs at {_element_text(e)}" for e in m.get("grad_differs", ())]
        if r.get("closest"):
            lines.append(f"    closest known convention: {r['closest']}")
        if r.get("note"):
            lines.append(f"    note: {r['note']}")
    counts = {}
    for r in report["rows"]:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    lines.append(f"{report['target']}: {len(report['rows'])} checks: "
                 + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                 + ("" if report["ok"] else " (fails)"))
    return lines + ([summary(report)] if "baseline" in report else [])


def conform_command(target: str, json_out: bool = False, out: str | Path | None = None, seeds: int = 30,
                    adapter: str | None = None, accept=(), baseline=None, write_baseline=None) -> dict:
    """CLI body: run the checks, print each with its outcome and each difference with its numbers (or JSON), and
    write ``<out>/<target>.md`` and ``.json``; ``report["ok"]`` says whether any check differs or raises (with
    ``baseline``, a finding not in that file or grown); ``write_baseline``: record the findings in that file."""
    from harness.conform.baseline import read_baseline
    check_seeds(seeds)
    accepted = parse_accept(accept)
    if isinstance(target, str) and ":" in target:
        require_algorithm(adapter)
    base = None if baseline is None else read_baseline(baseline, "loss", seeds)
    out, write_baseline = (None if p is None else Path(p).absolute() for p in (out, write_baseline))
    tgt = target_of(target, adapter)  # whatever the target does, the files land where they were given
    report = settle(tgt, conform(tgt, seeds=seeds), accepted, base)
    _record(report, write_baseline)
    if out is not None:
        write_report(report, out)
    if json_out:
        print(json.dumps(strict_json(report), indent=1, sort_keys=True))
    else:
        print("\n".join(console_lines(report) + next_steps(report, target, adapter)))
        if write_baseline is not None:
            print(f"baseline written: {write_baseline} ({report['baseline_written']['findings']} findings)")
    return report


def next_steps(report: dict, target: str, adapter: str | None) -> list[str]:
    """What to run after a failing check: the settings that would let its findings pass, said as the adapter of a
    callable that means that convention, or as ``--accept``; else the baseline that gates on what is new."""
    from harness.conform.targets.callable import parse_adapter
    from harness.reports.rundirs import shell_line
    if report["ok"]:
        return []
    items = []
    for r in report["rows"]:
        if r["outcome"] in FAILING:
            for f in r["findings"]:
                for item in (f.get("accept") or [[]])[0]:
                    if item not in items:
                        items.append(item)
    out = []
    if items:
        policy = ":" in target and parse_adapter(adapter).get("kind", "policy") == "policy"
        settings = [i for i in items if i.partition("=")[0] in HPARAMS]
        if policy and settings == items:
            merged = dict(i.partition("=")[::2] for i in filter(None, (adapter or "").split(",")))
            merged.update(i.partition("=")[::2] for i in items)
            out.append("next: if your code means that convention, say so: " + shell_line(
                "cliplab", "conform", target, "--adapter", ",".join(f"{k}={v}" for k, v in merged.items())))
        out.append("next: to let these conventions pass: " + shell_line("cliplab", "conform", target,
                                                                        *(["--adapter", adapter] if adapter else []),
                                                                        "--accept", ",".join(items)))
    out.append("next: to fail only on new findings, record today's once ("
               + shell_line("cliplab", "conform", target, *(["--adapter", adapter] if adapter else []),
                            "--write-baseline", "conform-baseline.json") + ") and gate on it with --baseline "
               "conform-baseline.json")
    return out


def _record(report: dict, path) -> None:
    """With ``path``: record the report's findings there (a baseline) and say so in ``report["baseline_written"]``."""
    if path is not None:
        from harness.conform.baseline import write_baseline
        report["baseline_written"] = {"file": str(path), "findings": write_baseline(report, path)}


def require_algorithm(adapter) -> None:
    """A module:function target must say what it implements: without ``algorithm=`` nothing would be compared
    and every check would pass as "no reference"."""
    from harness.conform.targets.callable import parse_adapter
    parsed = parse_adapter(adapter)
    if parsed.get("kind", "policy") == "policy" and "algorithm" not in parsed:  # other kinds name their estimator
        raise ValueError(f"adapter: algorithm=NAME is required for a module:function target (what the callable "
                         f"implements); expected one of {', '.join(POLICY_ALGORITHMS)}, e.g. --adapter "
                         "algorithm=grpo,beta=0")


def assert_conforms(fn, algorithm: str, *, seeds: int = 30, accept=(), baseline=None, write_baseline=None,
                    **adapter) -> dict:
    """Assert that ``fn`` (a function, or "module:function") computes ``algorithm``'s policy loss with the
    hyper-parameters and parameter names in ``adapter`` (the keys of ``cliplab conform --adapter``, e.g. beta=0,
    logp="log_probs", adv_shape="seq") on generated batches. On a difference, the AssertionError shows its minimal
    input, both values and the closest known convention. ``accept``: conventions to let pass (KEY=VALUE or files,
    as ``--accept``). ``baseline``: a file of known findings (``--write-baseline``): only a finding not in it, or
    grown, fails; ``write_baseline``: record today's findings in that file and pass. Returns the report."""
    __tracebackhide__ = True  # pytest shows the assertion, not this frame
    from harness.conform.baseline import read_baseline
    check_seeds(seeds)
    accepted = parse_accept([accept] if isinstance(accept, str) else accept)
    base = None if baseline is None else read_baseline(baseline, "loss", seeds)
    import torch

    from harness.conform.targets.callable import CallableTarget
    with torch.enable_grad():  # the reference's gradients, even under the caller's torch.no_grad()
        target = CallableTarget(fn, {"algorithm": algorithm, **adapter})
        try:
            report = settle(target, conform(target, seeds=seeds), accepted, base)
        finally:
            target.close()  # naming the closest convention may have started its worker again
    _record(report, write_baseline)
    if not report["ok"] and write_baseline is None:
        raise AssertionError(f"{target.name} does not conform to {algorithm}:\n"
                             + "\n".join(console_lines(report, failing_only=True)))
    return report
