"""Differential checks that hold spec (exact), sim (NumPy float64) and gpu (torch float64 and float32) together."""
from __future__ import annotations

import numpy as np
import torch

import gpu
import sim
import spec
from spec.registry import AGG_MODES, POLICY_ALGORITHMS

from .cases import Case, make_case

#: Tolerances on max |a - b| / max(1, max |reference|): float64 pairs agree to 1e-9; the float32 layer to 1e-4
#: (float32 carries about 7 digits; exp() of log-ratios up to 20 and sums over tokens lose up to three).
TOLERANCE = {"spec~sim": 1e-9, "sim~gpu64": 1e-9, "sim~gpu32": 1e-4}


def scaled_diff(a, b) -> float:
    """Largest absolute difference, relative to the reference's scale when that exceeds 1."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max())))


def _torch(x, dtype):
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=dtype)


def _gpu_policy(name, case: Case, dtype, hp):
    logp = _torch(case.logp, dtype).requires_grad_(True)
    loss, _ = gpu.policy_loss(name, logp, _torch(case.old_logp, dtype), _torch(case.adv, dtype),
                              _torch(case.mask, dtype), group_size=case.group_size,
                              ref_logp=_torch(case.ref_logp, dtype), **hp)
    loss.backward()
    return float(loss.detach()), logp.grad.double().numpy()


def _rounded(case: Case) -> Case:
    """The case as float32 sees it, so that the float32 check measures arithmetic, not input rounding."""
    f = lambda x: x.astype(np.float32).astype(np.float64)  # noqa: E731
    return Case(f(case.logp), f(case.old_logp), f(case.adv), case.mask, f(case.ref_logp), case.group_size)


def policy_case(name: str, case: Case, *, exact: bool = True, **hp) -> dict:
    """Loss and gradient differences of every layer pair on one case: {pair: (loss_diff, grad_diff)}."""
    hp = {"max_len": case.max_len, **hp}
    args = lambda c: (name, c.logp, c.old_logp, c.adv, c.mask)  # noqa: E731
    kw = lambda c: {"group_size": c.group_size, "ref_logp": c.ref_logp, **hp}  # noqa: E731
    loss, grad, _ = sim.policy_loss(*args(case), **kw(case))
    out = {}
    if exact:
        e_loss, e_grad = spec.policy_loss(*args(case), **kw(case))
        out["spec~sim"] = (scaled_diff(loss, float(e_loss)), scaled_diff(grad, e_grad.astype(float)))
    g_loss, g_grad = _gpu_policy(name, case, torch.float64, hp)
    out["sim~gpu64"] = (scaled_diff(g_loss, loss), scaled_diff(g_grad, grad))
    r = _rounded(case)
    r_loss, r_grad, _ = sim.policy_loss(*args(r), **kw(r))
    f_loss, f_grad = _gpu_policy(name, r, torch.float32, hp)
    out["sim~gpu32"] = (scaled_diff(f_loss, r_loss), scaled_diff(f_grad, r_grad))
    return out


def dpo_case(seed: int) -> dict:
    """DPO loss and gradients in every layer on random pairs."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    lw, ll, rw, rl = (-rng.exponential(20.0, n) for _ in range(4))
    beta = float(rng.choice([0.05, 0.1, 0.5]))
    loss, (gw, gl), _ = sim.dpo_loss(lw, ll, rw, rl, beta=beta)
    e_loss, (ew, el) = spec.dpo_loss(lw, ll, rw, rl, beta=beta)
    out = {"spec~sim": (scaled_diff(loss, float(e_loss)),
                        max(scaled_diff(gw, ew.astype(float)), scaled_diff(gl, el.astype(float))))}
    for pair, dtype in (("sim~gpu64", torch.float64), ("sim~gpu32", torch.float32)):
        tw, tl = _torch(lw, dtype).requires_grad_(True), _torch(ll, dtype).requires_grad_(True)
        t_loss, _ = gpu.dpo_loss(tw, tl, _torch(rw, dtype), _torch(rl, dtype), beta=beta)
        t_loss.backward()
        out[pair] = (scaled_diff(float(t_loss.detach()), loss),
                     max(scaled_diff(tw.grad.double().numpy(), gw), scaled_diff(tl.grad.double().numpy(), gl)))
    return out


def parts_case(seed: int) -> dict:
    """Advantages (GRPO, Dr.GRPO, SAS over two visits), GAE, value loss, KL and DCPO bounds in every layer."""
    case = make_case(seed)
    rng = np.random.default_rng(seed)
    g = max(case.group_size, 2)
    rewards = rng.integers(-1, 2, size=3 * g).astype(float)
    out = {}

    def record(name, pair, value):
        prev = out.setdefault(name, {}).get(pair, (0.0, 0.0))
        out[name][pair] = (max(prev[0], value), 0.0)

    for kind in ("grpo", "dr_grpo"):
        ref = sim.group_advantages(rewards, g, kind=kind)
        record(f"{kind}_advantage", "spec~sim",
               scaled_diff(ref, spec.group_advantages(rewards, g, kind=kind).astype(float)))
        record(f"{kind}_advantage", "sim~gpu64", scaled_diff(gpu.group_advantages(_torch(rewards, torch.float64), g,
                                                                                 kind=kind).numpy(), ref))
    layers = {"spec": spec.SmoothAdvantage(), "sim": sim.SmoothAdvantage(), "gpu": gpu.SmoothAdvantage()}
    for visit in range(3):
        r = np.roll(rewards, visit) if visit < 2 else np.zeros_like(rewards)  # the third visit is all-equal
        ids = [f"p{k}" for k in range(len(r) // g)]
        ref = layers["sim"](ids, r, g)
        record("sas", "spec~sim", scaled_diff(ref, layers["spec"](ids, r, g).astype(float)))
        record("sas", "sim~gpu64", scaled_diff(layers["gpu"](ids, _torch(r, torch.float64), g).numpy(), ref))
    values = case.ref_logp  # any finite numbers serve as values and rewards
    adv, ret = sim.gae(case.adv, values, case.mask, gamma=0.9, lam=0.8)
    e_adv, e_ret = spec.gae(case.adv, values, case.mask, gamma=0.9, lam=0.8)
    t_adv, t_ret = gpu.gae(_torch(case.adv, torch.float64), _torch(values, torch.float64),
                           _torch(case.mask, torch.float64), gamma=0.9, lam=0.8)
    record("gae", "spec~sim", max(scaled_diff(adv, e_adv.astype(float)), scaled_diff(ret, e_ret.astype(float))))
    record("gae", "sim~gpu64", max(scaled_diff(t_adv.numpy(), adv), scaled_diff(t_ret.numpy(), ret)))
    v_loss, v_grad, _ = sim.value_loss(case.logp, case.old_logp, case.ref_logp, case.mask)
    e_loss, e_grad = spec.value_loss(case.logp, case.old_logp, case.ref_logp, case.mask)
    tv = _torch(case.logp, torch.float64).requires_grad_(True)
    t_loss, _ = gpu.value_loss(tv, _torch(case.old_logp, torch.float64), _torch(case.ref_logp, torch.float64),
                               _torch(case.mask, torch.float64))
    t_loss.backward()
    out["value_loss"] = {"spec~sim": (scaled_diff(v_loss, float(e_loss)), scaled_diff(v_grad, e_grad.astype(float))),
                         "sim~gpu64": (scaled_diff(float(t_loss.detach()), v_loss), scaled_diff(tv.grad.numpy(), v_grad))}
    for kind in ("k1", "k2", "k3"):
        ref = sim.kl(case.logp, case.ref_logp, kind)
        record("kl", "spec~sim", scaled_diff(ref, spec.kl(case.logp, case.ref_logp, kind).astype(float)))
        record("kl", "sim~gpu64", scaled_diff(gpu.kl(_torch(case.logp, torch.float64),
                                                     _torch(case.ref_logp, torch.float64), kind).numpy(), ref))
    q = np.exp(case.old_logp).ravel()
    lo, hi = sim.dcpo_bounds(q)
    e_lo, e_hi = spec.dcpo_bounds(q)
    t_lo, t_hi = gpu.dcpo_bounds(_torch(q, torch.float64))
    record("dcpo_bounds", "spec~sim", max(scaled_diff(lo, e_lo.astype(float)), scaled_diff(hi, e_hi.astype(float))))
    record("dcpo_bounds", "sim~gpu64", max(scaled_diff(t_lo.numpy(), lo), scaled_diff(t_hi.numpy(), hi)))
    return out


def run(seeds: int = 3, progress=None) -> list[dict]:
    """Every algorithm under every aggregation mode on ``seeds`` fixed seeds, DPO and the parts; one row per
    (algorithm, layer pair) with the number of cases, the largest loss and gradient differences and a verdict."""
    table: dict = {}

    def add(algorithm, results):
        for pair, (d_loss, d_grad) in results.items():
            row = table.setdefault((algorithm, pair), {"algorithm": algorithm, "pair": pair, "cases": 0,
                                                       "loss_diff": 0.0, "grad_diff": 0.0,
                                                       "tolerance": TOLERANCE[pair]})
            row["cases"] += 1
            row["loss_diff"] = max(row["loss_diff"], d_loss)
            row["grad_diff"] = max(row["grad_diff"], d_grad)

    jobs = [(name, agg, seed) for name in POLICY_ALGORITHMS for agg in (None, *AGG_MODES) for seed in range(seeds)]
    for k, (name, agg, seed) in enumerate(jobs):
        hp = {} if agg is None else {"agg": agg}
        add(name, policy_case(name, make_case(1000 * k + seed), **hp))
        if progress:
            progress(k + 1, len(jobs) + 2 * seeds)
    for seed in range(seeds):
        add("dpo", dpo_case(seed))
        for part, results in parts_case(seed).items():
            add(part, results)
        if progress:
            progress(len(jobs) + 2 * seed + 2, len(jobs) + 2 * seeds)
    rows = list(table.values())
    for row in rows:
        row["agrees"] = row["loss_diff"] <= row["tolerance"] and row["grad_diff"] <= row["tolerance"]
    return rows


def derivations() -> list[dict]:
    """The sympy derivations, each with its verdict."""
    from spec.derivations import CHECKS
    return [{"derivation": name, "holds": bool(check()), "source": check.__doc__.splitlines()[0]}
            for name, check in CHECKS.items()]
