"""A paper's claim decided on one run set, as a record: what the claim is and where it was published, the regime it
was measured in (with the regime card's conditions, their measured values and which failed), the settings compared,
each seed set's estimate, interval, test and Holm-adjusted p, the verdict as one of a closed set of kinds, a short
reason, the measured attribution and, for a claim that is not measured, the command that would measure it.

Every claim function (``harness.reports.claims``, ``harness.reports.evidence``) returns records; every renderer
(``harness.reports.claim_render``) and every comparison between tiers reads them, never their wording.
``to_json`` / ``from_json`` are the records' form in ``claims.json`` (``SCHEMA``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from spec.regime import Condition


class Kind(str, Enum):
    """A verdict's kind (its wording without numbers)."""
    REPRODUCED = "reproduced"
    PARTLY = "partly"
    NOT_REPRODUCED = "not reproduced"
    REVERSED = "reversed"
    NOT_DETECTABLE = "not detectable"  # with the seeds run: the smallest effect they detect is stated
    NOT_TESTABLE = "not testable here"  # the regime cannot show it (a card condition fails, too few seeds)
    NOT_REPLICATED = "not replicated"  # the two seed sets' kinds differ
    NOT_MEASURED = "not measured"  # the runs to measure it are missing: the record names the command
    NA = "n/a"  # no verdict of its own (a mechanism row's measurements)


#: Kinds that are no verdict to compare between tiers: nothing measured, or no verdict of its own.
UNCOMPARED = frozenset({Kind.NOT_MEASURED, Kind.NA})


@dataclass(frozen=True)
class Source:
    """Where a claim was published: the paper (or framework), its arXiv id where it has one, the figure, table,
    equation or section."""
    paper: str
    arxiv: str | None
    where: str

    def text(self) -> str:
        return ", ".join(x for x in (f"{self.paper} {self.arxiv}" if self.arxiv else self.paper, self.where) if x)


@dataclass(frozen=True)
class Claim:
    """A claim: a stable id (a record's key across reports), its statement and its source."""
    id: str
    text: str
    source: Source


@dataclass(frozen=True)
class Estimate:
    """The quantity a seed set's verdict reads: ``value`` with the half-width ``half`` of its 95% interval (None:
    no interval), the test (paired, welch, structural, too few; descriptive: no test), its Holm-adjusted p and the
    seeds a side."""
    what: str
    value: float
    half: float | None = None
    test: str = "descriptive"
    p: float | None = None
    n: int | None = None
    pct: bool = False


@dataclass(frozen=True)
class Verdict:
    """A verdict: its kind; for "not detectable", the seeds a side and the smallest effect they detect (80% power);
    ``note`` a qualifier ("under two seeds a side", "confounded"; a mechanism row's "measured")."""
    kind: Kind
    seeds: int | None = None
    detectable: float | None = None
    pct: bool = False
    note: str = ""

    def text(self) -> str:
        if self.kind is Kind.NA:
            return self.note or Kind.NA.value
        head = self.kind.value
        if self.kind is Kind.NOT_DETECTABLE:
            effect = "n/a" if self.detectable is None or not math.isfinite(self.detectable) else (
                f"{100 * self.detectable:.3g}%" if self.pct else f"{self.detectable:.3g}")
            head = f"not detectable with {self.seeds} seeds (smallest detectable effect {effect})"
        return f"{head} ({self.note})" if self.note else head


@dataclass(frozen=True)
class SetResult:
    """One seed set's result: its seeds (as text), verdict, deciding estimate and every number measured."""
    verdict: Verdict
    estimate: Estimate | None = None
    measured: str = ""
    seeds: str = ""


@dataclass(frozen=True)
class CardCheck:
    """A condition of the regime card on a label, with the value measured there (None: not logged, or, where not
    ``applicable``, not defined for the label's algorithm: a clip statistic of an algorithm without a hard clip),
    and that of the condition's ``across`` entry, which two environments' cards compare in its place."""
    condition: Condition
    value: float | None
    label: str
    applicable: bool = True
    across_value: float | None = None

    @property
    def holds(self) -> bool:
        return self.condition.holds(self.value)


def checks_on(card: dict, label: str, conditions) -> tuple[CardCheck, ...]:
    """The ``conditions`` on a label's card (``harness.reports.regime.label_card``, with their entries and
    ``across`` entries), each with its measured values."""
    return tuple(CardCheck(c, card[c.entry].value, label, card[c.entry].applicable,
                           card[c.across].value if c.across else None) for c in conditions)


def card_names(conditions) -> set[str]:
    """The card entries ``conditions`` read, their ``across`` entries included."""
    return {name for c in conditions for name in (c.entry, c.across) if name}


#: How a record's seed sets stand: decided on both (discovery and replication), on the discovery seeds only, or on
#: runs without seed sets (one set: real-model runs).
STATUS = ("both", "discovery only", "single set")


@dataclass(frozen=True)
class ClaimRecord:
    """A claim in one regime on one run set (see the module's docstring). ``kind`` is the record's verdict: the
    sets' common kind, "not replicated" where they differ. ``mechanism``: a row that measures why the claim acts
    (the tokens a clip holds, a gate's weights) beside the regime's verdict."""
    claim: Claim | None
    regime: str
    kind: Kind
    reason: str
    discovery: SetResult
    replication: SetResult | None = None
    status: str = "single set"
    compared: tuple[str, ...] = ()
    conditions: tuple[CardCheck, ...] = ()
    attribution: str = ""
    command: str | None = None
    mechanism: bool = False
    algorithm: str | None = None  # the algorithm a regime is of (clip-higher on GRPO or DAPO), where it is one

    @property
    def comparable(self) -> bool:
        """Whether the verdict can be compared with another tier's: measured, with a verdict of its own, on both
        seed sets where the run set has two."""
        return self.kind not in UNCOMPARED and self.status != "discovery only"

    def verdict_text(self) -> str:
        d = self.discovery.verdict.text()
        if self.status == "discovery only":
            where = "no replication seeds" if self.replication is None else "not run on the replication seeds"
            return f"discovery only: {d} ({where})"
        if self.kind is Kind.NOT_REPLICATED and self.replication is not None:
            return f"not replicated (discovery: {d}; replication: {self.replication.verdict.text()})"
        return d


def finding(regime: str, verdict: Verdict | Kind, reason: str, measured: str = "", estimate: Estimate | None = None,
            compared=(), attribution: str = "", command: str | None = None, mechanism: bool = False,
            conditions=(), algorithm: str | None = None) -> ClaimRecord:
    """A claim function's record on one seed set (``claims.decide`` fills in the claim and the seeds)."""
    v = verdict if isinstance(verdict, Verdict) else Verdict(verdict)
    return ClaimRecord(None, regime, v.kind, reason, SetResult(v, estimate, measured), compared=tuple(compared),
                       conditions=tuple(conditions), attribution=attribution, command=command, mechanism=mechanism,
                       algorithm=algorithm)


def failing_text(k: CardCheck) -> str:
    """A failing card value in 3 significant digits, or as many more as it takes to read as failing: 0.19996
    against ">= 0.2" reads 0.19996, not 0.2."""
    for digits in range(3, 17):
        text = f"{k.value:.{digits}g}"
        if not k.condition.holds(float(text)):
            return text
    return repr(k.value)


def regime_checked(r: ClaimRecord) -> ClaimRecord:
    """``r`` where its regime card meets the conditions the claim needs; else "not testable here", its reason
    naming the measured value that fails (the first such condition). A condition whose entry the runs do not log
    leaves the verdict as it is: the record lists it unmet, with no value, and nothing is claimed of it."""
    if r.kind in (Kind.NOT_MEASURED, Kind.NA, Kind.NOT_TESTABLE) or r.mechanism:
        return r
    failed = [k for k in r.conditions if k.applicable and k.value is not None and not k.holds]
    if not failed:
        return r
    k = failed[0]
    reason = f"{k.label}'s {k.condition.entry} is {failing_text(k)}; the claim needs {k.condition.text()}"
    return replace(r, kind=Kind.NOT_TESTABLE, reason=reason,
                   discovery=replace(r.discovery, verdict=Verdict(Kind.NOT_TESTABLE)))


def card_gap(a: ClaimRecord, b: ClaimRecord) -> str | None:
    """Why two tiers' records of a claim were not measured at a matching regime card, in a phrase: the condition
    entries whose values lie further apart than their tolerance (``harness.reports.regime.residual``), with both
    values, or that one record carries no value of them; None where the cards match, or where the claim states no
    condition on the card (it needs no particular regime). Where both measured a condition's ``across`` entry, that
    is compared in its place (the clip ratios per decision token for the per-token ones)."""
    from harness.reports.regime import TOLERANCES, residual
    if not a.conditions and not b.conditions:
        return None
    ours, theirs = _compared(a), _compared(b)
    for entry, across in {(k.condition.entry, k.condition.across) for k in a.conditions + b.conditions}:
        if across in ours and across in theirs:  # both measured what stands for the entry across environments
            ours.pop(entry, None)
            theirs.pop(entry, None)
    shared = [e for e in ours if e in theirs and e in TOLERANCES]
    if not shared:
        return "no regime card entry measured in both"
    off = [e for e in shared if abs(residual(e, ours[e], theirs[e])) > 1]
    return ("regime cards differ: " + "; ".join(f"{e} {ours[e]:.3g} vs {theirs[e]:.3g}" for e in off)) if off else None


def _compared(r: ClaimRecord) -> dict[str, float]:
    """The card values a record's conditions measured, their ``across`` entries' beside them."""
    out = {k.condition.entry: k.value for k in r.conditions if k.applicable and k.value is not None}
    out.update({k.condition.across: k.across_value for k in r.conditions if k.across_value is not None})
    return out


def not_measured(what: str, command: str, regime: str = "") -> ClaimRecord:
    """A claim the runs cannot measure: what it needs, and the simulator's command that measures it."""
    return finding(regime, Kind.NOT_MEASURED, f"needs {what}", command=command)


def combine(d: ClaimRecord, r: ClaimRecord | None, seeds: tuple[str, str]) -> ClaimRecord:
    """The record of a claim decided on the discovery set ``d`` and re-checked on the replication set ``r`` (None:
    no replication run of this regime): the common kind where both sets give it, else "not replicated"; on the
    discovery seeds only where ``r`` is None (its replication: not measured where the set has seeds). Where only the
    replication set's card fails a condition, its verdict names the failing value."""
    disc = replace(d.discovery, seeds=seeds[0])
    if r is None:
        rep = SetResult(Verdict(Kind.NOT_MEASURED), seeds=seeds[1]) if seeds[1] else None
        return replace(d, discovery=disc, replication=rep, status="discovery only")
    rep = replace(r.discovery, seeds=seeds[1])
    if r.kind is Kind.NOT_TESTABLE and d.kind is not Kind.NOT_TESTABLE:  # the record's reason is the discovery's:
        rep = replace(rep, verdict=replace(rep.verdict, note=r.reason))  # say which value fails on the replication
    kind = d.kind if d.kind is r.kind else Kind.NOT_REPLICATED
    return replace(d, kind=kind, discovery=disc, replication=rep, status="both")


# ---- JSON ---------------------------------------------------------------------------------------------------------
SCHEMA_VERSION = 1
_NUM = {"type": ["number", "null"]}
_STR = {"type": "string"}
_ESTIMATE = {"type": ["object", "null"], "additionalProperties": False,
             "required": ["what", "value", "half", "test", "p", "n", "pct"],
             "properties": {"what": _STR, "value": _NUM, "half": _NUM, "p": _NUM,
                            "test": {"enum": ["paired", "welch", "structural", "too few", "descriptive"]},
                            "n": {"type": ["integer", "null"]}, "pct": {"type": "boolean"}}}
_SET = {"type": ["object", "null"], "additionalProperties": False,
        "required": ["seeds", "kind", "verdict", "note", "detectable", "pct", "n_seeds", "estimate", "measured"],
        "properties": {"seeds": _STR, "kind": {"enum": [k.value for k in Kind]}, "verdict": _STR, "note": _STR,
                       "pct": {"type": "boolean"},
                       "detectable": _NUM, "n_seeds": {"type": ["integer", "null"]}, "estimate": _ESTIMATE,
                       "measured": _STR}}
_RECORD = {
    "type": "object", "additionalProperties": False,
    "required": ["claim", "text", "source", "regime", "algorithm", "mechanism", "compared", "conditions", "status",
                 "kind", "verdict", "reason", "discovery", "replication", "attribution", "command"],
    "properties": {
        "claim": _STR, "text": _STR,
        "source": {"type": "object", "additionalProperties": False, "required": ["paper", "arxiv", "where"],
                   "properties": {"paper": _STR, "arxiv": {"type": ["string", "null"]}, "where": _STR}},
        "regime": _STR, "algorithm": {"type": ["string", "null"]}, "mechanism": {"type": "boolean"}, "compared": {"type": "array", "items": _STR},
        "conditions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["entry", "op", "threshold", "of", "why", "label", "value", "applicable", "holds"],
            "properties": {"entry": _STR, "op": {"enum": [">=", "<=", ">", "<"]}, "threshold": {"type": "number"},
                           "of": _STR, "why": _STR, "label": _STR, "value": _NUM, "applicable": {"type": "boolean"},
                           "holds": {"type": "boolean"}, "across": _STR, "across_value": _NUM}}},
        "status": {"enum": list(STATUS)}, "kind": {"enum": [k.value for k in Kind]}, "verdict": _STR,
        "reason": _STR, "discovery": _SET, "replication": _SET, "attribution": _STR,
        "command": {"type": ["string", "null"]}}}
#: The JSON schema (draft 2020-12) of a ``claims.json``: per run set (an environment, or the runs of a report), its
#: seed sets, the number of tests Holm's correction ran over in each, and its claim records. A record's ``kind`` and
#: each set's ``kind`` are the verdicts' kinds (``Kind``); ``verdict`` the same in words with its numbers; a number
#: that is not finite (no interval, no test) is null.
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "cliplab claims", "type": "object",
    "additionalProperties": False, "required": ["version", "run_sets"],
    "properties": {
        "version": {"const": SCHEMA_VERSION},
        "run_sets": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "discovery_seeds", "replication_seeds", "tests", "claims"],
            "properties": {"name": _STR, "discovery_seeds": _STR, "replication_seeds": _STR,
                           "tests": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                           "claims": {"type": "array", "items": _RECORD}}}}}}


def _num(x) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _set_json(s: SetResult | None) -> dict | None:
    if s is None:
        return None
    e, v = s.estimate, s.verdict
    est = None if e is None else {"what": e.what, "value": _num(e.value), "half": _num(e.half), "test": e.test,
                                  "p": _num(e.p), "n": e.n, "pct": e.pct}
    return {"seeds": s.seeds, "kind": v.kind.value, "verdict": v.text(), "note": v.note,
            "detectable": _num(v.detectable), "pct": v.pct,
            "n_seeds": v.seeds, "estimate": est, "measured": s.measured}


def record_json(r: ClaimRecord) -> dict:
    c = r.claim
    return {"claim": c.id if c else "", "text": c.text if c else "",
            "source": {"paper": c.source.paper, "arxiv": c.source.arxiv, "where": c.source.where} if c else
            {"paper": "", "arxiv": None, "where": ""},
            "regime": r.regime, "algorithm": r.algorithm, "mechanism": r.mechanism, "compared": list(r.compared),
            "conditions": [{"entry": k.condition.entry, "op": k.condition.op, "threshold": k.condition.threshold,
                            "of": k.condition.of, "why": k.condition.why, "label": k.label, "value": _num(k.value),
                            "applicable": k.applicable, "holds": k.holds,
                            **({"across": k.condition.across, "across_value": _num(k.across_value)}
                               if k.condition.across else {})} for k in r.conditions],
            "status": r.status, "kind": r.kind.value, "verdict": r.verdict_text(), "reason": r.reason,
            "discovery": _set_json(r.discovery), "replication": _set_json(r.replication),
            "attribution": r.attribution, "command": r.command}


@dataclass(frozen=True)
class RunSet:
    """The records of one run set (an environment of a report), with its seed sets and Holm families' sizes."""
    name: str
    records: tuple[ClaimRecord, ...]
    seeds: tuple[str, str] = ("", "")
    tests: tuple[int, int] = (0, 0)


def to_json(run_sets: list[RunSet]) -> dict:
    return {"version": SCHEMA_VERSION, "run_sets": [
        {"name": s.name, "discovery_seeds": s.seeds[0], "replication_seeds": s.seeds[1], "tests": list(s.tests),
         "claims": [record_json(r) for r in s.records]} for s in run_sets]}


def _set_of(d: dict | None) -> SetResult | None:
    if d is None:
        return None
    e = d["estimate"]
    est = None if e is None else Estimate(e["what"], _nan(e["value"]), e["half"], e["test"], e["p"], e["n"], e["pct"])
    return SetResult(Verdict(Kind(d["kind"]), d["n_seeds"], d["detectable"], d["pct"], d["note"]), est, d["measured"],
                     d["seeds"])


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def from_json(data: dict) -> list[RunSet]:
    """The run sets of a ``claims.json`` (``to_json``'s form; check it against ``SCHEMA`` first)."""
    out = []
    for s in data["run_sets"]:
        recs = []
        for r in s["claims"]:
            src = r["source"]
            claim = Claim(r["claim"], r["text"], Source(src["paper"], src["arxiv"], src["where"]))
            conds = tuple(CardCheck(Condition(c["entry"], c["op"], c["threshold"], c["why"], c["of"], c.get("across")),
                                    c["value"], c["label"], c["applicable"], c.get("across_value"))
                          for c in r["conditions"])
            recs.append(ClaimRecord(claim, r["regime"], Kind(r["kind"]), r["reason"], _set_of(r["discovery"]),
                                    _set_of(r["replication"]), r["status"], tuple(r["compared"]), conds,
                                    r["attribution"], r["command"], r["mechanism"], r["algorithm"]))
        out.append(RunSet(s["name"], tuple(recs), (s["discovery_seeds"], s["replication_seeds"]), tuple(s["tests"])))
    return out
