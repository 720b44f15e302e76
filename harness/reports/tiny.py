"""The tiny tier's report (reports/tiny/README.md): the character-level Llama of configs/tiny trained by RL through
gpu/train.py, one folder a run (reports/tiny/runs_regime/<config>/seed<k>/: config.json, metrics.jsonl), with the
regime card every claim's conditions read (``harness.reports.regime``).

The papers' claims are decided exactly as the simulator's report decides them (``harness.reports.claims.run_claims``:
discovery seeds 0-4, replication seeds 5-9, Holm's correction across a set's tests), each beside the simulator's
verdict on it (the records of the simulator's claims.json, environment ``SIM_ENV``: at settings fitted to this
tier's card, reports/tiny/sim, once reports/tiny/simulate.sh has run) and whether that verdict's kind is
this tier's; the agreement rate over the claims both measured; for each disagreement the metrics that moved between
the two tiers; and DCPO's RUR gain over GRPO split between its reward scheme and SAS (``dcpo_binary_reward``,
``dcpo_no_sas``). ``python -m harness.reports.tiny`` regenerates it.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from sim.metrics import summarise_run
from sim.sweep import label_of
from spec.records import read_json, write_text
from spec.regime import ENTRIES, HEADROOM, MAX_STEPS, TINY_CHAR_PRIORS, WELL_FORMED
from spec.registry import ALGORITHMS

from harness.reports.claim_record import ClaimRecord, Kind, RunSet, card_gap, card_names
from harness.reports.claim_render import JSON_NAME, cell, prose, read_claims, summary_lines, write_claims
from harness.reports.claims import run_claims
from harness.reports.regime import FIT_FILE, CardValue, card_lines, entry_value, label_card, run_set_card
from harness.reports.rundirs import Groups, fmt, load_runs, md, output_file
from harness.reports.ranking import rankings
from harness.reports.sim import plot_lines, ranking_lines
from harness.reports.stats import paired_test, proportion_interval, share_interval, t_interval

DISCOVERY = frozenset(range(5))  # seeds 0-4 decide; every other seed (5-9) replicates
SIM_ENV = "feature_lm"  # the simulator's environment whose verdicts are the prediction (shared parameters, like an LM)
#: The trainer's reward names under the simulator's: the same (correct, wrong, malformed) rewards
#: (gpu.rewards.OUTCOMES, sim.config.REWARD_SCHEMES; tests/test_tiny_report.py holds it).
REWARD_NAMES = {"accuracy": "binary", "dapo": "pm1", "dcpo": "ternary"}
#: Per algorithm, the settings its claims compare with GRPO's at a stated value, which the simulator's sweep names for
#: both algorithms (CISPO against GRPO with the KL penalty off: `cliplab sim --algos grpo,cispo --set beta=0`;
#: claims.same_setting pairs labels whose params are equal) while a tiny config names only what departs from its
#: algorithm's registry defaults (cispo.yaml leaves beta at CISPO's 0, grpo_beta0.yaml names GRPO's beta 0; Clip-Cov
#: and KL-Cov against grpo_cov_baseline.yaml, GRPO at their beta 0 and token mean with both selection ratios named).
COV_SHARED = ("beta", "agg", "clip_cov_ratio", "kl_cov_ratio")
SHARED_WITH_GRPO = {"cispo": ("beta",), "clip_cov": COV_SHARED, "kl_cov": COV_SHARED}
DEFAULT_PRIOR = "tiny_char"  # the tier's prior where a config names no other (configs/tiny/model.yaml: exploration)
NO_UPPER_CLIP = 100.0  # the simulator's eps_high for "no upper clip"; a larger one bounds nothing more either
MAIN = ("grpo", "dr_grpo", "dapo", "gspo", "dcpo", "sapo", "cispo")
PLANNED_STEPS, SWEEP_HOURS = 300, 6.0  # the runs' length the tier aims at, and the sweep's time budget
SEEDS_PLANNED = 10  # discovery and replication seeds of every setting (reports/tiny/run_sweep.sh)
LANES = 2  # the sweep's runs side by side (reports/tiny/run_sweep.sh)


def _on_both_priors(config: str, sweep: str, algo: str, **setting) -> dict:
    """``config`` and its _sharpening twin with their counterparts: the sweep's _exploration and _sharpening runs
    of ``algo`` at ``setting``, labelled as the simulator labels them (``sim.sweep.label_of``)."""
    return {config: (f"{sweep}_exploration", label_of(algo, setting)),
            f"{config}_sharpening": (f"{sweep}_sharpening", label_of(algo, {**setting, "explore": "sharpening"}))}


#: Clip-Cov's and KL-Cov's settings, which reports/tiny/simulate.sh gives GRPO beside them (grpo_cov_baseline.yaml).
COV_SETTING = {"agg": "token_mean", "beta": 0, "clip_cov_ratio": 0.0002, "kl_cov_ratio": 0.002}
#: Each tiny label's counterpart in the simulator's summaries at the fitted settings
#: (reports/tiny/sim/summaries/<SIM_ENV>_<sweep>.json, sweeps of reports/tiny/simulate.sh).
SIM_LABELS = {**{a: ("main", a) for a in MAIN},
              **_on_both_priors("grpo_beta0", "clip_higher", "grpo", beta=0, eps_high=0.2),
              **_on_both_priors("grpo_beta0_eps_high028", "clip_higher", "grpo", beta=0, eps_high=0.28),
              **_on_both_priors("grpo_beta0_unclipped", "clip_higher", "grpo", beta=0, eps_high=100),
              **_on_both_priors("clip_cov", "cov", "clip_cov", **COV_SETTING),
              **_on_both_priors("kl_cov", "cov", "kl_cov", **COV_SETTING),
              **_on_both_priors("grpo_cov_baseline", "cov", "grpo", **COV_SETTING),
              **_on_both_priors("sapo_tau_reversed", "sapo_reversed", "sapo", tau_pos=1.05, tau_neg=1.0),
              **{f"{a}_sharpening": ("sharpening", label_of(a, {"explore": "sharpening"})) for a in ("grpo", "sapo")},
              "dcpo_binary_reward": ("dcpo_binary", label_of("dcpo", {"reward": "binary"}))}
#: Per claim (its id in claims.CLAIMS): the labels it compares and the metrics (sim.metrics summary keys) through
#: which it acts, compared between the tiers where the verdicts differ.
MECHANISMS = {
    "entropy_collapse": (("grpo", "dapo"), ("entropy_initial", "entropy_final", "accuracy", "zero_grad_frac")),
    "dcpo_tcr": (("dcpo", "grpo", "dapo"), ("clip_frac", "clip_up_frac", "clip_low_frac", "decision_dev_q50")),
    "dcpo_rur": (("dcpo", "grpo"), ("rur", "zero_grad_frac", "accuracy")),
    "clip_higher": (("grpo_beta0", "grpo_beta0_eps_high028", "grpo_beta0_unclipped"),
                    ("entropy_final", "clip_up_frac", "upclip_pold_median", "freed_frac", "decision_dev_q50")),
    "gspo_clips": (("gspo", "grpo"), ("clip_frac", "decision_dev_q50")),
    "drgrpo_length": (("dr_grpo", "grpo"), ("len_wrong", "resp_len", "accuracy")),
    "sapo_temperatures": (("sapo", "sapo_tau_reversed"), ("decision_dev_q50", "accuracy", "entropy_final")),
    "dynamic_sampling": (("dapo",), ("gen_per_trained", "zero_grad_frac", "accuracy")),
    "dcpo_accuracy": (("dcpo", "gspo", "grpo", "dapo"), ("accuracy",)),
    "dcpo_reward": (("dcpo", "dcpo_binary_reward"), ("accuracy", "zero_grad_frac", "rur")),
    "cispo": (("cispo", "grpo"), ("accuracy", "decision_dev_q50")),
}
TABLE = (("accuracy", "accuracy, last 10% of steps"), ("entropy_final", "entropy, last step"), ("clip_frac", "TCR"),
         ("clip_up_frac", "up-clipped share"), ("rur", "RUR"), ("zero_grad_frac", "all-equal groups"),
         ("decision_dev_q50", "median |r - 1| on decision tokens"), ("len_wrong", "length of wrong answers"),
         ("gen_per_trained", "generations per trained response"))
PANELS = ("accuracy", "entropy", "clip_frac", "rur", "zero_grad_frac", "resp_len")
VARIANT_PANELS = ("entropy", "clip_up_frac", "rur", "zero_grad_frac", "accuracy", "decision_dev_q50")


# ---- runs -------------------------------------------------------------------------------------------------------
def _params(algo: dict, model: dict, train: dict) -> dict:
    """The settings a run's config names, under the simulator's names (what the claims compare): its loss
    hyper-parameters, its reward scheme and advantage where it chose them (not "auto"), the prior's exploration
    setting (``explore``, spec.regime.TINY_CHAR_PRIORS) where the model is a tiny_char prior other than the tier's
    default, a stale sampler (``staleness``) and pi_old recomputed by the policy (``old_logp``) where set; and the
    settings (``SHARED_WITH_GRPO``) that the simulator's sweep names for both sides of a comparison with GRPO, at
    the registry default where the config leaves them."""
    defaults = ALGORITHMS[algo["name"]].defaults if algo.get("name") in ALGORITHMS else {}
    params = {k: defaults[k] for k in SHARED_WITH_GRPO.get(algo.get("name"), ()) if k in defaults}
    params.update(algo.get("hp") or {})
    if params.get("eps_high", 0) >= NO_UPPER_CLIP:
        params["eps_high"] = NO_UPPER_CLIP
    if algo.get("reward", "auto") != "auto":
        params["reward"] = REWARD_NAMES.get(algo["reward"], algo["reward"])
    if algo.get("advantage", "auto") != "auto":
        params["adv"] = algo["advantage"]
    if model.get("name") in TINY_CHAR_PRIORS and model["name"] != DEFAULT_PRIOR:
        params["explore"] = TINY_CHAR_PRIORS[model["name"]]
    if train.get("staleness"):
        params["staleness"] = train["staleness"]
    if train.get("old_logp", "sampler") != "sampler":
        params["old_logp"] = train["old_logp"]
    return params


def load_tiny(runs_dir) -> list[dict]:
    """Every run under ``runs_dir``/<config>/seed<k>/ as the claims read it: labelled by its config's name, its
    settings under the simulator's names, in the discovery set (seeds 0-4) or the replication set; each with its
    run summary (``sim.metrics.summarise_run``: the simulator's definitions)."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise ValueError(f"runs: {runs_dir} is {'a file' if runs_dir.exists() else 'missing'}; expected the tiny "
                         f"tier's runs folder (<config>/seed<k>/)")
    runs = []
    for folder in sorted(runs_dir.glob("*/seed*/")):
        if not (folder / "metrics.jsonl").exists():
            continue
        for run in load_runs([folder]):
            cfg = read_json(folder / "config.json")
            if not isinstance(cfg.get("algo"), dict) or not isinstance(cfg.get("run", {}).get("seed"), int):
                raise ValueError(f"{folder / 'config.json'}: expected a config written by cliplab train (algo, "
                                 f"run.seed)")
            seed = cfg["run"]["seed"]
            params = _params(cfg["algo"], cfg.get("model") or {}, cfg.get("train") or {})
            runs.append({**run, "label": folder.parent.name, "params": params, "seed": seed,
                         "set": "discovery" if seed in DISCOVERY else "replication", "cfg": cfg,
                         "summary": summarise_run(run["records"])})
    if not runs:
        raise ValueError(f"runs: no <config>/seed<k>/ folders with config.json and metrics.jsonl under {runs_dir}")
    return sorted(runs, key=lambda r: (r["label"], r["seed"]))


def _by_label(runs: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict = {}
    for r in runs:
        out.setdefault(r["label"], {})[r["seed"]] = r
    return out


def _cell(values, pct: bool = False) -> str:
    iv = t_interval(values)
    if iv.n == 0:
        return "n/a"
    return fmt(iv.mean, pct=pct) if iv.n < 2 else fmt(iv.mean, iv.half, pct=pct)


def summary_table(runs: list[dict]) -> list[str]:
    """One row per metric, one column per label: mean ± 95% t half-width over its seeds."""
    by = _by_label(runs)
    labels = [lbl for lbl in Groups(runs).labels()]
    lines = ["| metric | " + " | ".join(f"{md(lbl)} ({len(by[lbl])})" for lbl in labels) + " |",
             "|---" * (len(labels) + 1) + "|"]
    for key, what in TABLE:
        cells = [_cell([r["summary"].get(key) if r["summary"].get(key) is not None else np.nan
                        for r in by[lbl].values()]) for lbl in labels]
        lines.append(f"| {md(what)} | " + " | ".join(cells) + " |")
    return lines


# ---- claims against the simulator ---------------------------------------------------------------------------------
def sim_record(sim: list[ClaimRecord], rec: ClaimRecord) -> ClaimRecord | None:
    """The simulator's record for a claim and regime: the same regime; else, of the claim's records of the same kind
    (a verdict or a mechanism row) and, where both name algorithms, the same algorithm, the one whose regime shares
    the most settings with this one (TIS with TIS under another mismatch), the first (the simulator's default
    regime) among equals."""
    rows = [r for r in sim if r.claim.id == rec.claim.id]
    same = [r for r in rows if r.regime == rec.regime]
    if same:
        return same[0]
    rows = [r for r in rows if r.mechanism == rec.mechanism]
    if rec.algorithm and any(r.algorithm for r in rows):
        rows = [r for r in rows if r.algorithm == rec.algorithm]
    settings = set(rec.regime.split(", "))
    return max(rows, key=lambda r: len(settings & set(r.regime.split(", "))), default=None)


def predicted(rec: ClaimRecord, sim: ClaimRecord | None) -> str | None:
    """"yes" / "no": does the simulator's verdict have this tier's kind, where both tiers can test the claim at a
    matching regime card; None where either did not measure it (or measured it on its discovery seeds only, or the
    row has no verdict of its own), either reads "not testable here" on a seed set, or their cards differ
    (``not_compared``)."""
    if not_compared(rec, sim) is not None:
        return None
    return "yes" if rec.kind is sim.kind else "no"


#: How the agreement rate counts.
COMPARED = ("A prediction counts where the verdicts have the same kind (reproduced, partly, not reproduced, "
            "reversed, not detectable, not replicated). Claims are compared only where both tiers measured them on "
            "both seed sets, the claim's regime conditions hold on each seed set of each tier (neither reads \"not "
            "testable here\", on either set), and the regime card entries both record lie "
            "within their tolerances (a factor of 2 for shares and ratio movements, 0.1 for accuracies and "
            "entropy falls); the table says why a claim is not compared.")


#: What "predictable from the fit?" says.
ADVANCE = ("\"Predictable from the fit?\" is said before any verdict is compared, from the fit alone: a claim whose "
           "regime conditions read a card entry the fitted simulator could not reach (its residual beyond -1 to 1 "
           "tolerance units) is not expected to be predicted.")


def untestable_set(r: ClaimRecord) -> str | None:
    """The seed set of ``r`` whose regime card fails a condition of the claim, and the failing value ("replication
    seeds (grpo's malformed_max is ...)"); None where the conditions hold on each set. Such a record's "not
    replicated" is a regime that did not hold on one set, not a verdict that changed."""
    for name, part, why in (("discovery", r.discovery, r.reason), ("replication", r.replication, None)):
        if part is not None and part.verdict.kind is Kind.NOT_TESTABLE:
            why = why if why is not None else part.verdict.note
            return f"{name} seeds" + (f" ({why})" if why else "")
    return None


def not_compared(rec: ClaimRecord, sim: ClaimRecord | None) -> str | None:
    """Why a claim's verdicts are not compared between this tier and the simulator; None where they are."""
    if sim is None:
        return "no simulator record"
    if not rec.comparable or not sim.comparable:
        return "not measured on both seed sets in both tiers"
    if Kind.NOT_TESTABLE in (rec.kind, sim.kind):
        return "not testable in " + ("both tiers" if rec.kind is sim.kind else
                                     "this tier" if rec.kind is Kind.NOT_TESTABLE else "the simulator")
    for tier, r in (("this tier", rec), ("the simulator", sim)):
        if (why := untestable_set(r)) is not None:
            return f"not testable on {tier}'s {why}"
    gap = card_gap(rec, sim)
    return None if gap is None else f"{gap} (this tier, the simulator)"


def fit_misses(sim_dir: Path) -> dict[str, float]:
    """The card entries the simulator's fit to this tier (sim_dir/fit.json) could not reach: entry -> residual in
    tolerance units (beyond -1 to 1); empty where there is no fit."""
    path = Path(sim_dir) / FIT_FILE
    if not path.exists():
        return {}
    return {e["entry"]: e["residual"] for e in read_json(path)["entries"] if abs(e["residual"]) > 1}


def missed_conditions(rec: ClaimRecord, misses: dict[str, float]) -> list[str]:
    """The card entries the claim's regime conditions read (their ``across`` entries too) that the fit could not
    reach: where there are any, the fitted simulator is not expected to predict the claim."""
    return sorted(card_names(c.condition for c in rec.conditions) & set(misses))


def said_in_advance(rec: ClaimRecord, misses: dict[str, float]) -> str:
    """Whether the fitted simulator can predict this claim, said from the fit alone, before any verdict is compared
    (``missed_conditions``)."""
    read = missed_conditions(rec, misses)
    if read:
        return "no: the fit misses " + ", ".join(f"{e} ({misses[e]:+.1f})" for e in read)
    return "yes" if rec.conditions else "yes (no card condition)"


def sim_claims(sim_dir: Path) -> list[ClaimRecord]:
    """The simulator's records of ``SIM_ENV`` (``sim_dir``/claims.json); none where the report has no claims.json."""
    path = sim_dir / JSON_NAME
    if not path.exists():
        return []
    return [r for s in read_claims(path) if s.name == SIM_ENV for r in s.records]


def _sim_summaries(sim_dir: Path) -> dict:
    out = {}
    for sweep in {s for s, _ in SIM_LABELS.values()}:
        path = sim_dir / "summaries" / f"{SIM_ENV}_{sweep}.json"
        out[sweep] = read_json(path)["algorithms"] if path.exists() else {}
    return out


MOVED = 4  # the mechanism metrics named per disagreement


def what_moved(claim: str, by: dict, sims: dict) -> str:
    """The mechanism metrics (MECHANISMS) of the claim with id ``claim`` in this tier (mean over its seeds) against
    the simulator's (its summary's mean): the MOVED largest relative moves (|log ratio|), largest first."""
    found = MECHANISMS.get(claim)
    if found is None:
        return ""
    moves = []
    for label in found[0]:
        if label not in by:
            continue
        sweep, sim_label = SIM_LABELS.get(label, (None, None))
        sim = sims.get(sweep, {}).get(sim_label, {})
        for key in found[1]:
            tiny = t_interval([np.nan if r["summary"].get(key) is None else r["summary"][key]
                               for r in by[label].values()]).mean
            other = sim.get(key)
            other = float("nan") if other is None else float(other)
            with np.errstate(divide="ignore", invalid="ignore"):
                move = abs(np.log(tiny / other)) if tiny > 0 and other > 0 else (np.inf if tiny != other else 0.0)
            moves.append((move if np.isfinite(tiny) and np.isfinite(other) else -1.0, label, key, tiny, other))
    moves.sort(key=lambda m: -m[0])
    parts = [f"{label} {key} {fmt(tiny)} vs {fmt(other)}" for _, label, key, tiny, other in moves[:MOVED]]
    return "what moved most (this tier vs the simulator): " + "; ".join(parts) if parts else ""


def tier_records(runs: list[dict]) -> RunSet:
    """This tier's records: a claim the tier's runs lack names the sweep that runs it, not the simulator's command."""
    rs = run_claims(runs)
    missing = "not in this tier's runs yet (reports/tiny/run_sweep.sh, configs/tiny)"
    return replace(rs, records=tuple(replace(r, command=None, reason=f"{r.reason}; {missing}")
                                     if r.kind is Kind.NOT_MEASURED else r for r in rs.records))


def claims_lines(rs: RunSet, runs: list[dict], sim_dir) -> list[str]:
    """The claims table with this tier's verdicts, the simulator's and whether it predicted them (linked to the
    details in claims.md); the claims not measured or not testable here; the agreement rate; each disagreement with
    what moved."""
    sim_dir = Path(sim_dir)
    sim, misses = sim_claims(sim_dir), fit_misses(sim_dir)
    sims, by = _sim_summaries(sim_dir), _by_label(runs)
    (n_d, n_r), (s_d, s_r) = rs.tests, rs.seeds

    def beside(rec: ClaimRecord) -> list[str]:  # the simulator's verdict and whether it predicted this tier's
        other = sim_record(sim, rec)
        said = predicted(rec, other)
        return [cell(said_in_advance(rec, misses)),
                (f"**{cell(other.verdict_text())}**" + (f" ({cell(other.regime)})" if other.regime else "")
                 if other else "no record"), said or f"not compared: {cell(not_compared(rec, other))}"]
    agree, disagree = [], []
    lines = [f"Discovery seeds {s_d} ({n_d} tests, Holm-adjusted together); replication seeds {s_r or 'none'} "
             f"({n_r} tests).", ""]
    table = summary_lines(rs, extra=(("predictable from the fit?", f"simulator ({SIM_ENV})", "simulator predicted?"),
                                     beside))
    for rec in rs.records:
        other = sim_record(sim, rec)
        said = predicted(rec, other)
        if said == "yes":
            agree.append(rec)
        elif said == "no":
            disagree.append((rec, other, what_moved(rec.claim.id, by, sims)))
    lines += table
    n = len(agree) + len(disagree)
    if n:
        lo, hi = proportion_interval(len(agree), n)
        fore = [r for r in agree + [d[0] for d in disagree] if not missed_conditions(r, misses)]
        hits = sum(r in agree for r in fore)
        lines += [f"**The simulator predicted {len(agree)} of the {n} verdicts both tiers could test at a matching "
                  f"regime card ({fmt(len(agree) / n, pct=True)}; exact 95% interval {fmt(lo, pct=True)} to "
                  f"{fmt(hi, pct=True)}); of the {len(fore)} said predictable from the fit in advance, "
                  f"{hits}.** {COMPARED} {ADVANCE}", ""]
    else:
        lines += [f"**No claim could be compared: none was tested by both tiers at a matching regime card.** "
                  f"{COMPARED} {ADVANCE}", ""]
    if disagree:
        lines += ["Disagreements, each with what moved (means over this tier's seeds against the simulator's "
                  f"summary in {md(str(sim_dir))}/summaries/{SIM_ENV}_*.json; n/a: not logged, or no counterpart "
                  "run):", ""]
        lines += [f"- {prose(rec.claim.text)}{f' ({prose(rec.regime)})' if rec.regime else ''}: here "
                  f"**{prose(rec.verdict_text())}**, simulator **{prose(other.verdict_text())}**; "
                  f"{prose(moved) or 'no mechanism metrics listed'}" for rec, other, moved in disagree]
        lines.append("")
    return lines


# ---- the exploration axis -------------------------------------------------------------------------------------
#: The claims measured on both priors, and the run whose card says where each prior's up-clipped tokens sit.
AXIS_CLAIMS = ("clip_higher", "cov_entropy", "sapo_temperatures")
AXIS_BASELINES = {"exploration": "grpo_beta0", "sharpening": "grpo_beta0_sharpening"}


#: The card's share of up-clipped tokens below pi_old 0.2 over the first tenth of the steps, beside its first 100.
FIRST_TENTH_UPCLIP = replace(ENTRIES["upclip_pold_lt02"], window="start")


def transient_line(shares: tuple[CardValue, CardValue] | None) -> list[str]:
    """Where the exploration prior's up-clipped tokens are exploration tokens at first and not over the card's
    first 100 steps: the sentence that says so, with both shares (else nothing)."""
    if shares is None or any(v.value is None for v in shares) or not shares[0].value >= 0.5 > shares[1].value:
        return []
    first, early = (v.text("upclip_pold_lt02") for v in shares)
    return ["", f"On the exploration prior that regime is where a run starts, not where it stays: {first} of the "
            f"up-clipped tokens are below pi_old 0.2 over the first tenth of the steps, {early} over the first 100. "
            "RL raises the prior's exploration digits past 0.2 within those steps, and the tokens the upper clip "
            "holds are then the ones still climbing. A run has exploration tokens to clip only while it has new "
            "ones to find: this prior has one per slip pair (configs/tiny/model.yaml), a long chain of thought "
            "many more."]


def run_on_share(runs: list[dict]) -> str:
    """What the tier's malformed responses are: the share of them that reached the token budget without EOS."""
    steps = [rec for run in runs for rec in run["records"]]
    malformed = sum(rec.get("malformed") or 0.0 for rec in steps)
    if not malformed or not any("truncated_frac" in rec for rec in steps):
        return "the runs do not log which malformed responses ran to the token budget"
    truncated = sum(rec.get("truncated_frac") or 0.0 for rec in steps)
    return f"{fmt(truncated / malformed, pct=True)} of the malformed responses here ran to the token budget without EOS"


def axis_lines(rs: RunSet, runs: list[dict], cards: dict) -> list[str]:
    """Each exploration-axis claim's verdict per prior, beside the share of up-clipped tokens below pi_old 0.2
    that GRPO (beta 0) measured on that prior (``cards``: the run set's, ``run_set_card``): the condition under
    which each paper's effect appears, and how a reader checks it on a run of their own."""
    params = {r["label"]: r["params"] for r in runs}
    default = TINY_CHAR_PRIORS[DEFAULT_PRIOR]

    by_label: dict[str, list[dict]] = {}
    for r in runs:
        by_label.setdefault(r["label"], []).append(r)
    shares = {setting: (entry_value(by_label[label], FIRST_TENTH_UPCLIP), cards[label]["upclip_pold_lt02"])
              for setting, label in AXIS_BASELINES.items() if label in cards}

    def share(setting: str) -> str:
        if setting not in shares:
            return "not run"
        return " / ".join(v.text("upclip_pold_lt02") for v in shares[setting])
    def run_on(labels) -> str:  # each compared setting's seeds past the well-formed regime
        counts = []
        for label in labels:
            seeds = [entry_value([run], ENTRIES[WELL_FORMED.entry]).value for run in by_label.get(label, [])]
            counts.append(f"{md(label)} {sum(not WELL_FORMED.holds(v) for v in seeds if v is not None)}/{len(seeds)}")
        return ", ".join(counts)
    rows = [r for r in rs.records if r.claim.id in AXIS_CLAIMS and r.compared]
    lines = ["The exploration prior puts the digits RL must raise below pi_old 0.2, at positions whose other mass is "
             "spread over five wrong digits; the sharpening prior puts them at 0.3-0.6 against one wrong digit. "
             "Each claim below is measured on both; the last column is the card's upclip_pold_lt02 of GRPO (beta 0) "
             "on that prior, the share of up-clipped tokens below pi_old 0.2 (DAPO Fig. 3a's exploration tokens). "
             "To check which regime a run of your own is in, read the same entry of its regime card: cliplab's "
             "trainer logs `upclip_pold_lt02` each step, and `cliplab report RUN_DIR --algo RUN_DIR=grpo` prints "
             "the card (verl's and TRL's logs lack the entry: their card reads \"not logged\"). At 0.5 or more "
             "the upper clip holds mostly exploration tokens; below it, mostly tokens that are already likely.",
             *transient_line(shares.get("exploration")), "",
             f"The last column counts, for each setting a claim compares, the seeds whose malformed share passed "
             f"{WELL_FORMED.threshold:.0%} over some {MAX_STEPS} steps (the card's malformed_max; "
             f"{run_on_share(runs)}): "
             "these claims' conditions read the card of their baseline, so where a compared setting runs on, its "
             "comparison also reads that run-on.",
             "", "| claim | regime | verdict | prior | up-clipped tokens below pi_old 0.2: first tenth of the steps / "
             f"first 100 (the card's) | seeds above {WELL_FORMED.threshold:.0%} malformed |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        setting = params.get(r.compared[0], {}).get("explore", default)
        lines.append(f"| {cell(r.claim.text)} | {cell(r.regime) or '-'} | **{cell(r.verdict_text())}** | {setting} | "
                     f"{share(setting)} | {run_on(r.compared)} |")
    return lines + [""] if rows else ["Not measured: none of " + ", ".join(AXIS_CLAIMS) + " has runs here yet.", ""]


# ---- the simulator fitted to this tier's card ----------------------------------------------------------------
FITTED_SIM = Path("reports/tiny/sim")  # reports/tiny/simulate.sh: the fit (fit.json) and the sweeps at its settings
DEFAULT_SIM = Path("reports/sim")  # the simulator's own report, at its defaults


def simulator_dir(fitted=FITTED_SIM, default=DEFAULT_SIM) -> Path:
    """The simulator report beside this tier: the one at settings fitted to this tier's card where it exists
    (``fitted``/claims.json), else the simulator's report at its defaults."""
    return Path(fitted) if (Path(fitted) / JSON_NAME).exists() else Path(default)


def fit_lines(sim_dir: Path) -> list[str]:
    """The fit of the simulator to this tier's card (sim_dir/fit.json, written by ``cliplab sim --match``): its
    settings and, per card entry, this tier's value, the simulator's and the residual in tolerance units; or what
    the claims column reads instead."""
    path = Path(sim_dir) / FIT_FILE
    if not path.exists():
        return [f"Not fitted yet: the simulator column reads {md(str(sim_dir))}, the simulator at its own defaults. "
                "`reports/tiny/simulate.sh` fits it to this tier's card and reruns its sweeps there.", ""]
    fit = read_json(path)
    settings = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fit["settings"].items())
    lines = [f"`cliplab sim --match` fitted {fit['env']}'s knobs to the card of this tier's {md(fit['label'])} runs "
             f"in {fit['evaluations']} simulator runs: {settings}. "
             + ("Every entry lies within its tolerance." if fit["matched"] else
                "**Not matched**: the knobs cannot reach this card; the claims column is the best fit's."), "",
             "| entry | this tier | simulator, fitted | residual (tolerance units; within -1 to 1 matches) |",
             "|---|---|---|---|"]
    for e in fit["entries"]:
        fitted = "-" if e["fitted"] is None else fmt(e["fitted"])
        lines.append(f"| {e['entry']} | {fmt(e['target'])} | {fitted} | {e['residual']:+.2f} |")
    return lines + [""]


# ---- DCPO's RUR gain: reward scheme against SAS ---------------------------------------------------------------
ATTRIBUTION = ("dcpo", "dcpo_binary_reward", "dcpo_no_sas", "grpo")


def _paired_values(by: dict, labels, value) -> tuple[list[int], list[np.ndarray]]:
    seeds = sorted(set.intersection(*(set(by[lbl]) for lbl in labels)))
    return seeds, [np.array([value(by[lbl][s]) for s in seeds], float) for lbl in labels]


def _part(part: np.ndarray, gain: np.ndarray | None = None) -> str:
    """A paired difference's mean ± 95% t half-width (p: against no difference) and, given the gain, its share of
    it with a bootstrap interval."""
    c = paired_test(np.zeros_like(part), part)
    if c.kind == "too few":
        return "n/a"
    out = fmt(c.diff, c.half, pct=True) + (f" (p {c.p:.2g})" if c.kind == "paired" else f" ({c.kind})")
    if gain is not None:
        share, lo, hi = share_interval(part, gain)
        out += f"; share of the gain {fmt(share, pct=True)} [{fmt(lo, pct=True)}, {fmt(hi, pct=True)}]"
    return out


def attribution_lines(runs: list[dict]) -> list[str]:
    """DCPO's RUR gain over GRPO, paired by seed, and the parts of it its +1/0/-1 reward (DCPO minus DCPO with the
    binary reward) and SAS (DCPO minus DCPO without SAS) account for, with 95% intervals: over all steps, and at
    step 1, where SAS has no history yet."""
    by = _by_label(runs)
    missing = [lbl for lbl in ATTRIBUTION if lbl not in by]
    if missing:
        return [f"Not measured: no runs of {', '.join(missing)} yet."]
    lines = ["| RUR | dcpo | dcpo_binary_reward | dcpo_no_sas | grpo | gain (dcpo - grpo) | reward scheme "
             "(dcpo - dcpo_binary_reward) | SAS (dcpo - dcpo_no_sas) | rest (gain - both) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, value in (("mean over steps", lambda r: r["summary"]["rur"]),
                        ("step 1", lambda r: r["records"][0].get("rur", np.nan))):
        seeds, (d, b, n, g) = _paired_values(by, ATTRIBUTION, value)
        gain, reward, sas = d - g, d - b, d - n
        cells = [_cell(x, pct=True) for x in (d, b, n, g)]
        cells += [_part(gain), _part(reward, gain), _part(sas, gain), _part(gain - reward - sas)]
        lines.append(f"| {name} ({len(seeds)} seeds) | " + " | ".join(cells) + " |")
    return lines + ["", _format_line(by), "",
                    "Each cell: mean ± 95% t half-width over the seeds every label ran (paired by seed; p: paired "
                    "t test against no difference). Shares: the part's mean over the gain's mean, with a 95% "
                    "percentile bootstrap interval over seeds (scipy.stats.bootstrap, paired). The rest is what "
                    "neither ablation removes alone: their interaction and DCPO's clip and loss acting through the "
                    "responses each policy samples. At step 1 every label of a seed has the same model and "
                    "prompts and SAS has no history, so there the gain is its reward's (+1/0/-1: an all-wrong "
                    "group with a malformed response is not all-equal)."]


def _format_line(by: dict) -> str:
    """The seeds of the attribution's labels whose runs leave the well-formed regime (the claims' WELL_FORMED
    condition on each run's malformed_max), where a RUR difference reads a format collapse as well."""
    entry = WELL_FORMED.entry
    out = []
    for lbl in ATTRIBUTION:
        values = {s: label_card([by[lbl][s]], [entry])[entry].value for s in sorted(by[lbl])}
        bad = {s: v for s, v in values.items() if v is not None and not WELL_FORMED.holds(v)}
        if bad:
            worst = max(bad, key=bad.get)
            out.append(f"{lbl} in {len(bad)} of {len(values)} seeds (seeds {', '.join(map(str, bad))}; up to "
                       f"{fmt(bad[worst], pct=True)}, seed {worst})")
    if not out:
        return f"Every run of these labels stays well formed ({WELL_FORMED.text()} on each)."
    return (f"**Outside the well-formed regime** ({entry} above {fmt(WELL_FORMED.threshold, pct=True)}: the "
            f"largest malformed share over {MAX_STEPS} consecutive steps): {'; '.join(out)}. In those seeds a "
            "label's RUR also reads its format collapse, not only its reward scheme or SAS.")


# ---- the report -----------------------------------------------------------------------------------------------
def _setting(runs: list[dict]) -> str:
    c = runs[0]["cfg"]
    d, r, t = c["data"], c["rollout"], c["train"]
    steps = sorted({len(run["records"]) for run in runs})
    models = sorted({run["cfg"]["model"]["name"] for run in runs})
    priors = ", ".join(f"{md(m)} ({TINY_CHAR_PRIORS[m]} prior)" if m in TINY_CHAR_PRIORS else md(m) for m in models)
    return (f"{len(runs)} runs: {len(_by_label(runs))} settings (configs/tiny/<name>.yaml) x seeds "
            f"{sorted({run['seed'] for run in runs})}, {'/'.join(map(str, steps))} steps each. Models {priors}; "
            f"{md(d['source'])} with {d['digits']} digits, a pool of {d['n']} prompts; "
            f"{r['prompts_per_step']} prompts x G = {r['group_size']}, {r['max_new_tokens']}-token budget, "
            f"T = {r['temperature']}; lr {t['lr']}, {t['epochs']} epoch(s) in minibatches of {t['minibatch_size']} "
            f"sequences. Each algorithm keeps its paper's reward, advantage and registry defaults.")


def length_line(runs: list[dict], cards: dict) -> str:
    """Why the runs have the length they have, from the runs' own step times and the card: the whole sweep's time
    at that length and at PLANNED_STEPS (two lanes), and whether GRPO's regime has ended by then (headroom)."""
    steps = max(len(run["records"]) for run in runs)
    times = [rec["step_time_s"] for run in runs for rec in run["records"] if "step_time_s" in rec]
    n_settings = len(_by_label(runs))
    n_runs = n_settings * SEEDS_PLANNED
    if times:
        per_step = float(np.median(times))
        lengths = sorted({steps, PLANNED_STEPS})
        at = " and ".join(f"{n_runs * n * per_step / LANES / 3600:.1f} h at {n} steps" for n in lengths)
        cost = (f"At the runs' median step time, {per_step:.2f} s (wall, {LANES} lanes side by side; the mean reads "
                f"the machine's other work too), the {n_runs} runs of the {n_settings} settings x {SEEDS_PLANNED} "
                "seeds "
                f"take {at}, against a {SWEEP_HOURS:g} h budget.")
    else:
        cost = "The runs log no step times, so the sweep's time is not measured here."
    heads = {label: cards[label]["headroom"].value for label in ("grpo", "grpo_sharpening")
             if label in cards and cards[label]["headroom"].value is not None}
    if not heads:
        return f"Runs are {steps} steps long. {cost} No GRPO run says whether the regime has ended."
    ended = [label for label, h in heads.items() if h < HEADROOM.threshold]
    return (f"Runs are {steps} steps long. {cost} At step {steps} GRPO's headroom reads "
            + ", ".join(f"{fmt(h, pct=True)} ({md(label)})" for label, h in heads.items())
            + (f": the regime has ended for {', '.join(map(md, ended))} (headroom below {HEADROOM.threshold:g})."
               if ended else f": the regime has not ended (headroom at least {HEADROOM.threshold:g}), so the runs "
               + (f"stop at the planned {PLANNED_STEPS}." if steps >= PLANNED_STEPS else
                  "stop for the time budget, not because the card shows nothing left to measure.")))


def write_readme(readme="reports/tiny/README.md", runs_dir="reports/tiny/runs_regime", sim=None) -> Path:
    """Regenerate the tiny tier's README and its plots from the run folders and the simulator's report (``sim``;
    by default ``simulator_dir()``)."""
    sim = Path(sim) if sim is not None else simulator_dir()
    readme = output_file(readme, "readme", inputs=[runs_dir])
    runs = load_tiny(runs_dir)
    records, cards = tier_records(runs), run_set_card(runs)
    groups = Groups(runs)
    main = [lbl for lbl in groups.labels() if lbl in MAIN]
    variants = [lbl for lbl in groups.labels() if lbl.startswith("grpo_beta0")]  # clip-higher, both priors
    png_main, png_var = readme.with_name("tiny_curves.png"), readme.with_name("tiny_variants.png")
    figures = plot_lines(groups, main, png_main, "tiny tier", panels=PANELS) if main else []
    if variants:
        figures += plot_lines(groups, variants, png_var, "tiny tier, clip-higher", panels=VARIANT_PANELS)
    lines = [
        "# Tiny tier: a character-level Llama trained by RL on 3-digit addition", "",
        "Regenerate this file from the run folders (reports/tiny/runs_regime/<config>/seed<k>/) and the simulator's "
        f"report ({md(str(sim))}): `python -m harness.reports.tiny`. The runs: `reports/tiny/run_sweep.sh` (resumable; "
        "configs/tiny).", "",
        _setting(runs), "",
        length_line(runs, cards), "",
        "Metrics have the simulator's names and definitions (sim/metrics.py; gpu/train.py logs them, "
        "gpu/step_metrics.py): accuracy is the share of sampled responses that are correct (the simulator's "
        "`accuracy`; where the simulator's claims read its exact expected accuracy, these read this sampled "
        "estimate of it), entropy the mean per-token entropy of the policy over the sampled responses' positions, "
        "averaged over the step's micro-batches (a sampled estimate of the simulator's exact expectation), TCR the "
        "token-weighted clipped share over the step's minibatch updates, RUR the share of trained responses with a "
        "non-zero advantage, all-equal groups the share of generated groups whose rewards are all equal.", "",
        "## Ranking: the seven algorithms at equal generated responses and at equal optimiser updates", "",
        *(ranking_lines(rankings([{**r, "dir": "main", "env": "tiny"} for r in runs if r["label"] in MAIN]))
          or ["Fewer than two of the seven algorithms have runs here yet.", ""]),
        "## Per setting (mean ± 95% t half-width over seeds; the header gives the seeds)", "",
        *summary_table(runs), "",
        *card_lines(cards),
        "## Where each effect appears: the exploration axis", "",
        *axis_lines(records, runs, cards),
        "## The simulator fitted to this tier's regime card", "",
        *fit_lines(sim),
        "## Claims: this tier beside the simulator", "",
        "Each claim is decided by the simulator report's code and statistics (harness/reports/claims.py) on the "
        "discovery seeds 0-4 and re-checked on the replication seeds 5-9: a verdict stands where both sets give "
        "it, else it reads \"not replicated\"; differences by paired t tests (Welch's where the seeds do not pair), "
        "Holm-corrected across a set's tests; \"not detectable with N seeds (smallest detectable effect X)\" is "
        "never \"no effect\". Each line links to its details (reports/tiny/claims.md: both seed sets, the regime "
        "card's conditions, the attribution); the records are reports/tiny/claims.json. The simulator column is the "
        f"verdict of the simulator's {SIM_ENV} record of the claim ({md(str(sim / JSON_NAME))}; its regime in "
        "brackets).", "",
        *claims_lines(records, runs, sim),
        "## DCPO's RUR gain: its reward scheme against SAS", "",
        *attribution_lines(runs), "",
        "## Curves (mean over seeds, min-max band; 10-step moving average)", "",
        *figures, ""]
    write_claims(readme.parent, [records], "Tiny tier", "`python -m harness.reports.tiny`")
    write_text(readme, "\n".join(lines))
    return readme


def main(argv=None) -> None:
    import argparse
    p = argparse.ArgumentParser(description="Regenerate reports/tiny/README.md from the tiny tier's run folders.")
    p.add_argument("--readme", default="reports/tiny/README.md")
    p.add_argument("--runs", default="reports/tiny/runs_regime")
    p.add_argument("--sim", default=None, help="the simulator's report beside this tier (default: reports/tiny/sim, "
                   "fitted to this tier's card, where it exists, else reports/sim)")
    a = p.parse_args(argv)
    try:
        print(write_readme(a.readme, a.runs, a.sim))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
