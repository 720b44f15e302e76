"""The real-model evidence section of reports/real/README.md: per-algorithm means with 95% confidence intervals over
seeds, paired-by-seed differences against GRPO, whether GSPO and SAPO still coincide, and the claims as records
(``harness.reports.claim_record``): one line per claim (published | simulator toy LM | simulator feature LM, from
reports/sim/claims.json | real LM)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.metrics import summarise_run
from spec.records import read_json, read_jsonl, read_text
from spec.regime import CLIP_BINDS, ENTROPY_FALLS, HEADROOM, OFF_POLICY, RATIOS_MOVE, UPPER_CLIP_BINDS

from harness.reports.claim_record import (CardCheck, ClaimRecord, Estimate, Kind, RunSet, SetResult, Verdict,
                                          checks_on, regime_checked)
from harness.reports.claim_render import JSON_NAME, anchor, cell, effect, prose, read_claims
from harness.reports.claims import CLAIMS as SIM_CLAIMS
from harness.reports.regime import label_card
from harness.reports.rundirs import ALIASES, fmt, md
from harness.reports.stats import Comparison, holm, paired_test, t_interval

#: the evidence runs (configs/evidence/<name>.yaml): the algorithms, then settings that test one claim each
#: (SAPO's temperatures reversed; clip-higher on GRPO without its KL penalty)
ALGOS = ("grpo", "dr_grpo", "dapo", "gspo", "dcpo", "sapo", "cispo", "clip_cov")
VARIANTS = ("sapo_tau_reversed", "grpo_beta0", "grpo_beta0_eps_high028")
ORDER = ALGOS + VARIANTS
TAIL = 0.3  # accuracy, pass@k: the last 30% of steps, at least one (the simulator's summary: 10% of 300 steps)
#: (summary key, what it is) of the per-algorithm table
TABLE = (("accuracy_first", "accuracy, first 30% of steps"), ("accuracy", "accuracy, last 30%"),
         ("pass@1", "pass@1 from the group, last 30%"), ("pass@G", "pass@G from the group, last 30%"),
         ("entropy_final", "entropy at the last step"), ("clip_frac", "TCR"), ("clip_up_frac", "up-clipped share"),
         ("clip_low_frac", "low-clipped share"), ("upclip_pold_median", "median pi_old of up-clipped tokens"),
         ("upclip_pold_lt02", "share of up-clipped tokens with pi_old < 0.2"),
         ("ratio_dev_median", "median |r - 1| (A != 0)"), ("rur", "RUR"), ("len_wrong", "length of wrong answers"),
         ("truncated", "share truncated at the budget"), ("gen_per_trained", "generations per trained response"),
         ("cov_logp_adv", "Cov(log pi, A)"), ("gap_mean_abs", "rollout/trainer |log-prob gap|"),
         ("step_time_s", "seconds per step"))
PAIRED = ("accuracy", "entropy_final", "clip_frac", "rur", "len_wrong", "ratio_dev_median", "gen_per_trained")
INT, NAME = ((int,), "an integer"), ((str,), "a name")
#: The fields of a run's config.json that the evidence section reads: their types, and what they are.
CONFIG_FIELDS = {"model.name": NAME, "model.train_top_layers": ((int, type(None)), "an integer or null"),
                 "rollout.engine": NAME, "rollout.prompts_per_step": INT, "rollout.group_size": INT,
                 "rollout.max_new_tokens": INT, "data.n": INT, "data.digits": INT,
                 "train.lr": ((int, float), "a number"), "train.epochs": INT, "train.minibatch_size": INT,
                 "run.seed": INT, "run.steps": INT}


def _mean_over(records, key, part=slice(None)) -> float:
    vals = [r.get(key) for r in records[part]]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else float("nan")


def run_summary(records: list[dict], group_size: int) -> dict:
    """One run: the simulator's summary (``sim.metrics.summarise_run``, tail 30%) plus the real-model means."""
    n = max(1, int(round(len(records) * TAIL)))
    s = {k: (float("nan") if v is None else v) for k, v in summarise_run(records, tail=TAIL).items()}
    s.update({"accuracy_first": _mean_over(records, "accuracy", slice(0, n)),
              "pass@1": _mean_over(records, "pass@1", slice(-n, None)),
              "pass@G": _mean_over(records, f"pass@{group_size}", slice(-n, None)),
              **{k: _mean_over(records, k) for k in ("truncated", "cov_logp_adv", "gap_mean_abs", "step_time_s",
                                                     "loss")}})
    return s


def paired(a: dict, b: dict, key: str) -> Comparison:
    """b - a over the seeds both have, paired by seed (same seed: same prompt pool, same first batch)."""
    seeds = sorted(set(a) & set(b))
    return paired_test([a[s][key] for s in seeds], [b[s][key] for s in seeds])


def ci(m: float, h: float, pct: bool = False) -> str:
    return "n/a" if m != m else fmt(m, pct=pct) if h != h else f"{fmt(m, pct=pct)} ± {fmt(h, pct=pct)}"


def load_run(folder: Path) -> dict:
    """A run folder's config.json and metrics.jsonl (the trainer's names mapped to the simulator's, rundirs.ALIASES)."""
    records = [{**{ALIASES[k]: v for k, v in rec.items() if k in ALIASES}, **rec}
               for rec in read_jsonl(folder / "metrics.jsonl")]
    if not records:
        raise ValueError(f"{folder / 'metrics.jsonl'}: no metrics")
    return {"cfg": _checked(read_json(folder / "config.json"), folder / "config.json"), "records": records}


def _checked(cfg: dict, path: Path) -> dict:
    """``cfg`` when every field of CONFIG_FIELDS has its type; a ValueError naming the file and the field."""
    for name, (kinds, what) in CONFIG_FIELDS.items():
        section, key = name.split(".")
        value = cfg[section].get(key) if isinstance(cfg.get(section), dict) else None
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise ValueError(f"{path}: {name}: expected {what}, got {value!r}")
    return cfg


class Evidence:
    """The evidence runs under ``evidence_dir`` (<name>/seed<k>/ with config.json and metrics.jsonl; the name is
    the algorithm or a variant of it, configs/evidence/<name>.yaml): ``runs[name][seed]`` and their summaries
    ``s[name][seed]``."""

    def __init__(self, evidence_dir):
        self.dir = Path(evidence_dir)
        self.runs = {}
        for cfg_path in sorted(self.dir.glob("*/seed*/config.json")):
            run = load_run(cfg_path.parent)
            self.runs.setdefault(cfg_path.parent.parent.name, {})[run["cfg"]["run"]["seed"]] = run
        if not self.runs:
            raise ValueError(f"evidence: no <algo>/seed<k>/ run folders with config.json and metrics.jsonl under "
                             f"{self.dir}")
        self.s = {a: {seed: run_summary(r["records"], r["cfg"]["rollout"]["group_size"]) for seed, r in by.items()}
                  for a, by in self.runs.items()}

    def cfg(self, algo: str | None = None) -> dict:
        """The config of the first run of ``algo`` (any algorithm: None)."""
        by = self.runs[algo] if algo else next(iter(self.runs.values()))
        return next(iter(by.values()))["cfg"]

    def vals(self, algo: str, key: str) -> list[float]:
        return [self.s[algo][seed][key] for seed in sorted(self.s.get(algo, {}))]

    def cell(self, algo: str, key: str, pct: bool = False) -> str:
        iv = t_interval(self.vals(algo, key))
        return ci(iv.mean, iv.half, pct)

    def mean(self, algo: str, key: str) -> float:
        return t_interval(self.vals(algo, key)).mean

    def steps(self, algo: str) -> int:
        """The fewest steps any run of ``algo`` has."""
        return min(len(r["records"]) for r in self.runs[algo].values())

    def has(self, *algos) -> bool:
        return all(a in self.s for a in algos)

    def step_s(self) -> float:
        return float(np.nanmean([s["step_time_s"] for by in self.s.values() for s in by.values()]))


def algo_table(ev: Evidence) -> list[str]:
    """Per algorithm, mean ± 95% CI over seeds of each TABLE metric (one row per metric, one column per algorithm)."""
    algos = [a for a in ORDER if a in ev.s] + sorted(set(ev.s) - set(ORDER))
    seeds = {a: len(ev.s[a]) for a in algos}
    lines = ["| metric | " + " | ".join(f"{md(a)} ({seeds[a]})" for a in algos) + " |",
             "|---" * (len(algos) + 1) + "|"]
    for key, what in TABLE:
        lines.append(f"| {cell(what)} | " + " | ".join(ev.cell(a, key) for a in algos) + " |")
    return lines


def paired_lines(ev: Evidence, base: str = "grpo") -> list[str]:
    """Each algorithm against ``base``, paired by seed: the differences significant after Holm's correction across
    all of them, the structural ones (equal on every seed, or the same in every pair: nothing to test), and how many
    are not significant."""
    if base not in ev.s:
        return [f"No {base} runs: nothing to pair against."]
    tests = [(a, key, paired(ev.s[base], ev.s[a], key))
             for a in [a for a in ORDER if a in ev.s and a != base] + sorted(set(ev.s) - set(ORDER)) for key in PAIRED]
    tests = [(a, key, c) for a, key, c in tests if c.kind != "too few"]
    adjusted = holm([c.p if c.kind in ("paired", "welch") else np.nan for _, _, c in tests])
    sig = [f"- {md(a)} - {base}, {key}: {fmt(c.diff)} ± {fmt(c.half)} (n = {c.n_a} seeds, Holm-adjusted p {p:.2g})"
           for (a, key, c), p in zip(tests, adjusted) if p < 0.05]
    structural = [f"{md(a)} {key} ({fmt(c.diff)})" for a, key, c in tests if c.kind == "structural"]
    tested = sum(np.isfinite(adjusted))
    return (sig or ["- none"]) + [
        "", f"Holm's correction runs over the {tested} paired t tests of this section; "
            f"{tested - len(sig)} are not significant after it.",
        *([f"Structural, not tested (the same difference on every seed): {', '.join(structural)}."] if structural
          else [])]


def coincide_lines(ev: Evidence, a: str = "gspo", b: str = "sapo") -> list[str]:
    """Do ``a`` and ``b`` still produce the same run, seed by seed? Steps whose loss or entropy differ."""
    if not ev.has(a, b):
        return [f"Not measured: {a} or {b} has no run."]
    out = []
    for seed in sorted(set(ev.runs[a]) & set(ev.runs[b])):
        ra, rb = ev.runs[a][seed]["records"], ev.runs[b][seed]["records"]
        steps = min(len(ra), len(rb))
        diff = [abs(x.get("entropy", 0) - y.get("entropy", 0)) for x, y in zip(ra[:steps], rb[:steps])]
        first = next((i + 1 for i, d in enumerate(diff) if d > 1e-6), None)
        acc = sum(x.get("accuracy") != y.get("accuracy") for x, y in zip(ra[:steps], rb[:steps]))
        out.append(f"- seed {seed}: entropy differs from step {first if first else 'never'} on (largest gap "
                   f"{fmt(max(diff))}); sampled accuracy differs in {acc} of {steps} steps")
    return out


# -- claims ------------------------------------------------------------------------------------------------------

def sim_records(sim_dir: Path) -> dict[str, list[ClaimRecord]]:
    """{environment: its claim records} of the simulator's report (reports/sim/claims.json); empty without one."""
    path = sim_dir / JSON_NAME
    return {s.name: list(s.records) for s in read_claims(path)} if path.exists() else {}


def _sim_num(summary: dict, algo: str, key: str, pct: bool = False) -> str:
    a = summary.get("algorithms", {}).get(algo, {})
    if a.get(key) is None:
        return f"{algo} {key} n/a"
    sd = a.get(key + "_std")
    return f"{algo} {key} {fmt(a[key], pct=pct)}" + (f" ± {fmt(sd, pct=pct)} sd" if sd is not None else "")


def sim_cell(records: list[ClaimRecord] | None, claim: str) -> str:
    """The simulator's verdicts on the claim with id ``claim`` (each with its regime), from its records."""
    if records is None:
        return "no claims.json"
    found = [f"**{cell(r.verdict_text())}**" + (f" ({cell(r.regime)})" if r.regime else "") for r in records
             if r.claim.id == claim]
    return ", ".join(found) if found else "no record"


def sim_numbers(summary: dict | None, nums: tuple) -> str:
    """The simulator's numbers a claim reads, from a sweep's summary: mean ± sd over seeds."""
    if summary is None:
        return "no summary"
    num = "; ".join(_sim_num(summary, a, k, pct) for a, k, pct in nums)
    seeds = summary.get("seeds", summary.get("algorithms", {}).get("grpo", {}).get("seeds", "?"))
    return f"{num} ({seeds} seeds, {summary.get('steps')} steps)"


def _pd(ev, a, b, key, pct=False) -> str:
    c = paired(ev.s[a], ev.s[b], key)
    test = "structural" if c.kind == "structural" else f"p {c.p:.2g}" if c.p == c.p else c.kind
    return f"{b} - {a} {ci(c.diff, c.half, pct)} ({test}, n = {c.n_a})"


@dataclass(frozen=True)
class Measured:
    """A claim measured on the evidence runs: its test (``test``: b - a, None when there is nothing to test) of the
    quantity ``what``, the claimed direction ``sign`` (+1 / -1) and magnitude, the numbers, and a note after the
    verdict. ``fixed`` is a verdict kind decided without a test (not measured, not testable here), ``why`` its
    reason."""
    text: str
    test: Comparison | None = None
    sign: int = 1
    magnitude: bool = True
    note: str = ""
    fixed: Kind | None = None
    pct: bool = False  # the tested quantity is a share (printed as a percentage)
    what: str = ""
    why: str = ""


#: The reason of a tested verdict, by its kind.
REASONS = {Kind.REPRODUCED: "significant after Holm's correction, in the claimed direction and with its magnitude",
           Kind.PARTLY: "significant after Holm's correction in the claimed direction, short of its magnitude",
           Kind.REVERSED: "significant after Holm's correction, against the claimed direction",
           Kind.NOT_DETECTABLE: "the paired difference is within noise for these seeds",
           Kind.NOT_REPRODUCED: "identical on every seed: the claimed difference is absent"}


def verdict(m: Measured, p_adjusted: float) -> Verdict:
    """Reproduced: significant after Holm's correction, in the claimed direction, with the claimed magnitude;
    partly: significant and in the direction, short of the magnitude; reversed: significant the other way; else
    not detectable with these seeds, with the smallest effect they detect (80% power). A structural difference (the
    same on every seed) is exact and needs no test: identical (not reproduced), or significant."""
    c = m.test
    note = m.note
    if m.fixed or c is None or c.kind == "too few":
        return Verdict(m.fixed or Kind.NOT_TESTABLE)
    if c.kind == "structural":
        if c.diff == 0:
            return Verdict(Kind.NOT_REPRODUCED, note=" ".join(x for x in ("identical on every seed", note) if x))
        significant = True
    else:
        significant = p_adjusted < 0.05
    if not significant:
        return Verdict(Kind.NOT_DETECTABLE, c.n_a, float(c.detectable), m.pct, note)
    if c.diff * m.sign > 0:
        return Verdict(Kind.REPRODUCED if m.magnitude else Kind.PARTLY, note=note)
    return Verdict(Kind.REVERSED, note=note)


#: The reason of a claim whose runs are missing; their command.
NO_RUNS = "the evidence runs of the algorithms it compares are missing"
RUN_EVIDENCE = "reports/real/run_evidence.sh"


def real_dcpo_tcr(ev: Evidence):
    if not ev.has("dcpo", "grpo", "dapo"):
        return Measured("no runs", fixed=Kind.NOT_MEASURED, why=NO_RUNS)
    d, g, p = (ev.mean(a, "clip_frac") for a in ("dcpo", "grpo", "dapo"))
    # below both: the claim holds only as far as the weaker of the two comparisons (the larger p)
    weaker = max((paired(ev.s["grpo"], ev.s["dcpo"], "clip_frac"), paired(ev.s["dapo"], ev.s["dcpo"], "clip_frac")),
                 key=lambda c: (c.p if c.p == c.p else 2.0, c.diff))
    return Measured(f"TCR dcpo {ev.cell('dcpo', 'clip_frac', True)}, grpo {ev.cell('grpo', 'clip_frac', True)}, "
            f"dapo {ev.cell('dapo', 'clip_frac', True)}; paired {_pd(ev, 'grpo', 'dcpo', 'clip_frac', True)}, "
            f"{_pd(ev, 'dapo', 'dcpo', 'clip_frac', True)}", weaker, -1, d * 10 <= min(g, p), pct=True,
                    what="TCR, dcpo minus the nearer of grpo and dapo")


def real_dcpo_rur(ev: Evidence):
    if not ev.has("dcpo", "grpo"):
        return Measured("no runs", fixed=Kind.NOT_MEASURED, why=NO_RUNS)
    return Measured(f"RUR dcpo {ev.cell('dcpo', 'rur', True)} vs grpo {ev.cell('grpo', 'rur', True)}; "
            f"paired {_pd(ev, 'grpo', 'dcpo', 'rur', True)}. {_rur_step1(ev)}",
                    paired(ev.s["grpo"], ev.s["dcpo"], "rur"), +1, pct=True, what="RUR, dcpo - grpo")


def _rur_step1(ev: Evidence) -> str:
    """DCPO's RUR gain at step 1, where SAS has no history and so gives an all-equal group no advantage, against
    the later steps: a gain at step 1 is its +1/0/-1 reward's (fewer all-equal groups), not SAS's."""
    def at(algo, key, steps):
        return {seed: {key: _mean_over(r["records"], key, steps)} for seed, r in ev.runs[algo].items()}
    cells = []
    for name, steps in (("step 1", slice(0, 1)), ("steps 2 on", slice(1, None))):
        gain = paired(at("grpo", "rur", steps), at("dcpo", "rur", steps), "rur")
        zero = {a: t_interval([v["zero_grad_frac"] for v in at(a, "zero_grad_frac", steps).values()]).mean
                for a in ("dcpo", "grpo")}
        cells.append((name, gain, zero))
    (_, g1, z1), (_, g2, _) = cells
    text = "; ".join(f"{name}: dcpo - grpo {ci(g.diff, g.half, True)}, all-equal groups dcpo "
                     f"{fmt(z['dcpo'], pct=True)} vs grpo {fmt(z['grpo'], pct=True)}" for name, g, z in cells)
    source = ("the gain is largest at step 1, where SAS has no history yet: it comes mostly from DCPO's +1/0/-1 "
              "reward, which leaves fewer groups all-equal (an all-wrong group with a malformed response has an "
              "advantage), not from SAS" if g1.diff >= g2.diff and g1.diff > 0 else
              "SAS, which has history from a prompt's second visit, acts from step 2")
    return (f"RUR gain by step ({text}): {source}. Pool of {ev.cfg()['data']['n']} prompts, "
            f"{ev.cfg()['rollout']['prompts_per_step']} a step, {ev.cfg()['run']['steps']} steps")


def real_gspo(ev: Evidence):
    if not ev.has("gspo", "grpo"):
        return Measured("no runs", fixed=Kind.NOT_MEASURED, why=NO_RUNS)
    g, r = ev.mean("gspo", "clip_frac"), ev.mean("grpo", "clip_frac")
    times = f"{g / r:.3g}x" if r > 0 else "GRPO clips nothing"
    return Measured(f"TCR gspo {ev.cell('gspo', 'clip_frac', True)} vs grpo "
            f"{ev.cell('grpo', 'clip_frac', True)} ({times}; the paper's two orders of magnitude would be 100x); "
            f"paired {_pd(ev, 'grpo', 'gspo', 'clip_frac', True)}", paired(ev.s["grpo"], ev.s["gspo"], "clip_frac"),
                    +1, g >= 10 * r, pct=True, what="TCR, gspo - grpo")


def real_clip_higher(ev: Evidence):
    lo, hi = "grpo_beta0", "grpo_beta0_eps_high028"
    if ev.has(lo, hi):  # the clean test: eps_high alone changes
        return Measured(f"GRPO without KL, final entropy eps_high 0.28 {ev.cell(hi, 'entropy_final')} "
                f"vs 0.2 {ev.cell(lo, 'entropy_final')}, paired {_pd(ev, lo, hi, 'entropy_final')}; at 0.2 the "
                f"upper bound clips {ev.cell(lo, 'clip_up_frac', True)} of tokens, their median pi_old "
                f"{ev.cell(lo, 'upclip_pold_median')}, share with pi_old < 0.2 {ev.cell(lo, 'upclip_pold_lt02', True)}"
                f"; at 0.28 {ev.cell(hi, 'clip_up_frac', True)}. {_entropy_budget(ev)}",
                        paired(ev.s[lo], ev.s[hi], "entropy_final"), +1, what="final entropy, 0.28 - 0.2",
                        fixed=Kind.NOT_TESTABLE if ev.steps(lo) < ENTROPY_STEPS else None, why=TOO_SHORT)
    if not ev.has("dapo", "grpo"):
        return Measured("no runs", fixed=Kind.NOT_MEASURED, why=NO_RUNS)
    return Measured(f"final entropy dapo {ev.cell('dapo', 'entropy_final')} vs grpo "
            f"{ev.cell('grpo', 'entropy_final')}, paired {_pd(ev, 'grpo', 'dapo', 'entropy_final')}; DAPO's "
            f"up-clipped share {ev.cell('dapo', 'clip_up_frac', True)}, their median pi_old "
            f"{ev.cell('dapo', 'upclip_pold_median')}, share with pi_old < 0.2 "
            f"{ev.cell('dapo', 'upclip_pold_lt02', True)}. DAPO also changes reward, loss, KL and sampling: the "
            f"clean test is GRPO with eps_high 0.2 vs 0.28 (beta 0). {_entropy_budget(ev)}",
                    paired(ev.s["grpo"], ev.s["dapo"], "entropy_final"), +1, note="confounded",
                    what="final entropy, dapo - grpo",
                    fixed=Kind.NOT_TESTABLE if ev.steps("grpo") < ENTROPY_STEPS else None, why=TOO_SHORT)


#: steps a run needs before entropy has fallen enough for a bound to slow its fall
ENTROPY_STEPS = 50
TOO_SHORT = f"runs under {ENTROPY_STEPS} steps: entropy has not fallen enough for a bound to slow its fall"


def _entropy_budget(ev: Evidence) -> str:
    return (f"Entropy has to fall before a bound can slow its fall: at about {ev.step_s():.0f} s a step, "
            f"{ENTROPY_STEPS}+ steps "
            f"a run x 3 seeds x 2 settings is about {6 * 50 * ev.step_s() / 3600:.1f} h here")


def real_drgrpo(ev: Evidence):
    if not ev.has("dr_grpo", "grpo"):
        return Measured("no runs", fixed=Kind.NOT_MEASURED, why=NO_RUNS)
    trunc = ev.mean("grpo", "truncated")
    budget = ev.cfg()["rollout"]["max_new_tokens"]
    why = (f"; {fmt(trunc, pct=True)} of GRPO's responses stop at the {budget}-token budget, so wrong answers cannot "
           f"grow: needs a budget of 128+ tokens and 50+ steps" if trunc > 0.5 else "")
    return Measured(f"length of wrong answers dr_grpo {ev.cell('dr_grpo', 'len_wrong')} vs grpo "
                    f"{ev.cell('grpo', 'len_wrong')}; paired {_pd(ev, 'grpo', 'dr_grpo', 'len_wrong')}{why}",
                    paired(ev.s["grpo"], ev.s["dr_grpo"], "len_wrong"), -1, what="length of wrong answers, "
                    "dr_grpo - grpo", fixed=Kind.NOT_TESTABLE if why else None,
                    why=f"most of GRPO's responses stop at the {budget}-token budget, so wrong answers cannot grow")


def real_dynamic_sampling(ev: Evidence):
    if not ev.has("dapo"):
        return Measured("no runs", fixed=Kind.NOT_MEASURED, why=NO_RUNS)
    rounds = ev.cfg("dapo")["rollout"]["max_rounds"]
    gen = ev.vals("dapo", "gen_per_trained")
    return Measured(f"dapo generates {ev.cell('dapo', 'gen_per_trained')} responses per trained response (up to "
                    f"{rounds} generation rounds a step, each refilling the missing groups); all-equal groups "
                    f"{ev.cell('dapo', 'zero_grad_frac', True)}",
                    paired_test(np.ones(len(gen)), gen), +1,  # against one generation per trained response
                    what="responses generated per trained response, minus 1")


def real_sapo(ev: Evidence):
    if not ev.has("sapo"):
        return Measured("no runs", fixed=Kind.NOT_MEASURED, why=NO_RUNS)
    dev = ev.mean("sapo", "ratio_dev_median")
    flat = [1 - 1 / math.cosh(t * dev / 2) ** 2 for t in (1.0, 1.05)]
    rev = "sapo_tau_reversed"
    measured = (f"tau_pos/tau_neg 1.0/1.05 vs 1.05/1.0: final accuracy paired {_pd(ev, rev, 'sapo', 'accuracy')}, "
                f"final entropy paired {_pd(ev, rev, 'sapo', 'entropy_final')}; " if ev.has(rev) else
                "only the default temperatures (tau_pos 1.0, tau_neg 1.05) ran; ")
    return Measured(f"{measured}median |r - 1| {fmt(dev)}, where the gate slopes "
            f"sech^2(tau (r - 1) / 2) of tau 1.0 and 1.05 are 1 - {flat[0]:.2g} and 1 - {flat[1]:.2g}: the two "
            f"temperatures act alike and there is no instability to damp. Needs a stress (lr x10, 4 epochs) and "
            f"100+ steps a run x 3 seeds x 2 settings (about {6 * 100 * ev.step_s() / 3600:.0f} h here)",
                    fixed=Kind.NOT_TESTABLE, why="the two temperatures' gates act alike at these ratios, and there is "
                                                 "no instability to damp")


#: (claim id in claims.CLAIMS, the claim as these runs test it, published, the simulator's numbers (algo, key,
#: percent), the real-model measurement)
CLAIMS = (
    ("dcpo_tcr", "DCPO's TCR is an order of magnitude below GRPO's and DAPO's",
     "DCPO 2509.02333, Table 2: about 10x below both",
     (("dcpo", "clip_frac", True), ("grpo", "clip_frac", True), ("dapo", "clip_frac", True)), real_dcpo_tcr),
    ("dcpo_rur", "DCPO's RUR is well above GRPO's", "DCPO Table 2: 71.8% vs 43.8%",
     (("dcpo", "rur", True), ("grpo", "rur", True)), real_dcpo_rur),
    ("gspo_clips", "GSPO clips far more tokens than GRPO", "GSPO 2507.18071, Fig. 2: about two orders of magnitude",
     (("gspo", "clip_frac", True), ("grpo", "clip_frac", True)), real_gspo),
    ("clip_higher", "Clip-higher (eps_high 0.28) slows entropy collapse; the up-clipped tokens are rare ones",
     "DAPO 2503.14476, Sec. 3.1, Fig. 2-3: entropy kept up; up-clipped tokens have pi_old < 0.2",
     (("dapo", "entropy_final", False), ("grpo", "entropy_final", False), ("dapo", "upclip_pold_median", False),
      ("dapo", "upclip_pold_lt02", True)), real_clip_higher),
    ("drgrpo_length", "Dr.GRPO removes GRPO's length bias on wrong answers",
     "Dr.GRPO 2503.20783, Sec. 3.1: GRPO's wrong answers grow longer, Dr.GRPO's do not",
     (("dr_grpo", "len_wrong", False), ("grpo", "len_wrong", False)), real_drgrpo),
    ("dynamic_sampling", "Dynamic sampling costs extra generations",
     "DAPO Sec. 3.2: groups with all-equal rewards are refilled", (("dapo", "gen_per_trained", False),),
     real_dynamic_sampling),
    ("sapo_temperatures", "SAPO with tau_neg > tau_pos is more stable than the reverse",
     "SAPO 2511.20347: tau_neg > tau_pos", (("sapo", "ratio_dev_median", False),), real_sapo),
)
SIM_ENVS = (("toy_lm", "simulator toy LM"), ("feature_lm", "simulator feature LM"))
SOURCES = {claim.id: claim for claim, _ in SIM_CLAIMS}
#: Per claim, the setting whose regime card it reads and the card's conditions (spec.regime) it needs.
CONDITIONS = {"dcpo_tcr": ("grpo", (CLIP_BINDS,)), "gspo_clips": ("grpo", (CLIP_BINDS,)),
              "clip_higher": ("grpo_beta0", (UPPER_CLIP_BINDS, RATIOS_MOVE, ENTROPY_FALLS)),
              "drgrpo_length": ("grpo", (HEADROOM,)), "sapo_temperatures": ("sapo", (RATIOS_MOVE, OFF_POLICY))}


def card_checks(ev: Evidence, claim: str) -> tuple[CardCheck, ...]:
    """The regime card's conditions of ``claim`` (``CONDITIONS``) on the evidence runs of its setting."""
    label, conditions = CONDITIONS.get(claim, ("", ()))
    if label not in ev.runs:
        return ()
    card = label_card([{"algo": r["cfg"]["algo"]["name"], "records": r["records"]} for r in ev.runs[label].values()])
    return checks_on(card, label, conditions)


def real_records(ev: Evidence) -> RunSet:
    """The real-model claims as records: each measured on the evidence runs, its paired test Holm-adjusted across
    the claims tested here."""
    from dataclasses import replace
    measured = [real(ev) for *_, real in CLAIMS]
    tested = [m.test is not None and m.fixed is None and m.test.kind in ("paired", "welch") for m in measured]
    adjusted = holm([m.test.p if t else np.nan for m, t in zip(measured, tested)])
    records = []
    for (cid, text, *_), m, p, t in zip(CLAIMS, measured, adjusted, tested):
        v = verdict(m, p)
        c = m.test
        est = None if c is None or m.fixed else Estimate(m.what, float(c.diff), float(c.half) if t else None, c.kind,
                                                         float(p) if t else None, c.n_a, m.pct)
        claim = replace(SOURCES[cid], text=text)
        records.append(regime_checked(ClaimRecord(
            claim, "", v.kind, m.why or REASONS.get(v.kind, ""), SetResult(v, est, m.text),
            conditions=card_checks(ev, cid), command=RUN_EVIDENCE if v.kind is Kind.NOT_MEASURED else None)))
    return RunSet("", tuple(records), tests=(sum(tested), 0))


def claims_lines(ev: Evidence, sim_dir, records: RunSet | None = None) -> list[str]:
    """The claims table, one line per claim: published | simulator toy LM | simulator feature LM (their verdicts,
    from reports/sim/claims.json) | real LM effect, verdict and reason (linked to its details in claims.md); then the
    simulator's numbers (reports/sim/summaries/<env>_main.json)."""
    sim_dir = Path(sim_dir)
    sims = sim_records(sim_dir)
    summaries = {}
    for env, _ in SIM_ENVS:
        path = sim_dir / "summaries" / f"{env}_main.json"  # the plain comparison
        summaries[env] = read_json(path) if path.exists() else None
    records = records or real_records(ev)
    lines = ["| claim | published | " + " | ".join(t for _, t in SIM_ENVS) + " | real LM (SmolLM2-135M): effect | "
             "verdict | reason |", "|---|---|---|---|---|---|---|"]
    for (cid, text, published, nums, _), rec in zip(CLAIMS, records.records):
        simc = [sim_cell(sims.get(env) if sims else None, cid) for env, _ in SIM_ENVS]
        lines.append(f"| [{cell(text)}](claims.md#{anchor('', cid, 1)}) | {cell(published)} | " + " | ".join(simc)
                     + f" | {cell(effect(rec.discovery.estimate))} | **{cell(rec.verdict_text())}** | "
                       f"{cell(rec.reason)} |")
    lines += ["", f"Real-model verdicts: paired t tests by seed (scipy), Holm-corrected across the {records.tests[0]} "
                  "claims tested here; each claim's numbers are in its details (reports/real/claims.md). The "
                  "simulator's numbers (reports/sim/summaries/<env>_main.json, mean ± sd over seeds):", ""]
    for (cid, text, _, nums, _) in CLAIMS:
        lines.append(f"- {prose(text)}: " + "; ".join(f"{title} {prose(sim_numbers(summaries[env], nums))}"
                                                    for env, title in SIM_ENVS))
    return lines


def section(ev: Evidence, sim_dir, records: RunSet) -> list[str]:
    """The evidence section of the real-model README (markdown lines), its claims from ``records``
    (``real_records``); the evidence folder's NOTES.md, when present, follows the setting (what the numbers cannot
    show, the budget)."""
    notes_path = ev.dir / "NOTES.md"
    notes = [read_text(notes_path).strip(), ""] if notes_path.exists() else []
    c = ev.cfg()
    n_runs = sum(len(by) for by in ev.runs.values())
    steps = {len(r["records"]) for by in ev.runs.values() for r in by.values()}
    m, r, t, d = c["model"], c["rollout"], c["train"], c["data"]
    return [
        f"{n_runs} runs: {len(ev.runs)} settings (the algorithms, and variants named after them) x seeds "
        f"{sorted({s for by in ev.runs.values() for s in by})}, "
        f"{'/'.join(map(str, sorted(steps)))} steps each. Setting: {md(m['name'])} (top {m['train_top_layers']} blocks "
        f"trained), engine {md(r['engine'])}, {r['prompts_per_step']} prompts x G = {r['group_size']}, "
        f"{r['max_new_tokens']}-token budget, a pool of {d['n']} problems ({d['digits']}-digit addition; a seed "
        f"draws its own pool and samples), lr {t['lr']}, {t['epochs']} epoch(s) in minibatches of "
        f"{t['minibatch_size']} sequences ({r['prompts_per_step'] * r['group_size'] // max(t['minibatch_size'], 1)}"
        f" optimiser steps per rollout batch, so the ratio moves away from 1 within a batch). Each algorithm keeps "
        f"its paper's reward, advantage and registry defaults (configs/evidence/).",
        "",
        *notes,
        f"Metrics have the simulator's names and definitions (sim/metrics.py; gpu/step_metrics.py). Accuracy and "
        f"pass@k: over the last {TAIL:.0%} of steps (first: the first {TAIL:.0%}); entropy: the last step; the rest "
        f"are means over all steps. Each cell: mean ± 95% confidence half-width over seeds (Student t, n - 1 degrees "
        f"of freedom, n the seeds with a value; the column header gives the runs).",
        "",
        *algo_table(ev),
        "",
        "### Paired by seed against GRPO (significant after Holm's correction)",
        "",
        *paired_lines(ev),
        "",
        "### GSPO and SAPO no longer coincide",
        "",
        "With one optimiser step per batch (the earlier runs below) their gradients are equal at r = 1 and the runs "
        "were identical step for step. Here, same seed (same first batch):",
        "",
        *coincide_lines(ev),
        "",
        "### Claims",
        "",
        "Simulator cells: the verdicts of the simulator's claim records for that environment (reports/sim/claims.json; "
        "each regime in brackets). Real cells: these runs, each claim linked to its details (reports/real/claims.md); "
        "the records are reports/real/claims.json.",
        "",
        *claims_lines(ev, sim_dir, records),
    ]
