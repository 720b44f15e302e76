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
