"""The ranking that decides a comparison: every label of a sweep (a label per grid setting) ranked by its accuracy at
an equal generation budget (responses generated, dynamic sampling's extra rounds counted) and at an equal number of
optimiser updates, pass@k beside; each pair's difference with its interval and its test Holm-adjusted over the pairs,
tie groups, decided on the discovery seeds and re-checked on the replication seeds; the pairs that accuracy and
pass@k order differently; and per label, what it measurably differs in from the leader.

Records only (``rankings``; ``as_json`` for ``cliplab sim --json``): ``harness.reports.sim.ranking_lines`` renders
them as markdown, ``harness.runs.sim.format_ranking`` as console text.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import numpy as np

from harness.reports.claims import acc_key, seed_sets
from harness.reports.rundirs import Groups, fmt
from harness.reports.stats import MIN_SEEDS, Comparison, Interval, pairwise, t_interval

#: The two budgets a ranking equalises: (its name, the unit it counts).
AXES = {"generated": ("generation budget", "responses generated"),
        "updates": ("optimiser updates", "optimiser updates")}
#: What each label's gap to the leader is set beside: (per-step metric, how a sentence names it, a share or not).
MEASURED = (("gen_per_trained", "generated per trained response", False), ("clip_frac", "of tokens clipped", True),
            ("malformed", "of responses malformed", True))
#: A measurement differs from the leader's when the larger is at least this many times the smaller and, for a share,
#: they are at least SHARE_FLOOR apart (shares under 0.1% of tokens or responses do not drive a gap).
DIFFERS, SHARE_FLOOR = 1.25, 1e-3


@dataclass(frozen=True)
class Standing:
    """One label: its rank by the discovery mean, its tie-group letters (labels sharing a letter are not
    separable), the primary metric and pass@k at the budget on both seed sets, the means over the discovery seeds of
    ``MEASURED`` up to the budget, and the sentence on its gap to the leader."""
    label: str
    algo: str
    reward: str
    rank: int
    group: str
    metric: Interval
    pass_k: Interval | None
    replication_rank: int | None
    replication_metric: Interval | None
    replication_pass_k: Interval | None
    measured: dict
    gap: str


@dataclass(frozen=True)
class Pair:
    """``ahead`` (the better discovery rank) against ``behind``: the differences ahead - behind of the primary metric
    and of pass@k (Holm-adjusted over the pairs, each metric its own family), whether the primary metric separates
    them, ``disagree`` (how pass@k orders them the other way: "both" separable, only "pass@k" or only the "metric"
    separable, "neither"; empty when it does not), and the same pair on the replication seeds."""
    ahead: str
    behind: str
    metric: Comparison
    pass_k: Comparison | None
    separable: bool
    disagree: str
    replication: Comparison | None
    replicated: bool | None


@dataclass(frozen=True)
class Ranking:
    """The labels of one sweep folder in one environment ranked at one equal budget (``axis``, counted in ``unit``):
    the answer (``verdict``), the replication check, the labels left out and why, and ``spent``: each label's whole
    run in ``unit`` (mean over the discovery seeds), what an equal-steps comparison gives each label."""
    env: str | None
    folder: str
    axis: str
    unit: str
    budget: float
    metric: str
    pass_k: str | None
    seeds: str
    replication_seeds: str
    test: str
    warning: str
    verdict: str
    replication: str
    replicates: bool | None
    standings: list
    pairs: list
    left_out: list
    spent: dict


def rankings(runs: list[dict]) -> list[Ranking]:
    """Per environment and sweep folder (a label belongs to the folder of its first run) with two or more labels to
    rank, the ranking at an equal generation budget, then at equal optimiser updates. Under ``MIN_SEEDS`` seeds a
    set, one warning per folder, no intervals and no tests."""
    home: dict = {}
    for r in runs:
        home.setdefault(r["label"], (r.get("env"), r["dir"]))
    comparisons: dict = {}
    for r in runs:
        comparisons.setdefault(home[r["label"]], []).append(r)
    out = []
    for (env, folder), rs in comparisons.items():
        found = [rk for axis in AXES if (rk := _rank(env, folder, rs, axis)) is not None]
        if found and found[0].warning:
            warnings.warn(found[0].warning, stacklevel=2)
        out += found
    return out


def _by_seed(runs: list[dict]) -> list[dict]:
    return sorted(runs, key=lambda r: (r["label"], r["seed"] if r["seed"] is not None else -1))


def _rank(env, folder: str, runs: list[dict], axis: str) -> Ranking | None:
    disc, rep = seed_sets(runs)
    gd, gr = Groups(_by_seed(disc)), (Groups(_by_seed(rep)) if rep else None)
    labels, left_out = [], []
    for label in gd.labels():
        if not np.isfinite(gd.curve(label, acc_key(gd, label))).any():
            left_out.append(f"{label} (no accuracy logged)")
        elif not np.isfinite(_per_step(gd, label, axis)).any():
            left_out.append(f"{label} (no {AXES[axis][1]} logged)")
        else:
            labels.append(label)
    if len(labels) < 2:
        return None
    metric = "accuracy_exact" if all(acc_key(gd, lbl) == "accuracy_exact" for lbl in labels) else "accuracy"
    logged = {k for lbl in labels for rec in gd.runs[lbl][0]["records"] for k in rec if k.startswith("pass@")}
    ks = [k for k in logged if k[5:].isdigit() and all(np.isfinite(gd.curve(lbl, k)).any() for lbl in labels)]
    pass_k = max(ks, key=lambda k: int(k[5:])) if ks else None  # the largest k all labels log
    sets = [(g, [lbl for lbl in labels if lbl in g.runs]) for g in (gd, gr) if g is not None]
    budget = float(min(_consumed(g, lbl, axis)[:, -1].min() for g, lbls in sets for lbl in lbls))
    d = _values(gd, labels, axis, budget, metric, pass_k)
    r = _values(gr, [lbl for lbl in labels if lbl in gr.runs], axis, budget, metric, pass_k) if gr else None
    fewest = min(iv.n for vals in (d, r) if vals for iv in vals["intervals"].values())
    warning = (f"ranking: {fewest} seed(s) in a set, fewer than {MIN_SEEDS}; its intervals read n/a (too few seeds) "
               "and no pair is tested" if fewest < MIN_SEEDS else "")
    order = sorted(labels, key=lambda lbl: _by_mean(d, lbl))
    tests = _pairs(d, order, gd, pass_k)
    rep_tests = _pairs(r, [lbl for lbl in order if lbl in r["samples"]], gr, pass_k) if r else {}
    rep_order = sorted(r["samples"], key=lambda lbl: _by_mean(r, lbl)) if r else []
    pairs = []
    for (behind, ahead), (c, cp) in tests.items():
        sep = _separable(c)
        rc = rep_tests.get((behind, ahead), (None, None))[0]
        pairs.append(Pair(ahead, behind, c, cp, sep, _disagree(c, cp),
                          rc, (_separable(rc) and rc.diff > 0) if sep and rc is not None else None))
    pairs.sort(key=lambda p: (order.index(p.ahead), order.index(p.behind)))
    letters = _letters(order, {(p.ahead, p.behind) for p in pairs if p.separable})
    leader = order[0]
    standings = []
    for i, lbl in enumerate(order):
        run = gd.runs[lbl][0]
        to_leader = next((p for p in pairs if p.ahead == leader and p.behind == lbl), None)
        standings.append(Standing(
            lbl, run["algo"], reward_text(run), i + 1, letters[lbl], d["intervals"][lbl], d["pass"].get(lbl),
            rep_order.index(lbl) + 1 if lbl in rep_order else None,
            r["intervals"].get(lbl) if r else None, r["pass"].get(lbl) if r else None, d["measured"][lbl],
            "" if to_leader is None else gap_sentence(to_leader, d["measured"], reward_text(gd.runs[leader][0]),
                                                      reward_text(run), axis)))
    replicates, rep_text = _replication(pairs, bool(r))
    name, unit = AXES[axis]
    return Ranking(env, folder, name, unit, budget, metric, pass_k, _seed_text(disc), _seed_text(rep),
                   "paired t" if _paired(gd, labels) else "Welch", warning, _verdict(standings, pairs), rep_text,
                   replicates, standings, pairs, left_out,
                   {lbl: float(np.mean(np.nansum(_per_step(gd, lbl, axis), axis=1))) for lbl in order})


def _by_mean(vals: dict, label: str) -> tuple:
    """Sort key: the highest mean first, a label without a value at the budget last, then by name."""
    mean = vals["intervals"][label].mean
    return (not math.isfinite(mean), -mean if math.isfinite(mean) else 0.0, label)


def _seed_text(runs: list[dict]) -> str:
    from sim.config import Seeds
    seeds = sorted({r["seed"] for r in runs if r["seed"] is not None})
    return Seeds(tuple(seeds), ()).text() if seeds else ""


def _per_step(g: Groups, label: str, axis: str) -> np.ndarray:
    """[seed, step]: the responses generated at each step, or the optimiser updates each step made: epochs x
    minibatches on a step that trained (fewer minibatches when the batch has fewer groups, or DPO pairs, than
    minibatches, as ``sim.loop`` splits them); for runs without the simulator's settings, the ``updates_per_batch``
    they log (cliplab's trainer), else one a step."""
    if axis == "generated":
        return g.curve(label, "generated")
    run = g.runs[label][0]
    st = run.get("settings")
    if not st:
        logged = g.curve(label, "updates_per_batch")
        return np.where(np.isfinite(logged), logged, 1.0)
    trained = g.curve(label, "trained")
    units = trained / 2 if run["algo"] == "dpo" else trained / st["group_size"]
    updates = np.where(trained > 0, st["epochs"] * np.minimum(st["minibatches"], units), 0.0)
    return np.where(np.isnan(trained), np.nan, updates)  # a step that logs no trained count: unknown


def _consumed(g: Groups, label: str, axis: str) -> np.ndarray:
    """[seed, step]: what the policy evaluated at each step had consumed (the steps before it)."""
    per = _per_step(g, label, axis)
    return np.concatenate([np.zeros((len(per), 1)), np.nancumsum(per, axis=1)[:, :-1]], axis=1)


def _values(g: Groups, labels: list[str], axis: str, budget: float, metric: str, pass_k: str | None) -> dict:
    """Per label: the samples over seeds of the metric at ``budget`` (``at_budget``), their t intervals, pass@k's,
    and the means over seeds of ``MEASURED`` over the steps within the budget."""
    out: dict = {"samples": {}, "pass_samples": {}, "intervals": {}, "pass": {}, "measured": {}}
    for lbl in labels:
        used = _consumed(g, lbl, axis)
        out["samples"][lbl] = at_budget(used, g.curve(lbl, metric), budget)
        out["intervals"][lbl] = t_interval(out["samples"][lbl])
        if pass_k:
            out["pass_samples"][lbl] = at_budget(used, g.curve(lbl, pass_k), budget)
            out["pass"][lbl] = t_interval(out["pass_samples"][lbl])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a metric not logged: NaN, shown as n/a
            out["measured"][lbl] = {key: float(np.nanmean(np.nanmean(np.where(used <= budget, g.curve(lbl, key),
                                                                             np.nan), axis=1)))
                                    for key, _, _ in MEASURED}
    return out


def at_budget(used: np.ndarray, values: np.ndarray, budget: float) -> np.ndarray:
    """Per seed, ``values`` ([seed, step], NaN where not evaluated) at ``budget`` of ``used`` (what the policy of
    each step had consumed): linear between the two evaluations around the budget (exact metrics are evaluated every
    few steps, and a label that generates 3x the responses passes the budget 3x sooner), the last evaluation when
    none lies past it; NaN when none lies within it."""
    out = np.full(len(values), np.nan)
    for i, (u, v) in enumerate(zip(used, values)):
        ok = np.isfinite(v)
        u, v = u[ok], v[ok]
        if u.size and u[0] <= budget:
            out[i] = v[-1] if budget >= u[-1] else np.interp(budget, u, v)
    return out


def _paired(g: Groups, labels: list[str]) -> bool:
    """Seeds pair when every label ran the same seeds in the same environment draws (``env_seed``)."""
    keys = {(tuple(r["seed"] for r in g.runs[lbl]), (g.runs[lbl][0].get("settings") or {}).get("env_seed"))
            for lbl in labels}
    return len(keys) == 1 and None not in next(iter(keys))[0]


def _pairs(vals: dict, order: list[str], g: Groups, pass_k: str | None) -> dict:
    """{(behind, ahead): (metric comparison, pass@k comparison)}, ahead - behind, for every pair of ``order``."""
    worst_first = order[::-1]
    paired = _paired(g, order)
    c = pairwise({lbl: vals["samples"][lbl] for lbl in worst_first}, paired)
    cp = pairwise({lbl: vals["pass_samples"][lbl] for lbl in worst_first}, paired) if pass_k else {}
    return {key: (c[key], cp.get(key)) for key in c}


def _separable(c: Comparison | None) -> bool:
    """A difference the test finds after Holm's correction, or one the same in every seed pair (nothing to test)."""
    return c is not None and (c.significant() or (c.kind == "structural" and c.diff != 0))


def _disagree(c: Comparison, cp: Comparison | None) -> str:
    if cp is None or not (c.diff > 0 and cp.diff < 0):
        return ""
    sep, sep_k = _separable(c), _separable(cp)
    return "both" if sep and sep_k else "pass@k" if sep_k else "metric" if sep else "neither"


def _letters(order: list[str], apart: set) -> dict[str, str]:
    """Tie-group letters: the maximal sets of labels no two of which are separable (the maximal cliques of the
    "not separable" graph, Bron-Kerbosch), lettered by their best-ranked member; two labels share a letter exactly
    when they are not separable."""
    tied = {a: {b for b in order if b != a and (a, b) not in apart and (b, a) not in apart} for a in order}
    cliques: list = []

    def grow(found: set, cands: set, done: set) -> None:
        if not cands and not done:
            cliques.append(found)
        for v in sorted(cands, key=order.index):
            grow(found | {v}, cands & tied[v], done & tied[v])
            cands, done = cands - {v}, done | {v}
    grow(set(), set(order), set())
    cliques.sort(key=lambda c: sorted(order.index(v) for v in c))
    names = [chr(ord("a") + i) if i < 26 else f"({i + 1})" for i in range(len(cliques))]
    return {lbl: "".join(n for n, c in zip(names, cliques) if lbl in c) for lbl in order}


def reward_text(run: dict) -> str:
    """The reward scheme a run trained with and its values (correct/wrong/malformed), or "-" when not recorded."""
    from sim.config import RANDOM_REWARD, REWARD_SCHEMES
    reward = (run.get("settings") or {}).get("reward")
    if reward is None:
        return "-"
    if reward == RANDOM_REWARD:
        return f"{reward} (coin flips)"
    return f"{reward} " + "/".join(f"{v:g}" for v in REWARD_SCHEMES.get(reward, ()))


def difference(c: Comparison) -> str:
    """A difference with its 95% interval and Holm-adjusted test, or why there is none."""
    if c.kind == "too few":
        return f"{fmt(c.diff)} ± n/a (too few seeds)"
    if c.kind == "structural":
        return f"{fmt(c.diff)} (the same in every seed pair)"
    return f"{fmt(c.diff)} ± {fmt(c.half)} ({c.kind}, Holm p {c.p:.2g})"


def pair_cell(c: Comparison, separable: bool) -> str:
    """A pair's difference, and for one not separated, why."""
    return difference(c) if separable or c.kind == "structural" else f"{difference(c)}: {not_separated(c)}"


def not_separated(c: Comparison) -> str:
    """Why a pair is not separable: too few seeds to test, or the detectable size the seeds had (never "no
    effect")."""
    if c.kind == "too few":
        return f"not tested (fewer than {MIN_SEEDS} seeds a side)"
    if c.kind == "structural":
        return "the same in every seed pair"
    return (f"not detectable with {min(c.n_a, c.n_b)} seeds (smallest detectable effect {fmt(c.detectable)} at "
            "Holm's strictest level)")


def _share(v: float) -> str:
    return fmt(v, pct=True)


def gap_sentence(p: Pair, measured: dict, reward_leader: str, reward: str, axis: str) -> str:
    """One sentence: the label's gap to the leader (its difference, or why it is not separable) and the measured
    ways it differs from the leader: generated per trained response, reward scheme, clip share, malformed share (a
    measurement differs when one is ``DIFFERS`` times the other, shares at least ``SHARE_FLOOR`` apart)."""
    mine, lead = measured[p.behind], measured[p.ahead]
    head = (f"below {p.ahead} by {difference(p.metric)}" if p.separable else
            f"not separable from {p.ahead} ({not_separated(p.metric)})")
    parts = []
    for key, name, share in MEASURED:
        a, b = mine[key], lead[key]
        big, small = max(a, b), min(a, b)
        if math.isfinite(big + small) and (big >= DIFFERS * small if small > 0 else big > 0) \
                and (not share or big - small >= SHARE_FLOOR):
            show = _share if share else fmt
            parts.append(f"{show(a)} {name} against {show(b)}" + (
                " (the same generation trained it on fewer responses)"
                if key == "gen_per_trained" and axis == "generated" and a > b else ""))
        if key == "gen_per_trained" and reward != reward_leader:
            parts.append(f"reward {reward} against {reward_leader}")
    why = ("differs from the leader in: " + "; ".join(parts) if parts else
           "its generation per trained response, reward, clip share and malformed share are the leader's (within "
           f"{DIFFERS:g}x)" + (": the gap is in the update itself" if p.separable else ""))
    return f"{head}; {why}."


def _verdict(standings: list[Standing], pairs: list[Pair]) -> str:
    """The answer in one sentence: the leader, and the labels not separable from it."""
    leader = standings[0].label
    if all(p.metric.kind == "too few" for p in pairs):
        return f"{leader} has the highest mean; with fewer than {MIN_SEEDS} seeds no pair is tested."
    tied = [p.behind for p in pairs if p.ahead == leader and not p.separable]
    if not tied:
        return f"{leader} leads, ahead of every other label (Holm-adjusted 5%)."
    return f"{leader} has the highest mean, not separable from {', '.join(tied)} (tie group {standings[0].group})."


def _replication(pairs: list[Pair], has_rep: bool) -> tuple[bool | None, str]:
    """Whether each pair separated on the discovery seeds is separated the same way on the replication seeds."""
    if not has_rep:
        return None, "No replication seeds: the order is not re-checked."
    sep = [p for p in pairs if p.separable]
    if not sep:
        return None, "Nothing is separable on the discovery seeds, so there is no order to re-check."
    failed = [p for p in sep if not p.replicated]
    if not failed:
        return True, ("The order replicates: " + ("its one separation holds" if len(sep) == 1 else
                                                   f"each of the {len(sep)} separations holds")
                      + " on the replication seeds.")
    why = [f"{p.ahead} over {p.behind} (replication: " + ("not run" if p.replication is None else
           "reversed" if _separable(p.replication) else not_separated(p.replication)) + ")" for p in failed]
    return False, (f"The order does not fully replicate: {len(sep) - len(failed)} of {len(sep)} separations hold on "
                   f"the replication seeds; not: {'; '.join(why)}.")


def as_json(rankings_: list[Ranking]) -> list[dict]:
    """The records as JSON values (NaN as null)."""
    def clean(v):
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return [clean(dataclasses.asdict(r)) for r in rankings_]
