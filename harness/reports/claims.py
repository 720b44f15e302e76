"""The papers' claims, each measured on grouped runs and given a verdict with its reason.

Every claim is decided on the discovery seeds and re-checked on the disjoint replication seeds (``run_claims``):
it is "reproduced" only where both sets say so. The tests come from ``harness.reports.stats`` (paired t tests where
seeds pair, Welch's otherwise, t intervals at the true degrees of freedom) and their p-values are Holm-adjusted
across all the tests of a set's claims (family-wise 5%). A difference that is not significant reads "not
detectable with N seeds (smallest detectable effect X)", the effect the test finds with 80% power.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass, replace

import numpy as np

from spec.regime import (CLIP_BINDS, ENTROPY_FALLS, EXPLORATION, HEADROOM, OFF_POLICY, RATIOS_MOVE, UPPER_CLIP_BINDS,
                         WELL_FORMED)
from spec.registry import ALGORITHMS, HPARAMS

from harness.reports.claim_record import (CardCheck, Claim, ClaimRecord, Estimate, Kind, RunSet, Source, Verdict,
                                          card_names, checks_on, combine, finding, not_measured, regime_checked)
from harness.reports.regime import label_card
from harness.reports.rundirs import Groups, fmt, same
from harness.reports.stats import Comparison, fit, holm, paired_test, t_interval, welch_test


def mean_se(x) -> tuple[float, float | None]:
    """Mean over seeds and the half-width of its 95% t interval (n - 1 degrees of freedom); None for one seed."""
    iv = t_interval(x)
    return iv.mean, (iv.half if iv.n > 1 else None)

def _missing(what: str, command: str) -> list[ClaimRecord]:
    """A claim the runs cannot measure: what it needs and the simulator's command that measures it."""
    return [not_measured(what, command)]


def card(g: Groups, label: str, *conditions) -> tuple[CardCheck, ...]:
    """The ``conditions`` of the regime card (``harness.reports.regime``) on ``label``, each with its measured
    value (None: not logged, or not defined for the algorithm)."""
    return checks_on(label_card(g.runs[label], card_names(conditions)), label, conditions)


def well_formed(g: Groups, *labels: str) -> tuple[CardCheck, ...]:
    """WELL_FORMED on each label a claim compares: a comparison where one side's format collapses (or runs on to the
    token budget) reads that failure, not the rule the claim is about (the first label that fails is named)."""
    return tuple(check for label in dict.fromkeys(labels) for check in card(g, label, WELL_FORMED))


def estimate(what: str, d: float, half: float, ok: "Tested", pct: bool = False) -> Estimate:
    """A tested difference as a record's estimate: value, 95% half-width, the test and its Holm-adjusted p."""
    c = ok.cmp
    tested = c.kind in ("paired", "welch")
    return Estimate(what, float(d), float(half) if tested else None, c.kind, float(c.p) if tested else None,
                    min(c.n_a, c.n_b), pct)


#: Below this share of tokens a bound is not active: a claim about the tokens a clip (or CISPO's truncation) acts
#: on has nothing to read, however large the ratio of two such shares (the regime card's CLIP_BINDS).
CLIP_ACTIVE = CLIP_BINDS.threshold


def _clip_inactive(shares: dict) -> str:
    """The reason a clip-share claim is not testable: PPO-clip's baselines ({name: clipped share}) clip almost no
    token."""
    named = ", ".join(f"{k} clips {fmt(v, pct=True)} of its tokens" for k, v in shares.items())
    return f"PPO-clip's ratios stay inside [1 - eps, 1 + eps]: {named} (under {fmt(CLIP_ACTIVE, pct=True)})"


def claim_dcpo_tcr(g: Groups):
    d, gr, da = g.find("dcpo"), g.find("grpo"), g.find("dapo")
    if not (d and gr and da):
        return _missing("dcpo, grpo and dapo runs", "cliplab sim --algos grpo,dapo,dcpo ...")
    vals = {k: mean_se(g.per_seed(lbl, "clip_frac")) for k, lbl in (("dcpo", d), ("grpo", gr), ("dapo", da))}
    meas = ", ".join(f"{k} {fmt(*v, pct=True)}" for k, v in vals.items())
    lo = min(vals["grpo"][0], vals["dapo"][0])
    ratio = lo / vals["dcpo"][0] if vals["dcpo"][0] > 0 else float("inf")
    meas += f"; min(GRPO, DAPO) / DCPO = {ratio:.3g}x" if np.isfinite(ratio) else "; DCPO clipped no token"
    row = dict(measured=meas, estimate=Estimate("TCR, min(GRPO, DAPO) / DCPO (x)", ratio), compared=(d, gr, da),
               conditions=card(g, gr, CLIP_BINDS))
    if not lo >= CLIP_ACTIVE:
        return [finding("", Kind.NOT_TESTABLE, _clip_inactive({"GRPO": vals["grpo"][0], "DAPO": vals["dapo"][0]}),
                        **row)]
    if ratio >= 10:
        return [finding("", Kind.REPRODUCED, "consistent with DCPO's bound widening as the sampling probability q "
                        "falls (q = 0.1: [0.5, 2.0])", **row,
                        attribution="no token ever left its DCPO bound in these runs" if vals["dcpo"][0] == 0 else "")]
    if ratio > 1:
        return [finding("", Kind.PARTLY, "DCPO clips less, but by less than an order of magnitude", **row)]
    return [finding("", Kind.NOT_REPRODUCED, "DCPO does not clip fewer tokens here", **row)]


#: "Well above": DCPO's RUR above GRPO's by more than a third of the paper's 28-point gap (71.8% vs 43.8%).
RUR_MARGIN = 0.28 / 3


def claim_dcpo_rur(g: Groups):
    d, gr = g.find("dcpo"), g.find("grpo")
    if not (d and gr):
        return _missing("dcpo and grpo runs", "cliplab sim --algos grpo,dcpo ...")
    (md, sd), (mg, sg) = mean_se(g.per_seed(d, "rur")), mean_se(g.per_seed(gr, "rur"))
    diff, half, ok = compare(g.per_seed(gr, "rur"), g.per_seed(d, "rur"))
    meas = (f"DCPO {fmt(md, sd, True)} vs GRPO {fmt(mg, sg, True)} (paper 71.8% vs 43.8%; diff "
            f"{sig(diff, half, ok)})")
    row = dict(measured=meas, estimate=estimate("RUR, DCPO - GRPO", diff, half, ok, pct=True), compared=(d, gr),
               attribution=rur_sources(g, d, gr))
    if ok and diff - half > RUR_MARGIN:  # the whole 95% interval above the margin, not a point estimate
        return [finding("", Kind.REPRODUCED, "DCPO trains more responses", **row)]
    if md > mg:
        return [finding("", Kind.PARTLY, f"higher, but the 95% interval of the difference is not all above "
                        f"{fmt(RUR_MARGIN, pct=True)} (a third of the paper's gap)", **row)]
    return [finding("", Kind.NOT_REPRODUCED, "DCPO does not use more responses here", **row)]


def rur_sources(g: Groups, dcpo: str, grpo: str) -> str:
    """Where DCPO's trained responses come from, measured: groups its +1/0/-1 reward leaves unequal (1 - its share
    of all-equal groups; GRPO's 1/0 reward leaves more groups all-equal), and the responses of all-equal groups
    that SAS gives an advantage (its RUR beyond that share); with the ablations (DCPO with the binary reward, DCPO
    without SAS), their RURs."""
    zd, zg = (mean_se(g.per_seed(lbl, "zero_grad_frac"))[0] for lbl in (dcpo, grpo))
    beyond = mean_se(g.per_seed(dcpo, "rur"))[0] - (1 - zd)
    out = (f"all-equal groups DCPO {fmt(zd, pct=True)} (its +1/0/-1 reward) vs GRPO {fmt(zg, pct=True)}; DCPO's RUR "
           f"beyond the responses of its unequal groups (SAS on all-equal groups) {fmt(beyond, pct=True)}")
    for name, lbl in (("binary reward, SAS kept", g.find("dcpo", reward="binary")),
                      ("+1/0/-1 reward, no SAS", g.find("dcpo", adv="grpo"))):
        if lbl:
            out += f"; DCPO with the {name}: RUR {_mean_of(g, lbl, 'rur')}"
    return out


def pairs(g: Groups, algo: str, changes: dict) -> list[tuple[str, str, dict]]:
    """Label pairs of ``algo`` that differ only by ``changes`` = {key: (value in first, value in second)}.

    A key missing from a label's params takes the registry default of ``algo``.
    """
    defaults = ALGORITHMS[algo].defaults if algo in ALGORITHMS else {}

    def value(label, key):
        return g.runs[label][0]["params"].get(key, defaults.get(key))
    labels = [lbl for lbl in g.labels() if g.runs[lbl][0]["algo"] == algo]
    out: dict = {}  # one pair per (setting, second label); a label naming the keys beats one relying on defaults
    for a in labels:
        if not all(same(value(a, k), v[0]) for k, v in changes.items()):
            continue
        rest = {k: v for k, v in g.runs[a][0]["params"].items() if k not in changes}
        for b in labels:
            rest_b = {k: v for k, v in g.runs[b][0]["params"].items() if k not in changes}
            if rest_b == rest and all(same(value(b, k), v[1]) for k, v in changes.items()):
                key = (tuple(sorted(rest.items())), b)
                explicit = all(k in g.runs[a][0]["params"] for k in changes)
                if key not in out or explicit:
                    out[key] = (a, b, rest)
    return list(out.values())


def _setting(algo: str, rest: dict, **compared) -> str:
    """A regime's settings as text: those ``algo`` reads (a loss hyper-parameter it does not read is left out);
    ``compared``: settings the claim varies, not shown, that decide what is read (a rollout correction's bounds)."""
    hp = {k: v for k, v in {**rest, **compared}.items() if k in HPARAMS}
    reads = set(ALGORITHMS[algo].reads(hp)) if algo in ALGORITHMS else set(HPARAMS)
    shown = {k: v for k, v in rest.items() if k not in HPARAMS or k in reads}
    return "defaults" if not shown else ", ".join(f"{k}={_value(v)}" for k, v in sorted(shown.items()))


def _value(v) -> str:
    """A setting's value as text, one spelling per value (a whole float as an integer: YAML's 0.0 and --set's 0
    are one setting)."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


class Family:
    """The tests of one seed set's claims, Holm-adjusted. The claims run twice: the first pass collects each
    test's p-value, the second gets each test's adjusted p-value back, in the same order (claims are
    deterministic). ``paired``: whether every label of the set has the same seeds (so seeds pair)."""

    def __init__(self, paired: bool):
        self.paired, self.raw, self.adjusted, self.next = paired, [], None, 0

    def test(self, a, b) -> Comparison:
        a, b = np.asarray(a, float), np.asarray(b, float)
        c = paired_test(a, b) if self.paired and a.shape == b.shape else welch_test(a, b)
        if self.adjusted is None:
            self.raw.append(c.p)
            return c
        c = replace(c, p=float(self.adjusted[self.next]))
        self.next += 1
        return c

    def adjust(self) -> None:
        self.adjusted, self.next = holm(self.raw), 0


FAMILY: contextvars.ContextVar[Family] = contextvars.ContextVar("claims_family")


@dataclass(frozen=True)
class Tested:
    """A comparison, true when significant after Holm's correction."""
    cmp: Comparison

    def __bool__(self) -> bool:
        return self.cmp.significant()


def compare(a, b) -> tuple[float, float, Tested]:
    """b - a over seeds: the difference, the half-width of its 95% t interval, and the test (true if significant
    at 5% after Holm's correction across the set's claims)."""
    family = FAMILY.get(None) or Family(paired=False)
    c = family.test(a, b)
    return c.diff, c.half, Tested(c)


def sig(d: float, half: float, ok: Tested) -> str:
    c = ok.cmp
    if c.kind in ("too few", "structural"):
        return f"{fmt(d)} ({c.kind})"
    return f"{fmt(d)} ± {fmt(half)} ({c.kind}, Holm p {c.p:.2g})"


def undetected(ok: Tested) -> Verdict:
    """The verdict of a difference the test did not find."""
    c = ok.cmp
    if c.kind == "too few":
        return Verdict(Kind.NOT_TESTABLE, note="under two seeds a side")
    return Verdict(Kind.NOT_DETECTABLE, seeds=min(c.n_a, c.n_b), detectable=float(c.detectable))


def acc_key(g: Groups, label: str) -> str:
    """The accuracy a claim reads: the exact expected accuracy where the runs log it (the simulator), else the
    share of sampled responses that are correct (the simulator's ``accuracy``; what real-model runs log), an
    unbiased estimate of it."""
    return "accuracy_exact" if np.isfinite(g.curve(label, "accuracy_exact")).any() else "accuracy"


def _final(g: Groups, label: str, key: str) -> np.ndarray:
    """Per seed, the last evaluated value of ``key``."""
    c = g.curve(label, key)
    out = np.full(c.shape[0], np.nan)
    for i, row in enumerate(c):
        ok = np.flatnonzero(np.isfinite(row))
        if ok.size:
            out[i] = row[ok[-1]]
    return out


ENTROPY_PARTS = ("entropy_relevant", "entropy_decision", "entropy_within", "entropy_correct", "entropy_hard",
                 "entropy_easy")
#: feature_lm's exact contributions to entropy by kind of context; they add up to the entropy.
ENTROPY_SHARES = ("entropy_ordinary", "entropy_fork", "entropy_end", "entropy_offtrack")


def attribution(g: Groups, a: str, b: str, tested=()) -> str:
    """Which parts of the entropy moved between labels a and b at the end: the exact split by decision type
    (reward-relevant vs interchangeable tokens, entropy among correct continuations), by prompt difficulty, and
    (feature_lm) the contributions by kind of context, which add up to the gap; the largest is named. Parts in
    ``tested`` (a claim's own test) are left out, so that no test counts twice in Holm's family."""
    parts, shares = [], {}
    for key in ENTROPY_PARTS + ENTROPY_SHARES:
        if key not in tested and np.isfinite(g.curve(a, key)).any():
            d, se, ok = compare(_final(g, a, key), _final(g, b, key))
            parts.append(f"{key[8:]} {fmt(d)} ± {fmt(se)}")
            if key in ENTROPY_SHARES:
                shares[key[8:]] = (d, ok)
    if not parts:
        return ""
    out = "final entropy gap by part: " + ", ".join(parts)
    if shares:
        top = max(shares, key=lambda k: abs(shares[k][0]))
        total = sum(d for d, _ in shares.values())
        out += (f"; of the contributions by context (total {fmt(total)}), the largest is {top} "
                f"({fmt(shares[top][0])}, {'significant' if shares[top][1] else 'not significant'})")
    return out


#: DAPO 2503.14476 Sec. 3.1, Fig. 3a: below this sampling probability a token is an exploration token, the kind whose
#: growth the upper clip stops.
EXPLORATION_P = 0.2
#: Why clip-higher acts (DAPO Sec. 3.1, Fig. 3a), and so the regime it needs.
CLIP_HIGHER_PRINCIPLE = ("the upper clip stops the growth of tokens with positive advantage and low probability "
                         "(exploration tokens, pi_old < 0.2; DAPO Fig. 3a), so clip-higher acts only where such "
                         "tokens sit in reward-relevant contexts (forks) and ratios reach the bound (off-policy "
                         "updates: several minibatches per rollout batch, stale rollouts, a large enough learning "
                         "rate)")


def _clip_profile(g: Groups, label: str) -> str:
    up, pold = mean_se(g.per_seed(label, "clip_up_frac"))[0], mean_se(g.per_seed(label, "upclip_pold_median"))[0]
    low = mean_se(g.per_seed(label, "upclip_pold_lt02"))[0]
    fork = mean_se(g.per_seed(label, "upclip_fork_share"))[0]
    at_fork = f", {fmt(fork, pct=True)} of them at forking positions" if np.isfinite(fork) else ""
    return (f"up-clipped {fmt(up, pct=True)} of tokens, their median pi_old {fmt(pold)}, share with pi_old < 0.2 "
            f"{fmt(low, pct=True)}{at_fork}")


def _beta(g: Groups, label: str) -> float:
    """The KL coefficient a label ran with: the simulator's settings, else its params; 0 when neither names it
    (cluster logs: verl and TRL train without a KL term unless told)."""
    run = g.runs[label][0]
    if run.get("settings"):
        return float(run["settings"]["loss"].get("beta", 0.0))
    return float(run["params"].get("beta", 0.0))


def _entropy_keys(g: Groups, label: str) -> tuple[str, ...]:
    """The final entropies an entropy claim reads: the reward-relevant contexts' (ordinary answer positions and
    forks, where the runs log them: the verdict's) and the total."""
    return ("entropy_relevant", "entropy") if np.isfinite(g.curve(label, "entropy_relevant")).any() else ("entropy",)


def _entropy_name(key: str) -> str:
    """How a claim's cell names an entropy key of ``_entropy_keys``."""
    return "reward-relevant entropy" if key == "entropy_relevant" else "entropy"


def _clip_regimes(g: Groups) -> dict:
    """{(algo, its regime's settings): {"base": the eps_high 0.2 label, 0.28: its label, 100: the unclipped one,
    "n": how many settings the regime names}}, KL penalty off and the true reward (the claim as stated)."""
    regimes: dict = {}
    for algo in ("dapo", "grpo", "dr_grpo", "ppo"):
        for hi in (0.28, 100):
            for base, high, rest in pairs(g, algo, {"eps_high": (0.2, hi)}):
                if rest.get("reward") == "random" or _beta(g, base) != 0:  # the claim is stated with KL off
                    continue
                regimes.setdefault((algo, _setting(algo, rest)), {"base": base, "n": len(rest)})[hi] = high
    return dict(sorted(regimes.items(), key=lambda kv: kv[1]["n"]))  # the default regime (fewest settings) first


def claim_clip_higher(g: Groups):
    """DAPO 2503.14476 Sec. 3.1, Fig. 2: a looser upper bound keeps entropy higher. Two rows per regime (the settings
    besides eps_high): final entropy at eps_high 0.2, 0.28 and no upper clip, on the reward-relevant contexts (the
    verdict's, where logged) and in total; then the regime's mechanism (``clip_mechanism``)."""
    regimes = _clip_regimes(g)
    if not regimes:
        return _missing("an eps_high ablation with the KL penalty off (beta 0)",
                        "cliplab sim --algos dapo --set eps_high=0.2,0.28,100 ...")
    rows = []
    for (algo, setting), r in regimes.items():
        base = r["base"]
        looser = [(name, r[hi]) for hi, name in ((0.28, "0.28"), (100, "no upper clip")) if hi in r]
        keys = _entropy_keys(g, base)
        cells, tests = [], {}
        for key in keys:
            e0 = _final(g, base, key)
            cell = f"final {_entropy_name(key)} eps_high 0.2 {fmt(*mean_se(e0))}"
            for name, lbl in looser:
                tests[key, name] = compare(e0, _final(g, lbl, key))
                cell += f"; {name} {fmt(*mean_se(_final(g, lbl, key)))} (diff {sig(*tests[key, name])})"
            cells.append(cell)
        top_name, top = looser[-1]
        d, se, ok = tests[keys[0], top_name]
        up = mean_se(g.per_seed(base, "clip_up_frac"))[0]
        if not np.isfinite(up):  # a log without the upper/lower split (verl, TRL): the whole clipped share bounds it
            up = mean_se(g.per_seed(base, "clip_frac"))[0]
        if not up >= CLIP_ACTIVE:
            verdict, why = Kind.NOT_TESTABLE, (f"the upper bound is almost never active (up-clipped share "
                                               f"{fmt(up, pct=True)}): ratios stay near 1, so eps_high cannot act")
        elif not np.isfinite(se):
            direction = "higher" if np.nanmean(_final(g, top, keys[0])) > np.nanmean(_final(g, base, keys[0])) \
                else "lower"
            verdict, why = Kind.NOT_TESTABLE, (f"one run per setting, so the difference has no standard error; "
                                               f"entropy ends {direction} with the looser bound")
        elif ok and d > 0:
            verdict, why = Kind.REPRODUCED, "a looser upper bound keeps entropy higher"
        elif ok:
            verdict, why = Kind.REVERSED, "entropy ends lower without the upper bound"
        else:
            verdict, why = undetected(ok), "the differences are within noise"
        regime = f"{algo}, {setting}"
        rows.append(finding(regime, verdict, why, f"{algo} ({setting}): " + "; ".join(cells),
                            estimate(f"final {_entropy_name(keys[0])}, {top_name} - eps_high 0.2", d, se, ok),
                            (base, *(lbl for _, lbl in looser)), attribution(g, base, top, tested=keys),
                            conditions=card(g, base, CLIP_BINDS, UPPER_CLIP_BINDS, RATIOS_MOVE, ENTROPY_FALLS)
                            + well_formed(g, base, *(lbl for _, lbl in looser)),
                            algorithm=algo))
        rows.append(replace(clip_mechanism(g, regime, base, looser[-1]), algorithm=algo))
    return rows


def clip_mechanism(g: Groups, regime: str, base: str, looser: tuple[str, str]) -> ClaimRecord:
    """A regime's mechanism row (DAPO Fig. 3a): the tokens the upper clip holds in the eps_high 0.2 run (A > 0,
    r > 1.2; the ones a looser bound frees): their share of trained tokens, median pi_old, share below
    EXPLORATION_P and share at forks; and those the looser run trains past 1.2. "reproduced" where most of the
    held tokens are exploration tokens, as in DAPO Fig. 3a."""
    name, free = looser
    up, low = (mean_se(g.per_seed(base, k))[0] for k in ("clip_up_frac", "upclip_pold_lt02"))
    freed, freed_p = (mean_se(g.per_seed(free, k))[0] for k in ("freed_frac", "freed_pold_median"))
    meas = (f"eps_high 0.2: {_clip_profile(g, base)}; {name}: trained past 1.2 (A > 0) {fmt(freed, pct=True)} of "
            f"tokens, their median pi_old {fmt(freed_p)}")
    mech = f"{regime}: mechanism"
    if not np.isfinite(up):  # a log without the simulator's clip metrics (verl, TRL)
        needs = "the up-clipped tokens' share and pi_old (clip_up_frac, upclip_pold_lt02)"
        return replace(not_measured(needs, "cliplab sim --set eps_high=0.2,100 ...", mech), mechanism=True)
    row = dict(measured=meas, estimate=Estimate(f"share of up-clipped tokens with pi_old < {EXPLORATION_P}", low,
                                                pct=True),
               compared=(base, free), attribution=f"the principle: {CLIP_HIGHER_PRINCIPLE}", mechanism=True,
               conditions=card(g, base, UPPER_CLIP_BINDS, EXPLORATION))
    if up < CLIP_ACTIVE or not np.isfinite(low):
        return finding(mech, Kind.NOT_TESTABLE, "the upper bound almost never binds", **row)
    if low > 0.5:
        return finding(mech, Kind.REPRODUCED, "most tokens the upper clip holds are exploration tokens", **row)
    return finding(mech, Kind.NOT_REPRODUCED, f"most tokens the upper clip holds have pi_old >= {EXPLORATION_P}: a "
                   "looser bound speeds tokens that are already likely, not the exploration tokens", **row)


def claim_random_reward(g: Groups):
    """Park et al. 2509.26114: with rewards independent of the answer, the upper clip still lowers entropy."""
    found = [(algo, *p) for algo in ("grpo", "dapo") for p in pairs(g, algo, {"eps_high": (0.2, 100)})
             if p[2].get("reward") == "random"]
    if not found:
        return _missing("a random-reward eps_high ablation",
                        "cliplab sim --algos grpo --set reward=random --set beta=0 --set eps_high=0.2,100 ...")
    rows = []
    for algo, base, free, rest in found:
        e0, e1 = _final(g, base, "entropy"), _final(g, free, "entropy")
        d, se, ok = compare(e0, e1)
        meas = (f"final entropy eps_high 0.2 {fmt(*mean_se(e0))} vs no upper clip {fmt(*mean_se(e1))} "
                f"(diff {sig(d, se, ok)}); initial {fmt(mean_se(g.per_seed(base, 'entropy', 'first'))[0])}; "
                + _clip_profile(g, base))
        verdict = Kind.REPRODUCED if ok and d > 0 else (Kind.REVERSED if ok else undetected(ok))
        why = {Kind.REPRODUCED: "entropy ends higher without the upper clip, though the reward is independent of the "
                                "answer", Kind.REVERSED: "entropy ends lower without the upper clip"}.get(
            verdict, "the difference is within noise")
        rows.append(finding(f"{algo}, {_setting(algo, rest)}", verdict, why, meas,
                            estimate("final entropy, no upper clip - eps_high 0.2", d, se, ok), (base, free),
                            attribution(g, base, free),
                            conditions=card(g, base, UPPER_CLIP_BINDS, RATIOS_MOVE) + well_formed(g, base, free),
                            algorithm=algo))
    return rows


#: The controls of a collapse claim: the same algorithm with the reward replaced by coin flips, a learning rate
#: near 0, and SGD instead of Adam (each a label whose params name exactly these keys).
CONTROLS = (("random reward", ("reward",), {"reward": "random"}), ("lr near 0", ("lr",), None),
            ("SGD", ("lr", "optimizer"), {"optimizer": "sgd"}))


def _control(g: Groups, algo: str, keys: tuple, values: dict | None) -> str | None:
    for lbl in g.labels():
        run = g.runs[lbl][0]
        if run["algo"] == algo and tuple(sorted(run["params"])) == keys and all(
                same(run["params"][k], v) for k, v in (values or {}).items()):
            if values is not None or float(run["params"]["lr"]) <= 1e-3:
                return lbl
    return None


def _fall(g: Groups, label: str, key: str) -> np.ndarray:
    """Per seed, the fall of ``key`` from the first step to the last."""
    return g.curve(label, key)[:, 0] - _final(g, label, key)


def _entropy_law(h, a, b):
    """Cui et al. 2505.22617, Eq. 1: performance R = -a exp(H) + b as entropy H is spent."""
    return -a * np.exp(h) + b


def claim_entropy_collapse(g: Groups):
    """Cui et al. 2505.22617: entropy falls early and fast while performance saturates (pass@k falls back); beside
    the total, the reward-relevant contexts (feature_lm: ordinary answer positions and forks), and the controls
    that say how much of the fall the reward drives."""
    rows = []
    for algo in ("grpo", "dapo"):
        lbl = g.find(algo)
        if not lbl:
            continue
        if g.runs[lbl][0].get("env") == "toy_lm":
            rows.append(finding(algo, Kind.NOT_TESTABLE, "the toy LM's contexts each have their own logits and most "
                                "of its entropy is the reward-irrelevant filler choice: nothing to collapse together",
                                compared=(lbl,), algorithm=algo))
            continue
        c = g.curve(lbl, "entropy")
        e0, e1 = c[:, 0], _final(g, lbl, "entropy")
        steps = c.shape[1]
        half = [np.flatnonzero(row <= row[0] / 2) for row in c]
        half_steps = np.array([h[0] if h.size else np.nan for h in half], float)
        p64 = g.curve(lbl, "pass@64")
        if not np.isfinite(p64).any():  # runs without exact pass@k (real models)
            p64 = np.full((len(c), 1), np.nan)
        peak = np.array([np.nanmax(row) if np.isfinite(row).any() else np.nan for row in p64])
        drop = peak - _final(g, lbl, "pass@64")
        acc = g.per_seed(lbl, acc_key(g, lbl), "last")
        n_half = int(np.isfinite(half_steps).sum())
        meas = (f"{algo}: entropy {fmt(*mean_se(e0))} -> {fmt(*mean_se(e1))} ({fmt(mean_se(1 - e1 / e0)[0], pct=True)}"
                f" fall); half-entropy step {fmt(*mean_se(half_steps))} in {n_half}/{len(c)} seeds; pass@64 initial "
                f"{fmt(mean_se(p64[:, 0])[0])}, peak {fmt(*mean_se(peak))}, peak-to-final drop {fmt(*mean_se(drop))}; "
                f"final accuracy {fmt(*mean_se(acc))}")
        a, b = fit(_entropy_law, c, g.curve(lbl, acc_key(g, lbl)), p0=(0.1, 0.5))
        if a.n:
            meas += (f"; R = -a e^H + b over every step and seed (Cui et al. Eq. 1; {a.n} points): a "
                     f"{fmt(a.mean, a.half)}, b {fmt(b.mean, b.half)}")
        keys = _entropy_keys(g, lbl)[::-1]  # the total first
        if "entropy_relevant" in keys:
            relevant = g.curve(lbl, 'entropy_relevant')[:, 0]
            meas += (f"; reward-relevant entropy (ordinary + fork) {fmt(*mean_se(relevant))}"
                     f" -> {fmt(*mean_se(_final(g, lbl, 'entropy_relevant')))}")
        controls, compared = [], [lbl]
        for name, ctl_keys, values in CONTROLS:
            ctl = _control(g, algo, ctl_keys, values)
            if ctl is None:
                continue
            compared.append(ctl)
            cells = []
            for key in keys:
                d, half_w, ok = compare(_fall(g, ctl, key), _fall(g, lbl, key))
                cells.append(f"{'total' if key == 'entropy' else 'relevant'} fall {fmt(*mean_se(_fall(g, ctl, key)))}"
                             f" (true reward minus control {sig(d, half_w, ok)})")
            controls.append(f"{name} ({ctl}): " + ", ".join(cells))
        if controls:
            meas += "; controls: " + "; ".join(controls)
        parts = ", ".join(f"{k[8:]} {fmt(mean_se(g.curve(lbl, k)[:, 0])[0])} -> {fmt(mean_se(_final(g, lbl, k))[0])}"
                          for k in ENTROPY_PARTS + ENTROPY_SHARES if np.isfinite(g.curve(lbl, k)).any())
        if n_half == len(c) and np.nanmean(half_steps) < steps / 2:
            verdict, why = Kind.REPRODUCED, "entropy halves within the first half of the steps in every seed"
        elif n_half:
            verdict, why = Kind.PARTLY, f"entropy halves in {n_half} of {len(c)} seeds"
        else:
            verdict, why = Kind.NOT_REPRODUCED, "entropy never halves"
        rows.append(finding(algo, verdict, why, meas,
                            Estimate("half-entropy step", *mean_se(half_steps), n=n_half), tuple(compared),
                            "which entropy fell (first -> last): " + parts if parts else
                            "these runs log the total entropy only, not its split by context",
                            conditions=card(g, lbl, WELL_FORMED), algorithm=algo))
    if not rows:
        return _missing("grpo or dapo runs", "cliplab sim --algos grpo,dapo ...")
    return rows


def claim_entropy_law(g: Groups):
    """Cui et al.: per step, -Cov(log pi, dz) predicts the entropy change; the batch Cov(log pi, A) anti-correlates."""
    rows = []
    for lbl in filter(None, (g.find(a) for a in ("grpo", "dapo", "ppo"))):
        if not np.isfinite(g.curve(lbl, "entropy_change_pred")).any():
            continue
        pred, meas = g.curve(lbl, "entropy_change_pred"), g.curve(lbl, "entropy_change_rows")
        ok = np.isfinite(pred) & np.isfinite(meas)
        corr = float(np.corrcoef(pred[ok], meas[ok])[0, 1]) if ok.sum() > 2 else float("nan")
        rel = float(np.abs(pred[ok] - meas[ok]).sum() / np.abs(meas[ok]).sum()) if ok.any() else float("nan")
        cov, dh = g.curve(lbl, "cov_interval"), g.curve(lbl, "entropy_change")
        ok2 = np.isfinite(cov) & np.isfinite(dh)
        c2 = float(np.corrcoef(cov[ok2], dh[ok2])[0, 1]) if ok2.sum() > 2 else float("nan")
        verdict = Kind.REPRODUCED if corr > 0.8 and c2 < 0 else (Kind.PARTLY if corr > 0.5 or c2 < 0 else
                                                                  Kind.NOT_REPRODUCED)
        meas = (f"first-order prediction vs measured change: correlation {fmt(corr)}, relative error "
                f"{fmt(rel, pct=True)}; batch Cov(log pi, A) vs entropy change: correlation {fmt(c2)}")
        rows.append(finding(lbl, verdict, "Lemma 1 is exact to first order per context; the batch covariance is one "
                            "noisy sample of it", meas,
                            Estimate("correlation of predicted and measured entropy change", corr), (lbl,),
                            "the batch covariance misses Adam's rescaling and the shared features' spill-over",
                            algorithm=g.runs[lbl][0]["algo"]))
    if not rows:
        return _missing("runs with the entropy law metrics", "cliplab sim --algos grpo ...")
    return rows


def claim_gspo_clips(g: Groups):
    gs, gr = g.find("gspo"), g.find("grpo")
    if not (gs and gr):
        return _missing("gspo and grpo runs", "cliplab sim --algos grpo,gspo ...")
    (ms_, ss), (mg, sg) = mean_se(g.per_seed(gs, "clip_frac")), mean_se(g.per_seed(gr, "clip_frac"))
    ratio = ms_ / mg if mg > 0 else float("inf")
    meas = f"GSPO {fmt(ms_, ss, True)} vs GRPO {fmt(mg, sg, True)}: {ratio:.3g}x (paper: about 100x)"
    row = dict(measured=meas, estimate=Estimate("TCR, GSPO / GRPO (x)", ratio), compared=(gs, gr),
               conditions=card(g, gr, CLIP_BINDS))
    if not mg >= CLIP_ACTIVE:
        return [finding("", Kind.NOT_TESTABLE, _clip_inactive({"GRPO": mg}), **row)]
    if not ms_ > 0:
        return [finding("", Kind.NOT_REPRODUCED, "GSPO clipped no token", **row)]
    if ratio >= 100:
        return [finding("", Kind.REPRODUCED, "GSPO's sequence-level bound of 3e-4/4e-4 is tiny, and clips whole "
                        "sequences", **row)]
    if ratio >= 10:
        return [finding("", Kind.PARTLY, "far more, but under two orders of magnitude", **row)]
    return [finding("", Kind.NOT_REPRODUCED, "GSPO does not clip far more tokens here", **row)]


def claim_drgrpo_length(g: Groups):
    gr, dr = g.find("grpo"), g.find("dr_grpo")
    if not (gr and dr):
        return _missing("grpo and dr_grpo runs", "cliplab sim --algos grpo,dr_grpo ...")

    key = "len_wrong_exact" if np.isfinite(g.curve(gr, "len_wrong_exact")).any() else "len_wrong"

    def growth(label):
        return g.per_seed(label, key, "last") - g.per_seed(label, key, "first")
    (mg, sg), (md, sd) = mean_se(growth(gr)), mean_se(growth(dr))
    diff, half, ok = compare(growth(dr), growth(gr))
    what = "exact expected" if key == "len_wrong_exact" else "mean sampled"
    meas = (f"growth of the {what} incorrect-response length, first to last 10% of steps: GRPO {fmt(mg, sg)}, "
            f"Dr.GRPO {fmt(md, sd)} tokens (GRPO - Dr.GRPO {sig(diff, half, ok)})")
    row = dict(measured=meas, estimate=estimate(f"growth of the incorrect-response length, GRPO - Dr.GRPO",
                                                diff, half, ok), compared=(gr, dr),
               conditions=card(g, gr, HEADROOM) + well_formed(g, gr, dr))
    if ok and diff > 0 and abs(md) < abs(mg) / 2:
        return [finding("", Kind.REPRODUCED, "GRPO's 1/|o_i| lets long wrong answers pay less per token; Dr.GRPO's "
                        "constant does not", **row)]
    if mg > md:
        reasons = ["GRPO's incorrect responses grow more"]
        if not ok:
            reasons.append("but the difference is not significant")
        if abs(md) >= abs(mg) / 2:
            reasons.append("and Dr.GRPO's grow too")
        return [finding("", Kind.PARTLY, " ".join(reasons), **row, attribution="part of any growth is the mix "
                        "shifting to hard prompts as easy ones stop being wrong")]
    return [finding("", Kind.NOT_REPRODUCED, "GRPO's wrong answers do not grow more than Dr.GRPO's here", **row)]


def _instability(g: Groups, label: str):
    """Per seed: the largest drop of accuracy (``acc_key``) below its running peak (a collapse measure), over the
    evaluated steps."""
    c = g.curve(label, acc_key(g, label))
    out = np.full(c.shape[0], np.nan)
    for i, row in enumerate(c):
        row = row[np.isfinite(row)]
        if row.size:
            out[i] = np.max(np.maximum.accumulate(row) - row)
    return out


def claim_sapo(g: Groups):
    default = ALGORITHMS["sapo"].defaults
    taus = {tuple(float(g.runs[lbl][0]["params"].get(k, default[k])) for k in ("tau_pos", "tau_neg"))
            for lbl in g.labels() if g.runs[lbl][0]["algo"] == "sapo"}
    found = []
    for tp, tn in sorted(t for t in taus if t[1] > t[0] and t[::-1] in taus):  # each ordering with its mirror
        found += [(tp, tn, *p) for p in pairs(g, "sapo", {"tau_pos": (tp, tn), "tau_neg": (tn, tp)})]
    if not found:
        return _missing("SAPO with tau_neg > tau_pos and its mirror",
                        "cliplab sim --algos sapo --set tau_pos=1.0,1.05 --set tau_neg=1.0,1.05 ...")
    rows = []
    for tp, tn, good, rev, rest in sorted(found, key=lambda f: len(f[4])):  # the default regime first
        ig, ir = _instability(g, good), _instability(g, rev)
        d, se, ok = compare(ig, ir)
        key = acc_key(g, good)
        ag, ar = g.per_seed(good, key, "last"), g.per_seed(rev, key, "last")
        da, sa, oka = compare(ar, ag)
        fg, fr = (np.nanmax(g.curve(x, key), axis=1) - _final(g, x, key) for x in (good, rev))
        df, sf, okf = compare(fg, fr)
        dev = mean_se(g.per_seed(good, DECISION_DEV))[0]
        meas = (f"tau_pos/tau_neg {tp}/{tn} vs {tn}/{tp}: worst drop of {key} {fmt(*mean_se(ig))} vs "
                f"{fmt(*mean_se(ir))} (diff {sig(d, se, ok)}); peak minus final accuracy {fmt(*mean_se(fg))} vs "
                f"{fmt(*mean_se(fr))} (diff {sig(df, sf, okf)}); final accuracy {fmt(*mean_se(ag))} vs "
                f"{fmt(*mean_se(ar))} (diff {sig(da, sa, oka)}); final entropy "
                f"{fmt(mean_se(_final(g, good, 'entropy'))[0])} vs {fmt(mean_se(_final(g, rev, 'entropy'))[0])}")
        slope = [1 / np.cosh(t * dev / 2) ** 2 for t in (tp, tn)] if np.isfinite(dev) else [np.nan, np.nan]
        scale = (f"median |r - 1| on decision tokens: {fmt(dev)}; there the gate slopes sech^2(tau (r - 1) / 2) "
                 f"of tau {tp} and {tn} are {fmt(slope[0])} and {fmt(slope[1])}")
        worst = float(np.nanmax([np.nanmax(ig), np.nanmax(ir)]))
        favour = [name for name, s, x in (("worst drop", ok, d), ("fall from the peak", okf, df),
                                          ("final accuracy", oka, da)) if s and x > 0]
        against = [name for name, s, x in (("worst drop", ok, d), ("fall from the peak", okf, df),
                                           ("final accuracy", oka, da)) if s and x < 0]
        est = estimate(f"worst drop of {key}, {tn}/{tp} - {tp}/{tn}", d, se, ok)
        if favour and not against:
            verdict, why = Kind.REPRODUCED, f"the paper's ordering is better on {', '.join(favour)}"
        elif against and not favour:
            verdict, why = Kind.REVERSED, f"the mirrored ordering is better on {', '.join(against)}"
        elif abs(slope[0] - slope[1]) < 0.01:
            verdict, why = Kind.NOT_TESTABLE, ("at the median ratio the two gates' slopes differ by under 1%, so the "
                                               "orderings train alike")
        elif worst < 0.02:
            verdict, why = Kind.NOT_TESTABLE, f"no instability to damp (worst drop of {key} in any run {fmt(worst)})"
        elif favour:
            verdict, why = undetected(ok), (f"the measures disagree: better on {', '.join(favour)}, worse on "
                                            f"{', '.join(against)}")
        else:
            verdict, why = undetected(okf), "instability appears but the orderings do not differ beyond noise"
            est = estimate(f"fall from the peak of {key}, {tn}/{tp} - {tp}/{tn}", df, sf, okf)
        rows.append(finding(_setting("sapo", rest), verdict, why, meas, est, (good, rev), scale,
                            conditions=card(g, good, RATIOS_MOVE, OFF_POLICY) + well_formed(g, good, rev)))
        rows.append(sapo_mechanism(g, _setting("sapo", rest), (tp, tn), good, rev))
    return rows


#: Why SAPO's temperatures matter (SAPO 2511.20347, Eq. 5-6), and so the regime they need.
SAPO_PRINCIPLE = ("with tau_neg > tau_pos the soft gate of a negative-advantage token decays faster as its ratio "
                  "leaves 1, damping the large negative updates that destabilise; the temperatures act only where "
                  "ratios leave 1 (stale, off-policy updates)")
#: |r - 1| at which ``sapo_mechanism`` states the gates' weights: PPO's eps, where a clip would begin to act.
SAPO_GATE_AT = 0.2
#: How far ratios leave 1 where SAPO's gates can act: the median |r - 1| on decision tokens (spec.regime; near-certain
#: tokens hold r = 1 to round-off, and there both gates weigh 1).
DECISION_DEV = "decision_dev_q50"


def sapo_mechanism(g: Groups, regime: str, taus: tuple[float, float], good: str, rev: str) -> ClaimRecord:
    """A regime's mechanism row for SAPO: how far ratios leave 1 (median |r - 1| on decision tokens, and the
    share of tokens whose ratio left [0.8, 1.2] in their advantage's direction: where the gates damp) in both
    orderings, and the gates' weights sech^2(tau (r - 1) / 2) there (SAPO Eq. 6's gradient weight)."""
    tp, tn = taus
    dev = [mean_se(g.per_seed(x, DECISION_DEV))[0] for x in (good, rev)]
    far = [mean_se(g.per_seed(x, "ppo_zeroed_frac"))[0] for x in (good, rev)]
    weight = [1 / np.cosh(t * SAPO_GATE_AT / 2) ** 2 for t in (tp, tn)]
    meas = (f"tau_pos/tau_neg {tp}/{tn} vs {tn}/{tp}: median |r - 1| on decision tokens {fmt(dev[0])} vs "
            f"{fmt(dev[1])}; tokens "
            f"whose ratio left [0.8, 1.2] in their advantage's direction {fmt(far[0], pct=True)} vs "
            f"{fmt(far[1], pct=True)}; gate weights at |r - 1| = {SAPO_GATE_AT}: tau {tp} {fmt(weight[0])}, tau {tn} "
            f"{fmt(weight[1])}")
    verdict = Verdict(Kind.NA, note="measured") if np.isfinite(dev[0]) else Verdict(Kind.NOT_MEASURED)
    return finding(f"{regime}: mechanism", verdict, "the gates' weights where ratios leave 1, in both orderings",
                   meas, Estimate("median |r - 1| on decision tokens", dev[0]), (good, rev),
                   f"the principle: {SAPO_PRINCIPLE}",
                   mechanism=True)


def claim_dcpo_reward(g: Groups):
    """DCPO's accuracy under its ternary reward and under the binary one: separates the reward from the clip."""
    tern, binary = g.find("dcpo"), g.find("dcpo", reward="binary")
    if not (tern and binary):
        return _missing("dcpo with the binary reward", "cliplab sim --algos dcpo --set reward=binary ...")
    key = acc_key(g, tern)
    at, ab = g.per_seed(tern, key, "last"), g.per_seed(binary, key, "last")
    d, se, ok = compare(at, ab)
    meas = f"DCPO ternary {fmt(*mean_se(at))} vs binary {fmt(*mean_se(ab))} (binary - ternary {sig(d, se, ok)})"
    others = {a: g.find(a) for a in ("grpo", "gspo", "dapo") if g.find(a)}
    if others:
        meas += "; " + ", ".join(f"{a} {fmt(mean_se(g.per_seed(lbl, key, 'last'))[0])}"
                                 for a, lbl in others.items())
    mt, mb = g.per_seed(tern, "malformed", "last"), g.per_seed(binary, "malformed", "last")
    fmt_share = f"ternary {fmt(mean_se(mt)[0], pct=True)}, binary {fmt(mean_se(mb)[0], pct=True)}"
    verdict = (Kind.REPRODUCED if d > 0 else Kind.REVERSED) if ok else undetected(ok)
    why = ("the ternary reward spends its signal on the format (-1 for malformed against 0 for wrong), not the "
           "answer" if verdict is Kind.REPRODUCED else "the reward moves the format, not the accuracy")
    return [finding("", verdict, why, meas, estimate(f"{key}, binary - ternary", d, se, ok), (tern, binary),
                    f"with the same clip and SAS, only the reward differs; share of malformed (truncated) responses "
                    f"over the last 10% of steps: {fmt_share}", conditions=card(g, tern, HEADROOM))]


def claim_dcpo_accuracy(g: Groups):
    names = ("dcpo", "gspo", "grpo", "dapo")  # the paper's order on AIME24: 38.8 > 34.9 > 32.1 > 31.6
    labels = {n: g.find(n) for n in names}
    if not all(labels.values()):
        return _missing("dcpo, gspo, grpo and dapo runs", "cliplab sim --algos grpo,dapo,gspo,dcpo ...")
    key = acc_key(g, labels["dcpo"])
    vals = {n: mean_se(g.per_seed(lbl, key, "last")) for n, lbl in labels.items()}
    meas = ", ".join(f"{n} {fmt(*vals[n])}" for n in sorted(names, key=lambda n: -vals[n][0]))
    meas += f" ({key}, last 10% of steps)"
    tests = {n: compare(g.per_seed(labels[n], key, "last"), g.per_seed(labels["dcpo"], key, "last"))
             for n in names[1:]}
    meas += "; DCPO minus " + ", ".join(f"{n} {sig(*tests[n])}" for n in names[1:])
    above = [n for n in names[1:] if tests[n][2] and tests[n][0] > 0]
    weakest = min(names[1:], key=lambda n: tests[n][0])  # the comparison least in DCPO's favour
    row = dict(measured=meas, estimate=estimate(f"{key}, DCPO - {weakest}", *tests[weakest]),
               compared=tuple(labels.values()),
               conditions=card(g, labels["dcpo"], HEADROOM) + well_formed(g, *labels.values()))
    if len(above) == 3:
        return [finding("", Kind.REPRODUCED, "DCPO ends above the other three", **row)]
    if above:
        return [finding("", Kind.PARTLY, f"DCPO ends above {', '.join(above)} only", **row)]
    return [finding("", Kind.NOT_REPRODUCED, "DCPO does not end above any of them here", **row,
                    attribution="the runs compare equal training steps, not equal generations (see the "
                                "dynamic-sampling row)")]


def claim_dynamic_sampling(g: Groups):
    da = g.find("dapo")
    if not da:
        return _missing("dapo runs", "cliplab sim --algos dapo ...")
    (m, s), (z, _) = mean_se(g.per_seed(da, "gen_per_trained")), mean_se(g.per_seed(da, "zero_grad_frac"))
    meas = f"{fmt(m, s)} responses generated per response trained (share of all-equal groups {fmt(z, pct=True)})"
    row = dict(measured=meas, estimate=Estimate("responses generated per response trained", m, s), compared=(da,))
    if m > 1.05:
        return [finding("", Kind.REPRODUCED, "all-equal groups are discarded and refilled, so generation grows as "
                        "accuracy rises", **row)]
    return [finding("", Kind.NOT_REPRODUCED, "almost no group was discarded", **row)]


def bandit_entropy_check(etas=(0.01, 0.03, 0.1, 0.3)):
    """The bandit's exact entropy change under natural PG against -eta Cov(log pi, A), summed over prompts."""
    from sim import bandit
    from sim.tabular import CORRECT

    aut, logits, _ = bandit.build()
    rewards = (aut.outcome == CORRECT).astype(float)
    rows = []
    for eta in etas:
        exact_change, predicted = bandit.npg_entropy_check(logits, rewards, eta)
        corr = float(np.corrcoef(exact_change, predicted)[0, 1])  # descriptive, not a test
        rows.append((eta, float(exact_change.sum()), float(predicted.sum()), corr))
    return rows


def claim_bandit(rows):
    small = rows[0]
    rel = abs(small[1] - small[2]) / abs(small[2])
    rel_big = abs(rows[-1][1] - rows[-1][2]) / abs(rows[-1][2])
    meas = (f"eta={small[0]}: exact dH {small[1]:.4g} vs predicted {small[2]:.4g} (rel. error {rel:.2%}, per-prompt "
            f"correlation {small[3]:.4f}); eta={rows[-1][0]}: rel. error {rel_big:.1%}")
    est = Estimate(f"relative error of the prediction at eta={small[0]}", rel, pct=True)
    if rel < 0.05 and rel_big > rel:
        return [finding("exact, default bandit", Kind.REPRODUCED, "first-order agreement, the error growing with eta "
                        "as a first-order law should", meas, est)]
    return [finding("exact, default bandit", Kind.NOT_REPRODUCED, "the first-order prediction misses the exact change",
                    meas, est)]


def same_setting(g: Groups, algo: str, other: str, key: str | None = None) -> list[tuple[str, str, dict]]:
    """Label pairs (``algo``, ``other``) run with identical settings (the same sweep's grid point); with ``key``,
    only settings that name it."""
    out = []
    for a in g.labels():
        pa = g.runs[a][0]["params"]
        if g.runs[a][0]["algo"] != algo or (key is not None and key not in pa):
            continue
        out += [(a, b, pa) for b in g.labels() if g.runs[b][0]["algo"] == other and g.runs[b][0]["params"] == pa]
    return out


def _mean_of(g: Groups, label: str, key: str) -> str:
    return fmt(*mean_se(g.per_seed(label, key)), pct=True)


def claim_cov_entropy(g: Groups):
    """Cui et al. 2505.22617 Sec. 5: Clip-Cov and KL-Cov keep entropy higher than PPO-clip (GRPO's clip, KL
    penalty off, the same token-mean) at equal or better accuracy. The verdict reads the reward-relevant contexts'
    entropy where the runs log it (the entropy of the choices the reward decides, as for clip-higher), the total
    beside it."""
    rows = []
    for algo in ("clip_cov", "kl_cov"):
        for lbl, base, params in same_setting(g, algo, "grpo", f"{algo}_ratio"):
            cells, tests, keys = [], {}, _entropy_keys(g, base)
            for ekey in keys:
                e0, e1 = _final(g, base, ekey), _final(g, lbl, ekey)
                tests[ekey] = compare(e0, e1)
                cells.append(f"final {_entropy_name(ekey)} {algo} {fmt(*mean_se(e1))} vs PPO-clip "
                             f"{fmt(*mean_se(e0))} (diff {sig(*tests[ekey])})")
            de, see, oke = tests[keys[0]]
            key = acc_key(g, base)
            a0, a1 = _final(g, base, key), _final(g, lbl, key)
            da, sea, oka = compare(a0, a1)
            meas = (f"{'; '.join(cells)}; accuracy {fmt(*mean_se(a1))} vs {fmt(*mean_se(a0))} (diff "
                    f"{sig(da, sea, oka)}); tokens selected per update {_mean_of(g, lbl, 'cov_frac')}")
            if oke and de > 0:
                verdict = Kind.PARTLY if oka and da < 0 else Kind.REPRODUCED
                why = ("entropy ends higher" + (", but accuracy is lower" if verdict is Kind.PARTLY else
                                                " at equal or better accuracy"))
            elif oke:
                verdict, why = Kind.REVERSED, "entropy ends lower than with PPO-clip"
            else:
                verdict, why = undetected(oke), "the entropy difference is within noise"
            rows.append(finding(
                f"{algo}, {_setting(algo, params)}", verdict, why, meas,
                estimate(f"final {_entropy_name(keys[0])}, {algo} - PPO-clip", de, see, oke), (lbl, base),
                "the selected tokens are those of largest Cov(log pi, A), the ones whose updates lower entropy most "
                "(Lemma 1); " + attribution(g, base, lbl, tested=keys),
                conditions=card(g, base, ENTROPY_FALLS) + well_formed(g, base, lbl),
                algorithm=algo))
    if not rows:
        return _missing("clip_cov / kl_cov runs beside grpo with the same settings",
                        "cliplab sim --algos grpo,clip_cov,kl_cov --set beta=0 --set agg=token_mean "
                        "--set clip_cov_ratio=0.02 --set kl_cov_ratio=0.02 ...")
    return rows


def claim_cispo(g: Groups):
    """MiniMax-M1 2506.13585 Sec. 3.1: CISPO keeps the gradient of the tokens PPO-clip would zero (it truncates
    their weight instead)."""
    rows = []
    for lbl, base, params in same_setting(g, "cispo", "grpo"):
        if params.get("beta") != 0:
            continue
        key = acc_key(g, base)
        a0, a1 = _final(g, base, key), _final(g, lbl, key)
        d, se, ok = compare(a0, a1)
        zeroed, trunc = mean_se(g.per_seed(lbl, "ppo_zeroed_frac"))[0], mean_se(g.per_seed(lbl, "trunc_frac"))[0]
        meas = (f"tokens PPO-clip (eps 0.2) would zero, in CISPO's updates: {fmt(zeroed, pct=True)} (GRPO's own "
                f"run clips {_mean_of(g, base, 'clip_frac')}); CISPO's truncated weights {fmt(trunc, pct=True)}; "
                f"accuracy {fmt(*mean_se(a1))} vs GRPO {fmt(*mean_se(a0))} (diff {sig(d, se, ok)})")
        attributed = ""
        if not zeroed >= CLIP_ACTIVE:
            verdict, why = Kind.NOT_TESTABLE, "no token leaves PPO's clip range: ratios stay near 1"
        else:
            verdict = Kind.REPRODUCED if not (ok and d < 0) else Kind.PARTLY
            why = (f"CISPO's gradient on those {fmt(zeroed, pct=True)} of tokens is -sg(w) A, never 0; " +
                   ("accuracy is not lower than GRPO's" if verdict is Kind.REPRODUCED else
                    "yet accuracy ends lower than GRPO's"))
            attributed = "spec's derivation cispo_gradient_is_truncated_reinforce"
        rows.append(finding(_setting("cispo", params), verdict, why, meas,
                            estimate(f"{key}, CISPO - GRPO", d, se, ok), (lbl, base), attributed,
                            conditions=card(g, base, CLIP_BINDS, OFF_POLICY)))
    if not rows:
        return _missing("cispo and grpo (beta=0) runs with the same settings",
                        "cliplab sim --algos grpo,cispo --set beta=0 ...")
    return rows


def claim_rollout_correction(g: Groups):
    """Yao et al. 2025 (TIS), IcePop: correcting for a rollout/trainer mismatch stabilises training."""
    rows = []
    for kind in ("tis", "mis"):
        for off, on, rest in pairs(g, "grpo", {"rollout_correction": (None, kind)}):
            noise = rest.get("rollout_noise", 0)
            stale = rest.get("staleness", 0) if rest.get("old_logp") == "policy" else 0  # pi_old not the sampler's
            source = (f"zero-mean noise N(0, {noise}^2) on the sampler's parameters" if noise else
                      f"a sampler {stale} updates behind the policy that recomputes pi_old")
            key = acc_key(g, off)
            a0, a1 = _final(g, off, key), _final(g, on, key)
            d, se, ok = compare(a0, a1)
            p0, p1 = (_final(g, x, key) - np.nanmax(g.curve(x, key), axis=1)
                      for x in (off, on))
            dd, sed, okd = compare(p0, p1)
            meas = (f"final accuracy {kind} {fmt(*mean_se(a1))} vs none {fmt(*mean_se(a0))} (diff {sig(d, se, ok)}); "
                    f"final minus peak {fmt(*mean_se(p1))} vs {fmt(*mean_se(p0))}; mean weight "
                    f"{fmt(mean_se(g.per_seed(on, 'rc_weight_mean'))[0])}, tokens cut "
                    f"{_mean_of(g, on, 'rc_cut_frac')}")
            w, cut = mean_se(g.per_seed(on, "rc_weight_mean"))[0], mean_se(g.per_seed(on, "rc_cut_frac"))[0]
            acts = "truncates the weight of" if kind == "tis" else "takes the gradient away from"
            cost = (f"the correction {acts} {fmt(cut, pct=True)} of tokens, and the mean weight is {fmt(w)}, "
                    f"while the uncorrected run's fall from its peak is "
                    f"{fmt(mean_se(p0)[0])}: this mismatch ({source}) leaves no instability to remove, only fewer "
                    "effective updates")
            attributed = ""
            if not (noise or stale):
                verdict, why = Kind.NOT_TESTABLE, ("no mismatch (no rollout_noise, and pi_old is the sampler's): "
                                                   "every weight is 1")
            elif (ok and d > 0) or (okd and dd > 0):
                verdict, why = Kind.REPRODUCED, "the correction keeps accuracy higher or its fall from the peak smaller"
            elif ok and d < 0:
                verdict, why, attributed = Kind.REVERSED, "accuracy ends lower with the correction", cost
            else:
                verdict, why, attributed = undetected(ok), "the differences are within noise", cost
            rows.append(finding(f"{kind}, {_setting('grpo', rest, rollout_correction=kind)}", verdict, why, meas,
                                estimate(f"final {key}, {kind} - none", d, se, ok), (on, off), attributed,
                                conditions=card(g, off, HEADROOM) + well_formed(g, off, on)))
    if not rows:
        return _missing("grpo runs with and without a rollout correction under rollout_noise",
                        "cliplab sim --algos grpo --set beta=0 --set rollout_noise=0,1 "
                        "--set rollout_correction=None,tis,mis ...")
    return rows


def _claim(cid: str, text: str, paper: str, arxiv: str | None, where: str) -> Claim:
    return Claim(cid, text, Source(paper, arxiv, where))


#: The papers' claims (id, statement, source) and the functions that decide them on grouped runs.
CLAIMS = (
    (_claim("entropy_collapse", "Entropy collapses early while performance saturates", "Cui et al.", "2505.22617",
            "Sec. 2"), claim_entropy_collapse),
    (_claim("entropy_law", "Per step, -Cov(log pi, dz) predicts the entropy change, and Cov(log pi, A) drives it",
            "Cui et al.", "2505.22617", "Lemma 1, Eq. 4"), claim_entropy_law),
    (_claim("dcpo_tcr", "DCPO's TCR is an order of magnitude below GRPO's and DAPO's", "DCPO", "2509.02333",
            "Table 2"), claim_dcpo_tcr),
    (_claim("dcpo_rur", "DCPO's RUR is well above GRPO's: 71.8% vs 43.8%", "DCPO", "2509.02333", "Table 2"),
     claim_dcpo_rur),
    (_claim("clip_higher", "Clip-higher slows entropy collapse (KL penalty off)", "DAPO", "2503.14476",
            "Sec. 3.1, Fig. 2-3"), claim_clip_higher),
    (_claim("random_reward", "Under random rewards the upper clip still lowers entropy", "Park et al.", "2509.26114",
            ""), claim_random_reward),
    (_claim("gspo_clips", "GSPO clips far more tokens than GRPO, about two orders of magnitude", "GSPO", "2507.18071",
            "Fig. 2"), claim_gspo_clips),
    (_claim("drgrpo_length", "Dr.GRPO removes GRPO's length bias on wrong answers", "Dr.GRPO", "2503.20783",
            "Sec. 3.1"), claim_drgrpo_length),
    (_claim("sapo_temperatures", "SAPO with tau_neg > tau_pos is more stable than the reverse", "SAPO", "2511.20347",
            "Eq. 5-6"), claim_sapo),
    (_claim("dynamic_sampling", "DAPO's dynamic sampling costs extra generations", "DAPO", "2503.14476", "Sec. 3.2"),
     claim_dynamic_sampling),
    (_claim("dcpo_accuracy", "DCPO reaches the best accuracy, then GSPO, GRPO, DAPO", "DCPO", "2509.02333",
            "Table 1, AIME24 Avg@32 38.8 / 34.9 / 32.1 / 31.6"), claim_dcpo_accuracy),
    (_claim("dcpo_reward", "DCPO's lower accuracy here comes from its ternary reward, not its clip or SAS", "DCPO",
            "2509.02333", "its reward scheme, ablated here: binary vs ternary"), claim_dcpo_reward),
    (_claim("cov_entropy", "Clip-Cov and KL-Cov keep entropy higher than PPO-clip at equal or better accuracy",
            "Cui et al.", "2505.22617", "Sec. 5"), claim_cov_entropy),
    (_claim("cispo", "CISPO keeps learning from the tokens PPO-clip zeroes", "MiniMax-M1", "2506.13585", "Sec. 3.1"),
     claim_cispo),
    (_claim("rollout_correction", "TIS and MIS (IcePop) stabilise training under a rollout/trainer mismatch",
            "Yao et al. 2025 (TIS); IcePop", None, ""), claim_rollout_correction),
)
#: The bandit's exact check of the entropy law (``bandit_entropy_check``), not decided on runs.
BANDIT_CLAIM = _claim("bandit_entropy_law", "Entropy change under natural PG is -eta Cov(log pi, A)", "Cui et al.",
                      "2505.22617", "Lemma 1")


def bandit_records() -> tuple[list[ClaimRecord], list[tuple]]:
    """The bandit's record of the entropy law and the rows of its exact check."""
    rows = bandit_entropy_check()
    return [replace(r, claim=BANDIT_CLAIM) for r in claim_bandit(rows)], rows


def decide(groups: Groups, paired: bool) -> tuple[list[list[ClaimRecord]], int]:
    """Every claim's records (one per regime) on one seed set, each test Holm-adjusted across all the set's tests;
    and how many tests that family had."""
    family = Family(paired)
    token = FAMILY.set(family)
    try:
        for _, fn in CLAIMS:  # first pass: every test's p-value
            fn(groups)
        family.adjust()
        return [[regime_checked(replace(r, claim=claim)) for r in fn(groups)] for claim, fn in CLAIMS], len(family.raw)
    finally:
        FAMILY.reset(token)


def seed_sets(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """The discovery and the replication runs (runs that name no set, such as real-model runs, are discovery)."""
    return ([r for r in runs if r.get("set") != "replication"], [r for r in runs if r.get("set") == "replication"])


def _paired(runs: list[dict]) -> bool:
    """Seeds pair when every label ran the same seeds."""
    seeds: dict = {}
    for r in runs:
        seeds.setdefault(r["label"], set()).add(r["seed"])
    return len({frozenset(s) for s in seeds.values()}) <= 1


def _seed_text(runs: list[dict]) -> str:
    from sim.config import Seeds
    return Seeds(tuple(sorted({r["seed"] for r in runs})), ()).text()


def run_claims(runs: list[dict], name: str = "") -> RunSet:
    """Every claim decided on the discovery seeds and re-checked on the replication seeds (``claim_record.combine``:
    a verdict stands only where both sets give it); runs that name no seed set (real models) form one set. The run
    set ``name``d, with its seed sets and its Holm families' sizes."""
    disc, rep = seed_sets(runs)
    by_seed = (lambda rs: sorted(rs, key=lambda r: (r["label"], r["seed"] if r["seed"] is not None else -1)))
    found_d, n_d = decide(Groups(by_seed(disc)), _paired(disc))
    found_r, n_r = decide(Groups(by_seed(rep)), _paired(rep)) if rep else (None, 0)
    seeds = (_seed_text(disc) if disc else "", _seed_text(rep) if rep else "")
    one_set = found_r is None and not any(r.get("set") for r in runs)  # runs without seed sets (real models)
    out = []
    for i, rows_d in enumerate(found_d):
        other = {r.regime: r for r in found_r[i]} if found_r is not None else {}
        for rec in rows_d:
            out.append(replace(rec, discovery=replace(rec.discovery, seeds=seeds[0])) if one_set else
                       combine(rec, other.get(rec.regime), seeds))
    return RunSet(name, tuple(out), seeds, (n_d, n_r))
