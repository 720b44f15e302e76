"""Derivations the papers make, checked by sympy; each returns True when the identity holds symbolically."""
from __future__ import annotations

import sympy as sp

from . import objectives as ob

r, q, eps, tau, d, x = sp.symbols("r q epsilon tau d x", positive=True)


def dcpo_upper_bound_solves_inequality() -> bool:
    """DCPO Eq. 21-24: the root of (r - 1) r q = eps above 1 is the closed-form upper bound."""
    roots = sp.solve(sp.Eq((r - 1) * r * q, eps), r)
    above = [root for root in roots if (root - 1).subs({q: 1, eps: sp.Rational(1, 10)}) > 0]
    closed = ob.HALF + ob.HALF * sp.sqrt(1 + 4 * eps / q)
    return len(above) == 1 and sp.simplify(above[0] - closed) == 0


def dcpo_lower_bound_solves_inequality() -> bool:
    """DCPO Eq. 25-27: of the roots of (1 - r) r q = eps, the one that tends to 1 as eps -> 0 is the lower bound."""
    e = sp.Symbol("e", real=True)
    roots = sp.solve(sp.Eq((1 - r) * r * q, e), r)
    near_one = [root for root in roots if sp.limit(root, e, 0, "+") == 1]
    closed = ob.HALF + ob.HALF * sp.sqrt(1 - 4 * e / q)
    return len(near_one) == 1 and sp.simplify(near_one[0] - closed) == 0


def dcpo_bound_touches_grpo() -> bool:
    """DCPO Eq. 28: with eps_high = eps and eps_low = eps - eps^2 the bound meets GRPO's at (1/(1+eps), 1+eps)
    and (1, 1-eps), for 0 < eps < 1/2 (written eps = (1 - t)/2 with 0 < t < 1)."""
    upper = ob.dcpo_upper(1 / (1 + eps), eps, sp.oo)
    upper = upper.replace(lambda e: isinstance(e, sp.Pow) and e.exp == ob.HALF,
                          lambda e: sp.sqrt(sp.factor(e.base)))  # sqrt((1 + 2 eps)^2) = 1 + 2 eps
    t = sp.Symbol("t", positive=True)
    e = (1 - t) / 2
    inside = 1 - 4 * (e - e**2)  # = t^2 >= 0, so max(inside, 0) = inside
    lower = ob.HALF + ob.HALF * sp.sqrt(inside)
    return (sp.simplify(upper - (1 + eps)) == 0 and sp.factor(inside) == t**2
            and sp.simplify(lower - (1 - e)) == 0)


def dcpo_bound_satisfies_constraint_with_equality() -> bool:
    """Both closed-form bounds sit exactly on the boundary abs((r - 1) r q) = eps of DCPO's constraint."""
    hi = ob.HALF + ob.HALF * sp.sqrt(1 + 4 * eps / q)
    lo = ob.HALF + ob.HALF * sp.sqrt(1 - 4 * eps / q)
    return sp.expand((hi - 1) * hi * q - eps) == 0 and sp.expand((1 - lo) * lo * q - eps) == 0


def gspo_token_equals_gspo(length: int = 3) -> bool:
    """GSPO Eq. 13-14 vs Eq. 5-7: with a constant advantage the GSPO-token objective has GSPO's value and,
    in both the unclipped and the clipped region, GSPO's gradient in every token's log-prob."""
    lp = sp.symbols(f"lp0:{length}", real=True)
    sg = sp.symbols(f"sg0:{length}", real=True)
    old = sp.symbols(f"old0:{length}", real=True)
    a, lo, hi = sp.symbols("A lo hi", real=True)
    seq_ratio = sp.exp(sum(l - o for l, o in zip(lp, old)) / length)
    frozen_ratio = seq_ratio.xreplace(dict(zip(lp, sg)))
    token_ratios = [frozen_ratio * sp.exp(l - s) for l, s in zip(lp, sg)]
    at_sg = dict(zip(sg, lp))
    ok = sp.simplify(sum(token_ratios).xreplace(at_sg) / length - seq_ratio) == 0
    # unclipped region: the surrogate is r*A for both; clipped region: a constant, gradient 0 for both
    gspo_obj = seq_ratio * a
    token_obj = sum(tr * a for tr in token_ratios) / length
    for l in lp:
        ok &= sp.simplify(sp.diff(token_obj, l).xreplace(at_sg) - sp.diff(gspo_obj, l)) == 0
        ok &= sp.diff(hi * a, l) == 0 and sp.diff(lo * a, l) == 0
    return bool(ok)


def sapo_gate_derivative() -> bool:
    """SAPO Eq. 5-6: d/dr (4/tau) sigmoid(tau (r - 1)) = sech^2(tau (r - 1) / 2), which is 1 at r = 1."""
    rr = sp.Symbol("r", real=True)
    derivative = sp.diff(ob.sapo_gate(rr, tau), rr)
    target = sp.sech(tau * (rr - 1) / 2) ** 2
    same = sp.simplify((derivative - target).rewrite(sp.exp)) == 0
    return same and sp.simplify(derivative.subs(rr, 1)) == 1


def k3_nonnegative() -> bool:
    """k3 = e^d - d - 1 >= 0 with equality only at d = 0: its only critical point is d = 0, where it is 0,
    and it is strictly convex."""
    dd = sp.Symbol("d", real=True)
    k3 = ob.kl_estimator(sp.Integer(0), dd, "k3")  # logp = 0, ref_logp = d
    critical = sp.solve(sp.Eq(sp.diff(k3, dd), 0), dd)
    return critical == [0] and k3.subs(dd, 0) == 0 and sp.diff(k3, dd, 2).is_positive


def k3_unbiased(n: int = 3) -> bool:
    """E_{x ~ pi}[k3] = KL(pi || ref) for a categorical over n outcomes."""
    p = list(sp.symbols(f"p0:{n - 1}", positive=True))
    p.append(1 - sum(p))
    s = list(sp.symbols(f"s0:{n - 1}", positive=True))
    s.append(1 - sum(s))
    expectation = sum(pi * ob.kl_estimator(sp.log(pi), sp.log(si), "k3") for pi, si in zip(p, s))
    kl = sum(pi * sp.log(pi / si) for pi, si in zip(p, s))
    return sp.simplify(sp.expand_log(expectation - kl, force=True)) == 0


def ppo_gradient_zero_where_clipped() -> bool:
    """PPO Eq. 7: in every region of (sign A, r vs [lo, hi]) the surrogate's gradient is 0 exactly where the
    clipped indicator that clip_frac counts is true (A != 0)."""
    lo, delta, a = sp.symbols("lo delta a", positive=True)
    hi = lo + delta  # any 0 < lo < hi
    u = sp.Symbol("u", positive=True)
    regions = {"below": lo * u / (1 + u), "inside": lo + delta * u / (1 + u), "above": hi + u}
    ok = True
    for sign in (1, -1):
        adv = sign * a
        for where, point in regions.items():
            rr = sp.Symbol("r", positive=True)
            select = ob.AtPoint({rr: point})
            surrogate = ob.ppo_clip_surrogate(rr, adv, lo, hi, select)
            grad = sp.diff(surrogate, rr).subs(rr, point)
            clipped = not select.holds(rr * adv <= ob.clip(rr, lo, hi, select) * adv)
            expected_clipped = (sign > 0 and where == "above") or (sign < 0 and where == "below")
            ok &= clipped == expected_clipped and ((sp.simplify(grad) == 0) == clipped)
    return bool(ok)


def gae_recursion_equals_sum(length: int = 4) -> bool:
    """GAE Eq. 16: the recursion A_t = delta_t + gamma lam A_{t+1} equals sum_l (gamma lam)^l delta_{t+l}."""
    from .exact import gae
    g, lam = sp.symbols("gamma lambda", positive=True)
    rew = sp.symbols(f"r0:{length}", real=True)
    val = sp.symbols(f"V0:{length}", real=True)
    adv, _ = gae([list(rew)], [list(val)], [[1] * length], gamma=g, lam=lam)
    nxt = list(val[1:]) + [0]
    delta = [rew[t] + g * nxt[t] - val[t] for t in range(length)]
    closed = [sum((g * lam) ** k * delta[t + k] for k in range(length - t)) for t in range(length)]
    return all(sp.expand(adv[0, t] - closed[t]) == 0 for t in range(length))


def sas_first_visit_is_grpo(group_size: int = 4) -> bool:
    """DCPO SAS at a prompt's first visit equals GRPO's standardisation (population std, no eps)."""
    from .exact import SmoothAdvantage, group_advantages
    rew = [sp.Symbol(f"R{k}", real=True) for k in range(group_size)]
    sas = SmoothAdvantage()(["p"], rew, group_size)
    grpo = group_advantages(rew, group_size, eps=0, unbiased=False)
    return all(sp.simplify(a - b) == 0 for a, b in zip(sas, grpo))


CHECKS = {
    "dcpo_upper_bound_solves_inequality": dcpo_upper_bound_solves_inequality,
    "dcpo_lower_bound_solves_inequality": dcpo_lower_bound_solves_inequality,
    "dcpo_bound_satisfies_constraint_with_equality": dcpo_bound_satisfies_constraint_with_equality,
    "dcpo_bound_touches_grpo": dcpo_bound_touches_grpo,
    "gspo_token_equals_gspo": gspo_token_equals_gspo,
    "sapo_gate_derivative": sapo_gate_derivative,
    "k3_nonnegative": k3_nonnegative,
    "k3_unbiased": k3_unbiased,
    "ppo_gradient_zero_where_clipped": ppo_gradient_zero_where_clipped,
    "gae_recursion_equals_sum": gae_recursion_equals_sum,
    "sas_first_visit_is_grpo": sas_first_visit_is_grpo,
}


# -- beyond the seeds (reference "Beyond the seeds"): each derivation runs the code the layers use ------------------

def cispo_gradient_is_truncated_reinforce() -> bool:
    """MiniMax-M1 Eq. 4-5: CISPO's gradient in logp is -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A, the REINFORCE
    gradient weighted by the truncated ratio; at r = 3/2, A = 1 PPO-clip's gradient is 0 and CISPO's is not."""
    from .exact import policy_loss, symbolic_objective
    expr, s = symbolic_objective("cispo", 1, 1)
    lp, sg, old, a = s["lp"][0][0], s["sg"][0][0], s["old"][0][0], s["A"][0][0]
    weight = ob.clip(sp.exp(lp - old), 0, 5)  # the defaults: eps_low 1, eps_high 4
    same = sp.simplify((sp.diff(expr, lp).xreplace({sg: lp}) - (-weight * a)).rewrite(sp.Piecewise)) == 0
    point = ([[float(sp.log(sp.Rational(3, 2)))]], [[0.0]], [[1.0]], [[1]])
    _, ppo_grad = policy_loss("ppo", *point)
    _, cispo_grad = policy_loss("cispo", *point)
    return bool(same and ppo_grad[0, 0] == 0 and abs(sp.N(cispo_grad[0, 0] + sp.Rational(3, 2), 30)) < 1e-12)


def gmpo_bounded_by_arithmetic_mean() -> bool:
    """GMPO Sec. 3: for A > 0 its objective exp(mean_t c_t) on the clipped log-ratios c_t is at most the arithmetic
    mean of the same clipped ratios (AM-GM: for two tokens the gap is (e^(c0/2) - e^(c1/2))^2 / 2 >= 0), with
    equality at constant ratios; checked where no token is clipped and where token 1 is clipped at eps_high."""
    from .contract import resolve_hparams
    from .exact import _exact_hp
    from .registry import get_algorithm
    alg, hp = get_algorithm("gmpo"), _exact_hp(resolve_hparams("gmpo", {}))
    x = list(sp.symbols("x0 x1", real=True))
    ok = True
    for x1 in (sp.Rational(1, 10), sp.Integer(1)):  # inside the clip, then above eps_high = 2/5
        select = ob.AtPoint({x[0]: sp.Rational(1, 10), x[1]: x1})
        objective = -ob.policy_objective(alg, hp, [x], [x], [[0, 0]], [[1, 1]], [[1, 1]], select=select)
        c = [ob.gmpo_clipped_log_ratio(v, 1, hp["eps_low"], hp["eps_high"], select) for v in x]
        arithmetic = (sp.exp(c[0]) + sp.exp(c[1])) / 2
        ok &= sp.simplify(arithmetic - objective - (sp.exp(c[0] / 2) - sp.exp(c[1] / 2)) ** 2 / 2) == 0
        ok &= (c[1] == x[1]) == (x1 < hp["eps_high"])
    return bool(ok and sp.simplify((arithmetic - objective).xreplace({x[0]: c[1]})) == 0)


def rloo_is_scaled_centring(group_size: int = 4) -> bool:
    """RLOO 2402.14740, Sec. 3: R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g)."""
    from .exact import group_advantages
    rew = [sp.Symbol(f"R{k}", real=True) for k in range(group_size)]
    out = group_advantages(rew, group_size, kind="rloo")
    mean = sum(rew) / group_size
    return all(sp.simplify(a - sp.Rational(group_size, group_size - 1) * (x - mean)) == 0 for a, x in zip(out, rew))


def k3_unbiased_under_old_policy(n: int = 3) -> bool:
    """DeepSeek-V3.2 2512.02556 Sec. 3.1: E_{x ~ pi_old}[(pi/pi_old) k3] = KL(pi || ref) for categoricals over n."""
    def simplex(name):
        p = list(sp.symbols(f"{name}0:{n - 1}", positive=True))
        return p + [1 - sum(p)]
    old, cur, ref = simplex("o"), simplex("p"), simplex("s")
    expectation = sum(o * ob.kl_estimator(sp.log(p), sp.log(s), "k3_unbiased", sp.log(o))
                      for o, p, s in zip(old, cur, ref))
    kl = sum(p * sp.log(p / s) for p, s in zip(cur, ref))
    return sp.simplify(sp.expand_log(expectation - kl, force=True)) == 0


def tis_without_cap_is_plain_importance_weighting() -> bool:
    """Truncated IS with C = oo weights each token's loss by exp(old_logp - rollout_logp) exactly."""
    from .contract import resolve_hparams
    from .exact import _exact_hp, symbolic_objective
    from .registry import get_algorithm
    plain, s = symbolic_objective("grpo", 1, 2, beta=0.0)
    hp = _exact_hp(resolve_hparams("grpo", {"beta": 0.0, "rollout_correction": "tis"}))
    hp["tis_cap"] = sp.oo
    tis = ob.policy_objective(get_algorithm("grpo"), hp, s["lp"], s["sg"], s["old"], s["A"], [[1, 1]],
                              rollout=s["ro"])
    plain_tokens = [symbolic_objective("grpo", 1, 2, beta=0.0, mask=[[int(t == k) for t in range(2)]])[0]
                    for k in range(2)]
    weighted = sum(sp.exp(s["old"][0][k] - s["ro"][0][k]) * plain_tokens[k] for k in range(2)) / 2
    return bool(sp.simplify(tis - weighted) == 0 and plain.has(sp.Piecewise))


def kl_cov_without_selection_is_plain_pg(length: int = 3) -> bool:
    """KL-Cov with k = 0 selects no token (spec.selection) and its loss is the plain surrogate -mean_t r_t A_t."""
    import numpy as np

    from .exact import symbolic_objective
    from .selection import kl_cov_select
    none = not kl_cov_select(np.arange(length, dtype=float)[None], np.ones((1, length)), 0.0).any()
    expr, s = symbolic_objective("kl_cov", 1, length, kl_cov_ratio=0.0)
    plain = -sum(sp.exp(s["lp"][0][t] - s["old"][0][t]) * s["A"][0][t] for t in range(length)) / length
    return bool(none and sp.simplify(expr - plain) == 0)


CHECKS.update({
    "cispo_gradient_is_truncated_reinforce": cispo_gradient_is_truncated_reinforce,
    "gmpo_bounded_by_arithmetic_mean": gmpo_bounded_by_arithmetic_mean,
    "rloo_is_scaled_centring": rloo_is_scaled_centring,
    "k3_unbiased_under_old_policy": k3_unbiased_under_old_policy,
    "tis_without_cap_is_plain_importance_weighting": tis_without_cap_is_plain_importance_weighting,
    "kl_cov_without_selection_is_plain_pg": kl_cov_without_selection_is_plain_pg,
})
