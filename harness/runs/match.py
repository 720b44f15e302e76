"""``cliplab sim --match RUNS``: fit the simulator's environment and schedule to a measured regime card.

The target card (spec/regime.py) comes from any run set the reports read: a simulator sweep, tier, SmolLM2 or
``cliplab train`` run folders, or cluster logs (verl, TRL). The fit moves the knobs of ``KNOBS`` (learning rate,
updates per rollout batch, staleness, the prior's confidence, the difficulty spread, how many contexts share
parameters, how many prompts and right answers per position there are, and where exploration tokens sit when the
environment has that setting) to bring the simulator's card, on the same algorithm, to the target's,
with scipy's differential evolution under a fixed budget of simulator runs, from a fixed seed: the fit does not
depend on the machine. Only the entries the target's logs supply are fitted (``FIT_ENTRIES`` that its card has),
and the clip ratios per decision token in place of the clip ratios per token where the logs have both
(``FIT_INSTEAD``).

Each entry's residual is in units of its tolerance (``harness.reports.regime.residual``). The card matches when
every residual is at most 1; otherwise the best fit is reported with its residuals and ``cliplab sim`` exits 1.
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from spec.regime import ENTRIES

from harness.reports.regime import FIT_ENTRIES, FIT_INSTEAD, MISSING, residual

#: What each log format calls the metric an entry needs (for the error when a target lacks all of them).
SOURCES = {"clip_frac": "clip_frac (verl actor/pg_clipfrac, TRL clip_ratio/region_mean)",
           "clip_up_frac": "clip_up_frac (TRL clip_ratio/high_mean; cliplab runs)",
           "decision_clip_frac": "decision_clip_frac (cliplab runs only; fitted instead of clip_frac)",
           "decision_clip_up_frac": "decision_clip_up_frac (cliplab runs only; fitted instead of clip_up_frac)",
           "decision_dev_q50": "decision_dev_q50 (cliplab runs only)",
           "decision_dev_q90": "decision_dev_q90 (cliplab runs only)",
           "upclip_pold_lt02": "upclip_pold_lt02 (cliplab runs only)",
           "accuracy_start": "accuracy (cliplab runs; verl val-core .../acc)", "accuracy_end": "accuracy",
           "entropy_fall": "entropy (verl actor/entropy, TRL entropy)",
           "entropy_relevant_fall": "entropy_relevant (cliplab runs only)"}
ENV = "feature_lm"


@dataclass(frozen=True)
class Knob:
    """One fitted setting: ``key`` of the simulator's settings over [low, high] (log-uniform if ``log``, whole
    numbers if ``integer``, both: searched in log space, rounded; ``choices``: a categorical setting, searched as an
    index)."""
    key: str
    low: float
    high: float
    log: bool = False
    integer: bool = False
    choices: tuple = ()

    def value(self, x: float):
        """The setting at ``x``; a real value to 4 significant digits, so that the ablation's labels stay readable
        and run exactly the settings fitted."""
        if self.choices:
            return self.choices[int(round(x))]
        x = 10 ** x if self.log else x
        return int(round(x)) if self.integer else float(f"{x:.4g}")

    @property
    def integral(self) -> bool:
        """Searched on whole numbers (a log-scaled integer is searched in log space and rounded)."""
        return bool(self.choices) or (self.integer and not self.log)

    def bounds(self) -> tuple[float, float]:
        if self.choices:
            return 0.0, float(len(self.choices) - 1)
        return (math.log10(self.low), math.log10(self.high)) if self.log else (self.low, self.high)


def knobs() -> list[Knob]:
    """The knobs the environment has: the schedule's, the prior's, how much contexts share parameters (the number
    of features: with few, an update at one context moves the others, and entropy at reward-irrelevant positions
    rises as the relevant entropy falls), the task's (the pool of prompts: with fewer, each prompt's decisions are
    seen more often, so accuracy and the entropy fall go further in as many steps; the right answers per position:
    with one, entropy among right answers collapses too) and, where feature_lm has it, exploration's."""
    from sim.config import known_keys, schema
    out = [Knob("lr", 1e-3, 0.3, log=True), Knob("minibatches", 1, 16, integer=True),
           Knob("staleness", 0, 6, integer=True), Knob("confidence", 0.0, 6.0),
           Knob("difficulty_low", -10.0, -1.0), Knob("difficulty_high", -1.0, 6.0),
           Knob("n_features", 32, 256, log=True, integer=True), Knob("n_prompts", 32, 512, log=True, integer=True),
           Knob("n_correct", 1, 4, integer=True)]
    if "explore" in known_keys(ENV):
        out.append(Knob("explore", 0, 0, choices=tuple(schema(ENV)["explore"].choices)))
    return out


def target_card(paths, label: str | None) -> tuple[str, str | None, dict]:
    """(label, algorithm, {entry: value}) of the run set's label to fit: ``label``, or its only label."""
    from harness.reports.regime import run_set_card
    runs = _runs(paths)
    cards = run_set_card(runs)
    if label is None:
        if len(cards) != 1:
            raise ValueError(f"match-label: {', '.join(map(str, paths))} hold {len(cards)} labels "
                             f"({', '.join(cards)}); expected --match-label naming the one to fit")
        label = next(iter(cards))
    elif label not in cards:
        raise ValueError(f"match-label: no label {label!r} in {', '.join(map(str, paths))}; expected one of "
                         f"{', '.join(cards)}")
    algo = next(r["algo"] for r in runs if r["label"] == label)
    values = {e: cv.value for e, cv in cards[label].items() if e in FIT_ENTRIES and cv.value is not None}
    for better, worse in FIT_INSTEAD.items():
        if better in values:
            values.pop(worse, None)
    if not values:
        raise ValueError(f"match: {label} logs no card entry the fit can target; each needs a metric: "
                         + "; ".join(f"{e} needs {SOURCES[e]}" for e in FIT_ENTRIES))
    return label, algo, values


def _runs(paths) -> list[dict]:
    """The runs under ``paths``: cliplab run folders (sim, train) as the reports read them, else cluster logs."""
    from harness.reports import cluster
    from harness.reports.rundirs import load_runs
    if all(Path(p).is_dir() and any(Path(p).glob("**/metrics.jsonl")) for p in paths):
        return load_runs(paths)
    return cluster.load(paths)[0]


class Objective:
    """The simulator's card at one point of the knobs, against the target's (picklable, for scipy's workers)."""

    def __init__(self, algo: str, target: dict, knob_list: list[Knob], seeds: int, steps: int, fixed: dict):
        self.algo, self.target, self.knobs = algo, target, knob_list
        self.seeds, self.steps, self.fixed = seeds, steps, fixed

    def settings(self, x) -> dict:
        out = dict(self.fixed)
        out.update({k.key: k.value(v) for k, v in zip(self.knobs, x)})
        lo, hi = out.get("difficulty_low"), out.get("difficulty_high")
        if lo is not None and hi is not None and lo > hi:
            out["difficulty_low"], out["difficulty_high"] = hi, lo
        if "minibatches" in out:  # a minibatch holds whole groups
            out["minibatches"] = min(out["minibatches"], out.get("batch_prompts", 16))
        return out

    def card(self, x) -> dict:
        from sim.loop import Diverged, run_stack

        from harness.reports.regime import label_card
        try:
            records = run_stack(ENV, self.algo, list(range(self.seeds)), self.steps, self.settings(x))
        except Diverged:  # no card: every entry missing, and the point worse than any that has one (``__call__``)
            return dict.fromkeys(self.target)
        card = label_card([{"algo": self.algo, "records": r} for r in records])
        return {e: card[e].value for e in self.target}

    def residuals(self, x) -> dict:
        return self.residuals_of(self.card(x))

    def residuals_of(self, card: dict) -> dict:
        """Each target entry's residual (tolerance units) of a ``card`` of the simulator's."""
        return {e: residual(e, card[e], t) for e, t in self.target.items()}

    def __call__(self, x) -> float:
        return self.loss(self.card(x))

    def loss(self, card: dict) -> float:
        """The sum of squared residuals of a ``card``: what the search minimises."""
        if all(v is None for v in card.values()):  # diverged (or a card with nothing): never the best point
            return math.inf
        return float(sum(r * r for r in self.residuals_of(card).values()))


def matches(residuals: dict) -> bool:
    """Whether every entry is within its tolerance."""
    return all(abs(r) <= 1.0 for r in residuals.values())


@dataclass
class Fit:
    label: str
    algo: str
    settings: dict
    target: dict
    fitted: dict
    residuals: dict
    evaluations: int
    inputs: dict  # what ``fit`` was asked: a fit.json asked the same is reused, not run again

    @property
    def matched(self) -> bool:
        return matches(self.residuals)

    def record(self) -> dict:
        """The fit as a JSON-ready record (``harness.reports.regime.FIT_FILE``), which reports render."""
        return {"env": ENV, "label": self.label, "algo": self.algo, "settings": self.settings,
                "evaluations": self.evaluations, "matched": self.matched, "inputs": self.inputs,
                "entries": [{"entry": e, "target": t, "fitted": self.fitted[e], "residual": self.residuals[e]}
                            for e, t in self.target.items()]}

    @classmethod
    def from_record(cls, rec: dict) -> Fit:
        entries, inputs = rec["entries"], rec["inputs"]
        order = [*inputs["fixed"], *(k["key"] for k in inputs["knobs"] if k["key"] not in inputs["fixed"])]
        settings = {k: rec["settings"][k] for k in order if k in rec["settings"]}
        return cls(rec["label"], rec["algo"], settings, {e["entry"]: e["target"] for e in entries},
                   {e["entry"]: e["fitted"] for e in entries}, {e["entry"]: e["residual"] for e in entries},
                   rec["evaluations"], inputs)

    def lines(self) -> list[str]:
        width = max(len(e) for e in self.target)
        out = [f"fit of the simulator ({ENV}, {self.algo}) to {self.label}'s regime card, "
               f"{self.evaluations} simulator runs:",
               "settings: " + " ".join(f"{k}={_short(v)}" for k, v in self.settings.items()),
               f"{'entry'.ljust(width)}  target     fitted     residual (tolerance units; |r| <= 1 matches)"]
        for e, t in self.target.items():
            f = self.fitted[e]
            out.append(f"{e.ljust(width)}  {_short(t).ljust(9)}  {('-' if f is None else _short(f)).ljust(9)}  "
                       f"{self.residuals[e]:+.2f}  {ENTRIES[e].meaning}")
        out.append("matched: every entry within its tolerance" if self.matched else
                   "not matched: the knobs cannot reach this card (best fit above)")
        return out


def read_fit(path) -> dict:
    """The settings a fit ran at (``--match``'s fit.json, ``Fit.record``), to run a sweep there (``cliplab sim
    --fitted``); a ValueError naming the file and what was expected."""
    from spec.records import read_json
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"fitted: {path} is {'a folder' if path.exists() else 'missing'}; expected the fit.json "
                         f"that cliplab sim --match writes")
    try:
        rec = read_json(path)
    except ValueError as exc:
        raise ValueError(f"fitted: {exc}") from None
    settings = rec.get("settings")
    if (rec.get("env") != ENV or not isinstance(settings, dict)
            or not all(isinstance(v, (int, float, str)) for v in settings.values())):
        raise ValueError(f"fitted: {path}: expected a fit record of cliplab sim --match (env {ENV!r}, settings "
                         f"{{name: number, text or true/false}})")
    return settings


def _short(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def fit(paths, label: str | None = None, algo: str | None = None, seeds: int = 3, steps: int | None = None,
        budget: int = 240, workers: int = 2, fixed: dict | None = None, previous: dict | None = None) -> Fit:
    """Fit ``KNOBS`` to the target's card within ``budget`` simulator runs (of ``seeds`` stacked seeds and
    ``steps`` steps: by default the target's logged steps, at most 300). ``previous``: an earlier fit's record;
    asked the same (the same target card, algorithm, budget, seeds, steps and fixed settings), it is returned as
    it is, since the fit is deterministic and would find the same again. The search stops at the first generation
    whose best point matches (every residual within its tolerance): the budget is a ceiling. A bar on stderr shows
    the search, a generation at a time, with the best point's sum of squared residuals."""
    from scipy.optimize import differential_evolution

    from spec.registry import ALGORITHMS
    knob_list = [k for k in knobs() if k.key not in (fixed or {})]
    if budget < len(knob_list):  # the first population holds one point per knob fitted
        raise ValueError(f"match-budget: expected at least {len(knob_list)} simulator runs (one per knob fitted: "
                         f"{', '.join(k.key for k in knob_list)}), got {budget}")
    label, target_algo, target = target_card(paths, label)
    algo = algo or (target_algo if target_algo in ALGORITHMS else "grpo")
    if steps is None:
        steps = min(300, max(len(r["records"]) for r in _runs(paths) if r["label"] == label))
    inputs = {"target": target, "algo": algo, "budget": budget, "seeds": seeds, "steps": steps,
              "fixed": dict(fixed or {}), "knobs": [{**asdict(k), "choices": list(k.choices)} for k in knobs()]}
    if previous is not None and previous.get("label") == label and previous.get("inputs") == inputs:
        return Fit.from_record(previous)
    objective = Objective(algo, target, knob_list, seeds, steps, dict(fixed or {}))
    # scipy's population is popsize x the number of knobs: small, so that the budget buys generations
    popsize = 2 if budget >= 4 * len(knob_list) else 1
    generations = max(0, budget // (popsize * len(knob_list)) - 1)
    population = popsize * len(knob_list)
    cards: dict = {}  # each point's card, by its settings: the stop test and the result read them

    def key(x) -> tuple:
        return tuple(sorted(objective.settings(x).items()))

    with contextlib.ExitStack() as stack, tqdm(total=(generations + 1) * population, desc=f"fit {ENV} to {label}",
                                               unit="run", file=sys.stderr) as bar:
        mapper = stack.enter_context(multiprocessing.Pool(workers)).map if workers > 1 else map

        def evaluate(_, points):  # scipy's map (``workers``): each point's card, computed by the pool, kept here
            points = list(points)
            keys = [key(x) for x in points]
            cards.update(zip(keys, mapper(objective.card, points)))
            return [objective.loss(cards[k]) for k in keys]

        def generation_done(intermediate_result):  # the first call follows the first population's and generation's
            bar.update(population if bar.n else 2 * population)
            bar.set_postfix_str(f"best sum of squared residuals {intermediate_result.fun:.3g}")
            return matches(objective.residuals_of(cards[key(intermediate_result.x)]))  # True stops the search
        result = differential_evolution(objective, [k.bounds() for k in knob_list], popsize=popsize,
                                        maxiter=generations, integrality=[k.integral for k in knob_list],
                                        rng=0, polish=False, tol=0.0, workers=evaluate, updating="deferred",
                                        callback=generation_done)
        bar.total = bar.n = int(result.nfev)  # fewer than the budget where a generation matched
        bar.refresh()
    card = cards[key(result.x)]
    settings = objective.settings(result.x)  # the fixed settings with the fitted: what the card was fitted at
    return Fit(label, algo, settings, target, card, objective.residuals_of(card), int(result.nfev), inputs)
