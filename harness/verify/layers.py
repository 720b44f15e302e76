"""Differential checks that hold spec (exact), sim (NumPy float64) and gpu (torch float64 and float32) together."""
from __future__ import annotations

import re

from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np
import torch

import gpu
import sim
import spec
from spec.registry import AGG_MODES, KL_KINDS, POLICY_ALGORITHMS, get_algorithm
from spec.schema import did_you_mean

from harness.verify.cases import Case, make_case

PAIRS = ("spec~sim", "sim~gpu64", "sim~gpu32")

#: Elementwise tolerance of each layer pair: an element a agrees with its reference b (spec for spec~sim, sim
#: otherwise) when |a - b| <= atol + rtol * |b|, every element on its own scale.
#: - float64 pairs: the layers take the same doubles, so only their arithmetic differs: a few roundings (1.1e-16
#:   each) per operation on chains of a few dozen operations, amplified by exp at log-ratios up to about 100
#:   (condition number |x|). Measured on 20 seeds of every option: below 2e-15 relative, and below 1e-15 absolute
#:   where the result is the difference of larger operands (k3 = e^d - d - 1 near d = 0, GAE's deltas, a KL term
#:   against a policy term in one gradient element). rtol 1e-12 and atol 1e-13 leave a margin of about 100.
#: - float32 (torch) against float64 (sim) on the same float32-rounded inputs: float32 rounds at 6e-8, and
#:   results that are differences of operands up to about 100 (log-probs, values) are known to ulp(64) = 4e-6
#:   absolute. Measured on 20 seeds of every option: every element within 1e-6 + 2e-6*|ref| (the worst at 0.97
#:   of it). rtol 1e-5 and atol 1e-5 leave a margin of about 10. A ratio within float32 rounding of a
#:   clip bound could take the other branch (its gradient element would then differ entirely); such a token has
#:   a chance of about 1e-7 and none occurs in the generated cases.
TOLERANCE: Mapping[str, Mapping[str, float]] = {
    "spec~sim": {"rtol": 1e-12, "atol": 1e-13},
    "sim~gpu64": {"rtol": 1e-12, "atol": 1e-13},
    "sim~gpu32": {"rtol": 1e-5, "atol": 1e-5},
}


def scaled_diff(a, b) -> float:
    """Largest absolute difference, relative to the reference's scale when that exceeds 1 (used by conform)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max())))


def excess(a, b, pair: str) -> float:
    """The worst element's |a - b| / (atol + rtol * |b|) under ``pair``'s tolerance, b the reference: the pair
    agrees where this is at most 1. Equal infinities agree; NaN, or inf against a finite value, gives inf."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"{pair}: shapes differ, {a.shape} vs {b.shape}")
    if a.size == 0:
        return 0.0
    tol = TOLERANCE[pair]
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(a == b, 0.0, np.abs(a - b))
        ratio = diff / (tol["atol"] + tol["rtol"] * np.abs(b))
    return float(np.where(np.isnan(ratio), np.inf, ratio).max())


# ---- the layers ---------------------------------------------------------------------------------------------

DTYPES = {"gpu64": torch.float64, "gpu32": torch.float32}


def _torch(x, dtype):
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=dtype)


def _np(x) -> np.ndarray:
    """A layer's output (sympy object array, NumPy array, tensor or bool) as float64 NumPy."""
    if isinstance(x, torch.Tensor):
        return x.detach().double().numpy()
    return np.asarray(x, dtype=object).astype(np.float64)


def _round32(x):
    """x as float32 represents it, so that the float32 pair measures arithmetic, not input rounding."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def layer_policy_loss(layer: str, name: str, case: Case, **hp) -> tuple[float, np.ndarray]:
    """Loss and gradient d loss / d logp of a policy loss in one layer (spec, sim, gpu64 or gpu32), as float64."""
    kw = {"group_size": case.group_size, **hp}
    if hp.get("rollout_correction"):
        kw["rollout_logp"] = case.rollout_logp
    if layer == "spec":
        loss, grad = spec.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask, ref_logp=case.ref_logp,
                                      **kw)
        return float(loss), _np(grad)
    if layer == "sim":
        loss, grad, _ = sim.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask, ref_logp=case.ref_logp,
                                        **kw)
        return loss, grad
    t = lambda x: _torch(x, DTYPES[layer])  # noqa: E731
    logp = t(case.logp).requires_grad_(True)
    kw = {k: t(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    loss, _ = gpu.policy_loss(name, logp, t(case.old_logp), t(case.adv), t(case.mask), **kw,
                              ref_logp=t(case.ref_logp))
    loss.backward()
    return float(loss.detach()), _np(logp.grad)


def _pairs(fn, inputs: dict, exact: bool = True) -> dict:
    """Run ``fn(layer, **inputs) -> (values, grads or None)`` in every layer and measure each pair's excess for
    the values and the gradients (None where the layers give no gradient: n/a)."""
    ref = fn("sim", **inputs)
    runs = {"sim~gpu64": (fn("gpu64", **inputs), ref)}
    if exact:
        runs["spec~sim"] = (ref, fn("spec", **inputs))
    r32 = {k: _round32(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    runs["sim~gpu32"] = (fn("gpu32", **r32), fn("sim", **r32))
    worst = lambda xs, ys, pair: max(excess(_np(x), _np(y), pair) for x, y in zip(xs, ys))  # noqa: E731
    out = {}
    for pair in (p for p in PAIRS if p in runs):
        (vals, grads), (ref_vals, ref_grads) = runs[pair]
        out[pair] = (worst(vals, ref_vals, pair), None if grads is None else worst(grads, ref_grads, pair))
    return out


# ---- policy losses: every algorithm under every option --------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """A hyper-parameter setting the policy losses are checked under; ``clips`` limits it to algorithms whose
    registry clip kind is listed, ``names`` to the algorithms named (None: every policy algorithm)."""

    label: str
    hp: Mapping[str, object] = field(default_factory=dict)
    clips: tuple | None = None
    names: tuple | None = None

    def applies(self, name: str) -> bool:
        return ((self.clips is None or get_algorithm(name).clip in self.clips)
                and (self.names is None or name in self.names))


#: The option matrix, one line per option: a new hyper-parameter or value to check is one more line here.
OPTIONS: tuple[Option, ...] = (
    Option("default"),
    *(Option(f"agg={mode}", {"agg": mode}) for mode in AGG_MODES),
    Option("dual_clip=3", {"dual_clip": 3.0}, clips=("fixed", "dynamic")),
    *(Option(f"beta=0.05 kl={kind}", {"beta": 0.05, "kl": kind}) for kind in KL_KINDS),
    Option("eps_low=0.1 eps_high=0.3", {"eps_low": 0.1, "eps_high": 0.3}, clips=("fixed", "dynamic")),
    Option("r_max=3", {"r_max": 3.0}, clips=("dynamic",)),
    Option("tau_pos=0.5 tau_neg=2", {"tau_pos": 0.5, "tau_neg": 2.0}, clips=("soft",)),
    Option("delta=1.5", {"delta": 1.5}, clips=("fixed",)),
    Option("eps_low=0.2 eps_high=0.1 (log space)", {"eps_low": 0.2, "eps_high": 0.1}, clips=("log",)),
    Option("cap_mode=absolute eps_high=2", {"cap_mode": "absolute", "eps_high": 2.0}, clips=("truncated",)),
    Option("eps_low=0.2 eps_high=0.2", {"eps_low": 0.2, "eps_high": 0.2}, clips=("truncated",)),
    Option("clip_cov_ratio=0.3 window (-3, 3)", {"clip_cov_ratio": 0.3, "clip_cov_lb": -3.0, "clip_cov_ub": 3.0},
           names=("clip_cov",)),
    Option("kl_cov_ratio=0.3 kl_cov_coef=2", {"kl_cov_ratio": 0.3, "kl_cov_coef": 2.0}, names=("kl_cov",)),
    Option("rollout tis C=1.5", {"rollout_correction": "tis", "tis_cap": 1.5}),
    Option("rollout mis [0.7, 1.5]", {"rollout_correction": "mis", "mis_low": 0.7, "mis_high": 1.5}),
    Option("rollout seq_mis [0.3, 3]", {"rollout_correction": "seq_mis", "mis_low": 0.3, "mis_high": 3.0}),
    Option("rollout seq_rs [0.3, 3]", {"rollout_correction": "seq_rs", "mis_low": 0.3, "mis_high": 3.0}),
    Option("rollout geo_rs [0.8, 1.25]", {"rollout_correction": "geo_rs", "mis_low": 0.8, "mis_high": 1.25}),
    Option("opsm_delta=0.05", {"opsm_delta": 0.05}),
)


def policy_case(name: str, case: Case, *, exact: bool = True, **hp) -> dict:
    """Loss and gradient excess of every layer pair on one case: {pair: (loss_excess, grad_excess)}."""
    hp = {"max_len": case.max_len, **hp}

    def fn(layer, **arrays):
        loss, grad = layer_policy_loss(layer, name, Case(**arrays), **hp)
        return (loss,), (grad,)
    return _pairs(fn, asdict(case), exact)


# ---- DPO and the parts that are not policy losses ----------------------------------------------------------------

def _module(layer):
    return {"spec": spec, "sim": sim}.get(layer, gpu)


def _arg(layer, x):
    return _torch(x, DTYPES[layer]) if layer in DTYPES else x


def _dpo(layer, lw, ll, rw, rl, beta):
    if layer in DTYPES:
        tw, tl = (_arg(layer, x).requires_grad_(True) for x in (lw, ll))
        loss, _ = gpu.dpo_loss(tw, tl, _arg(layer, rw), _arg(layer, rl), beta=beta)
        loss.backward()
        return (loss,), (tw.grad, tl.grad)
    loss, grads = _module(layer).dpo_loss(lw, ll, rw, rl, beta=beta)[:2]
    return (float(loss),), grads


def dpo_case(seed: int) -> dict:
    """DPO loss and gradients (chosen and rejected) in every layer on random pairs."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    lw, ll, rw, rl = (-rng.exponential(20.0, n) for _ in range(4))
    beta = float(rng.choice([0.05, 0.1, 0.5]))
    return _pairs(lambda layer, **a: _dpo(layer, beta=beta, **a), {"lw": lw, "ll": ll, "rw": rw, "rl": rl})


def _advantage(kind):
    def fn(layer, rewards, group_size):
        return (_module(layer).group_advantages(_arg(layer, rewards), group_size, kind=kind),), None
    return fn


def _gdpo(layer, rewards, group_size):
    """GDPO over two rewards (the second weighted 1/2)."""
    return (_module(layer).gdpo_advantages(_arg(layer, rewards), group_size, weights=[1.0, 0.5]),), None


def _sas(layer, rewards, group_size):
    """Four visits of each prompt, the third all-equal, so the min-|.| rule decides (it needs i >= 3)."""
    sas = _module(layer).SmoothAdvantage()
    ids = [f"p{k}" for k in range(len(rewards) // group_size)]
    return tuple(sas(ids, _arg(layer, np.zeros_like(rewards) if visit == 2 else np.roll(rewards, visit)),
                     group_size) for visit in range(4)), None


def _gae(layer, rewards, values, mask):
    return _module(layer).gae(*(_arg(layer, x) for x in (rewards, values, mask)), gamma=0.9, lam=0.8), None


def _value_loss(layer, values, old_values, returns, mask):
    if layer in DTYPES:
        v = _arg(layer, values).requires_grad_(True)
        loss, _ = gpu.value_loss(v, *(_arg(layer, x) for x in (old_values, returns, mask)))
        loss.backward()
        return (loss,), (v.grad,)
    loss, grad = _module(layer).value_loss(values, old_values, returns, mask)[:2]
    return (float(loss),), (grad,)


def _kl(layer, logp, ref_logp, old_logp):
    """Per-token values; the penalty's gradient is measured in the policy rows with beta > 0."""
    return tuple(_module(layer).kl(_arg(layer, logp), _arg(layer, ref_logp), kind, old_logp=_arg(layer, old_logp))
                 for kind in KL_KINDS), None


def _reinforce_pp(layer, rewards, mask, logp, ref_logp, group_size):
    """REINFORCE++ with k1 in the reward (beta 0.1, gamma 0.9), and its baseline variant."""
    m = _module(layer)
    a = lambda x: _arg(layer, x)  # noqa: E731
    return (m.reinforce_pp_advantages(a(rewards), a(mask), logp=a(logp), ref_logp=a(ref_logp), beta=0.1,
                                      gamma=0.9),
            m.reinforce_pp_advantages(a(rewards), a(mask), group_size=group_size, baseline=True)), None


def _dcpo_bounds(layer, q):
    m, a = _module(layer), _arg(layer, q)
    return (*m.dcpo_bounds(a), *m.dcpo_bounds(a, eps_low=0.1, eps_high=0.3, r_max=3.0)), None


def _overlong(layer, lengths, short):
    m = _module(layer)
    return (m.overlong_penalty(_arg(layer, lengths)), m.overlong_penalty(_arg(layer, short), 20, 8)), None


def _dynamic_sampling(layer, correct, group_size):
    return (_module(layer).dynamic_sampling_filter(_arg(layer, correct), group_size),), None


def parts_case(seed: int) -> dict:
    """Advantages (GRPO, Dr.GRPO, RLOO, GDPO, GPG, REINFORCE++ and its baseline, SAS over four visits), GAE
    (gamma 0.9, lam 0.8), the value loss and its gradient, the KL estimators, DCPO's bounds (default and other eps
    and r_max), DAPO's overlong shaping and dynamic-sampling filter, in every layer: {part: {pair: (value_excess,
    grad_excess or None)}}."""
    case = make_case(seed)
    rng = np.random.default_rng(seed)
    g = max(case.group_size, 2)
    rewards = rng.integers(-1, 2, size=3 * g).astype(float)
    correct = (rng.random(4 * g) < rng.choice([0.1, 0.5, 0.9])).astype(float)
    correct[:g] = 1.0  # one all-correct group
    inputs = {"grpo_advantage": (_advantage("grpo"), {"rewards": rewards, "group_size": g}),
              "dr_grpo_advantage": (_advantage("dr_grpo"), {"rewards": rewards, "group_size": g}),
              "rloo_advantage": (_advantage("rloo"), {"rewards": rewards, "group_size": g}),
              "gdpo_advantage": (_gdpo, {"rewards": np.stack([rewards, rng.normal(size=len(rewards))], 1),
                                         "group_size": g}),
              "gpg_advantage": (_advantage("gpg"), {"rewards": rewards, "group_size": g}),
              "reinforce_pp": (_reinforce_pp, {"rewards": rng.normal(size=len(case.mask)), "mask": case.mask,
                                               "logp": case.old_logp, "ref_logp": case.ref_logp,
                                               "group_size": case.group_size}),
              "sas": (_sas, {"rewards": rewards, "group_size": g}),
              "gae": (_gae, {"rewards": case.adv, "values": case.ref_logp, "mask": case.mask}),
              "value_loss": (_value_loss, {"values": case.logp, "old_values": case.old_logp,
                                           "returns": case.ref_logp, "mask": case.mask}),
              # k3_unbiased's weight r = exp(logp - old_logp) at the extreme cases' log-ratios of 20 would multiply
              # k3's float32 rounding near 0 by e^20: the KL part takes log-ratios within +-2 (the policy rows keep
              # the extreme ones, where the penalty's gradient is measured)
              "kl": (_kl, {"logp": case.logp, "ref_logp": case.ref_logp,
                           "old_logp": case.logp - np.clip(case.logp - case.old_logp, -2.0, 2.0)}),
              "dcpo_bounds": (_dcpo_bounds, {"q": np.exp(case.old_logp).ravel()}),
              "overlong": (_overlong, {"lengths": rng.integers(15000, 22000, 8).astype(float),
                                       "short": np.arange(0.0, 24.0)}),
              "dynamic_sampling": (_dynamic_sampling, {"correct": correct, "group_size": g})}
    return {part: _pairs(fn, kw) for part, (fn, kw) in inputs.items()}


# ---- the whole run ------------------------------------------------------------------------------------------------

#: The parts of ``parts_case``, in its order.
PARTS_CHECKED = ("grpo_advantage", "dr_grpo_advantage", "rloo_advantage", "gdpo_advantage", "gpg_advantage",
                 "reinforce_pp", "sas", "gae", "value_loss", "kl", "dcpo_bounds", "overlong", "dynamic_sampling")


def names(text: str) -> list[str]:
    """``--algos`` text (comma-separated) as a list of the policy algorithms, dpo and parts that verify checks; a
    ValueError lists them for an unknown one."""
    known = (*POLICY_ALGORITHMS, "dpo", *PARTS_CHECKED)
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        hint = did_you_mean(unknown[0], known) if unknown else ""
        raise ValueError(f"algos: unknown {', '.join(map(repr, unknown)) or 'empty list'}{hint}; expected names "
                         f"separated by commas among {', '.join(known)}")
    return chosen


def run(seeds: int = 2, progress=None, algos=None) -> list[dict]:
    """Every policy algorithm under every option of OPTIONS on ``seeds`` generated batches each (the exact layer
    on the first, the float pairs on all: exact evaluation is the slow part), then DPO and the parts; only those in
    ``algos`` if given. One row per (algorithm or part, layer pair): cases, the worst value and gradient excess
    (None: the layers give no gradient), where the worst was, and the verdict (every excess at most 1)."""
    table: dict = {}
    wanted = (lambda name: True) if algos is None else set(algos).__contains__

    def add(algorithm, where, results):
        for pair, (v_err, g_err) in results.items():
            row = table.setdefault((algorithm, pair), {
                "algorithm": algorithm, "pair": pair, "cases": 0, "value_err": 0.0,
                "grad_err": None if g_err is None else 0.0, "tolerance": dict(TOLERANCE[pair]), "worst": where})
            row["cases"] += 1
            worst = max(v_err, g_err or 0.0)
            if worst > max(row["value_err"], row["grad_err"] or 0.0):
                row["worst"] = where
            row["value_err"] = max(row["value_err"], v_err)
            if g_err is not None:
                row["grad_err"] = max(row["grad_err"], g_err)

    jobs = [(k, name, opt, seed) for k, (name, opt, seed) in enumerate(
        (name, opt, seed) for name in POLICY_ALGORITHMS for opt in OPTIONS if opt.applies(name)
        for seed in range(seeds)) if wanted(name)]  # each case keeps its number, filtered or not
    others = any(wanted(n) for n in ("dpo", *PARTS_CHECKED))
    total = len(jobs) + seeds * others
    for done, (k, name, opt, seed) in enumerate(jobs):
        case = 1000 * k + seed
        add(name, f"{opt.label}, case {case}", policy_case(name, make_case(case), exact=seed == 0, **opt.hp))
        if progress:
            progress(done + 1, total)
    for seed in range(seeds if others else 0):
        if wanted("dpo"):
            add("dpo", f"seed {seed}", dpo_case(seed))
        if any(wanted(part) for part in PARTS_CHECKED):
            for part, results in parts_case(seed).items():
                if wanted(part):
                    add(part, f"seed {seed}", results)
        if progress:
            progress(len(jobs) + seed + 1, total)
    rows = list(table.values())
    for row in rows:
        row["agrees"] = row["value_err"] <= 1 and (row["grad_err"] is None or row["grad_err"] <= 1)
    return rows


#: The table's columns; ``cells`` gives a row's entries.
COLUMNS = ("algorithm", "layer pair", "cases", "value err / tol", "grad err / tol", "rtol / atol", "worst at",
           "verdict")


def cells(row: dict) -> list[str]:
    """A row as the table's cells: errors as multiples of the tolerance (agree at most 1), n/a where no gradient."""
    tol = row["tolerance"]
    return [row["algorithm"], row["pair"], str(row["cases"]), f"{row['value_err']:.2g}",
            "n/a" if row["grad_err"] is None else f"{row['grad_err']:.2g}",
            f"{tol['rtol']:.0e} / {tol['atol']:.0e}", row["worst"], "agrees" if row["agrees"] else "DIFFERS"]


def markdown(rows, derivations) -> str:
    """The verify table and the derivations as markdown."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    if derivations:
        lines += ["", "| derivation (sympy) | holds | what it checks |", "|---|---|---|"]
        lines += [f"| {d['derivation']} | {'yes' if d['holds'] else 'NO'} | {d['source']} |" for d in derivations]
    return "\n".join(lines) + "\n"


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, whole, on one line (a docstring's first line may end mid-sentence)."""
    text = " ".join(doc.split())
    end = re.search(r"\.(\s+[A-Z(]|$)", text)  # "Eq. 4" and "Sec. 3" do not end one
    return text[:end.start() + 1] if end else text


def derivations() -> list[dict]:
    """The sympy derivations, each with its verdict."""
    from spec.derivations import CHECKS
    return [{"derivation": name, "holds": bool(check()), "source": first_sentence(check.__doc__)}
            for name, check in CHECKS.items()]
