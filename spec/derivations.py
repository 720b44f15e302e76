"""Derivations the papers make, checked by sympy; each returns True when the identity holds symbolically."""
from __future__ import annotations

import sympy as sp

from . import objectives as ob

r, q, eps, tau, d, x = sp.symbols("r q epsilon tau d x", positive=True)


def dcpo_upper_bound_solves_inequality() -> bool:
    """DCPO Eq. 21-24: the root above 1 of (r - 1) r q = eps is the implementation's upper bound
    (objectives.dcpo_upper, uncapped), and the cap r_max = c binds exactly from q = eps / (c (c - 1)) down."""
    roots = sp.solve(sp.Eq((r - 1) * r * q, eps), r)
    above = [root for root in roots if (root - 1).subs({q: 1, eps: sp.Rational(1, 10)}) > 0]
    c = 1 + sp.Symbol("u", positive=True)  # any cap above 1
    at_cap = _factor_roots(ob.dcpo_upper(eps / (c * (c - 1)), eps, sp.oo))  # sqrt((2c - 1)^2) = 2c - 1
    return (len(above) == 1 and sp.simplify(above[0] - ob.dcpo_upper(q, eps, sp.oo)) == 0
            and sp.simplify(at_cap - c) == 0)


def _factor_roots(expr):
    """Square roots with their radicands factored, so that sqrt(x^2) becomes x for a positive x."""
    return expr.replace(lambda e: isinstance(e, sp.Pow) and e.exp == ob.HALF, lambda e: sp.sqrt(sp.factor(e.base)))


def _eps_low_below(quarter_q_share):
    """eps_low written against q: eps_low = q (1 - s) / 4, so that 1 - 4 eps_low / q = s."""
    return q * (1 - quarter_q_share) / 4


def dcpo_lower_bound_solves_inequality() -> bool:
    """DCPO Eq. 25-27: where 4 eps <= q, the root of (1 - r) r q = eps that tends to 1 as eps -> 0 is the
    implementation's lower bound (objectives.dcpo_lower); where 4 eps > q, (1 - r) r q peaks at q/4 < eps on
    [1/2, 1], so no ratio there breaks the constraint, and the bound is 1/2."""
    e = sp.Symbol("e", real=True)
    t = sp.Symbol("t", positive=True)
    roots = sp.solve(sp.Eq((1 - r) * r * q, e), r)
    near_one = [root for root in roots if sp.limit(root, e, 0, "+") == 1]
    inside = _eps_low_below(t**2)  # 4 eps <= q
    outside = _eps_low_below(-t**2)  # 4 eps > q
    rr = sp.Symbol("r", real=True)
    peak = sp.maximum((1 - rr) * rr * q, rr, sp.Interval(ob.HALF, 1))
    return (len(near_one) == 1 and sp.simplify(near_one[0].subs(e, inside) - ob.dcpo_lower(q, inside)) == 0
            and ob.dcpo_lower(q, outside) == ob.HALF and sp.simplify(peak - q / 4) == 0)


def dcpo_bound_touches_grpo() -> bool:
    """DCPO Eq. 28: with eps_high = eps and eps_low = eps - eps^2 the implementation's bounds meet GRPO's at
    (1/(1+eps), 1+eps) and (1, 1-eps), for 0 < eps < 1/2 (written eps = (1 - t)/2 with 0 < t < 1)."""
    upper = _factor_roots(ob.dcpo_upper(1 / (1 + eps), eps, sp.oo))  # sqrt((1 + 2 eps)^2) = 1 + 2 eps
    t = sp.Symbol("t", positive=True)
    e = (1 - t) / 2
    lower = ob.dcpo_lower(1, sp.factor(e - e**2))  # 1 - 4 (e - e^2) = t^2 >= 0
    return sp.simplify(upper - (1 + eps)) == 0 and sp.simplify(lower - (1 - e)) == 0


def dcpo_bound_satisfies_constraint_with_equality() -> bool:
    """The implementation's bounds (objectives.dcpo_upper uncapped, objectives.dcpo_lower where 4 eps <= q) sit
    exactly on the boundary abs((r - 1) r q) = eps of DCPO's constraint."""
    t = sp.Symbol("t", positive=True)
    hi = ob.dcpo_upper(q, eps, sp.oo)
    eps_low = _eps_low_below(t**2)
    lo = ob.dcpo_lower(q, eps_low)
    return sp.expand((hi - 1) * hi * q - eps) == 0 and sp.expand((1 - lo) * lo * q - eps_low) == 0


def gspo_token_equals_gspo(length: int = 3) -> bool:
    """GSPO Eq. 13-14 vs Eq. 5-7: with a constant advantage the implementation's GSPO-token loss
    (objectives.policy_objective, registry defaults) has GSPO's value and gradient in every token's log-prob, for
    A > 0 and A < 0, inside the clip range, above and below it (the branch active at a point of each)."""
    from .contract import resolve_hparams
    from .exact import _exact_hp
    from .registry import get_algorithm
    lp, sg, old = ([list(sp.symbols(f"{k}0:{length}", real=True))] for k in ("lp", "sg", "old"))
    a = sp.Symbol("A", real=True)
    at_sg = dict(zip(sg[0], lp[0]))
    step = sp.Rational(3, 100)
    ok = True
    for region, log_ratios in (("inside", [step / 300, -step / 300, 0]), ("above", [step, 0, 0]),
                               ("below", [-step, 0, 0])):
        for sign in (1, -1):
            point = {a: sign, **{o: -1 for o in old[0]}}
            point.update({x: -1 + d for x, d in zip(lp[0] + sg[0], log_ratios * 2)})
            loss = {name: ob.policy_objective(get_algorithm(name), _exact_hp(resolve_hparams(name, {})), lp, sg, old,
                                              [[a] * length], [[1] * length], None, None, ob.AtPoint(point))
                    for name in ("gspo", "gspo_token")}
            ok &= sp.simplify(loss["gspo_token"].xreplace(at_sg) - loss["gspo"]) == 0
            for x in lp[0]:
                seq_grad = sp.diff(loss["gspo"], x)
                ok &= sp.simplify(sp.diff(loss["gspo_token"], x).xreplace(at_sg) - seq_grad) == 0
                ok &= (seq_grad == 0) == ((region, sign) in (("above", 1), ("below", -1)))  # clipped: 0
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
    """DCPO SAS at a prompt's first visit equals GRPO's standardisation with the population std and no eps; with
    this project's GRPO default std (unbiased) it is sqrt(G/(G-1)) times GRPO's (at eps 0; the default eps 1e-6
    adds a factor 1 + eps/std)."""
    from .exact import SmoothAdvantage, group_advantages
    rew = [sp.Symbol(f"R{k}", real=True) for k in range(group_size)]
    sas = SmoothAdvantage()(["p"], rew, group_size)
    population = group_advantages(rew, group_size, eps=0, unbiased=False)
    default_std = group_advantages(rew, group_size, eps=0)
    factor = sp.sqrt(sp.Rational(group_size, group_size - 1))
    ok = all(sp.simplify(a - b) == 0 for a, b in zip(sas, population))
    for a, c in zip(sas, default_std):  # branch by branch: both are 0 where the std is 0, else their ratio is fixed
        (a_zero, _), (a_else, _) = a.args
        (c_zero, _), (c_else, _) = c.args
        ok &= a_zero == c_zero == 0 and sp.simplify(a_else - factor * c_else) == 0
    return ok


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
    from .exact import _exact_hp, short_rational, symbolic_objective
    from .registry import get_algorithm
    plain, s = symbolic_objective("grpo", 1, 2, beta=0.0)
    hp = _exact_hp(resolve_hparams("grpo", {"beta": 0.0, "rollout_correction": "tis"}), short_rational)
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


def dppo_binary_tv_is_a_ratio_clip_scaled_by_mu() -> bool:
    """DPPO-Binary-TV (Qi et al. 2602.04879): with mu = pi_old the mask the layers use (objectives.dppo_keep) is
    PPO's ratio clip with widths eps / mu: for A > 0 a token is masked just past r = 1 + eps_high / mu and kept just
    inside, for A < 0 masked just below r = 1 - eps_low / mu and kept just above, never where that bound is <= 0 (a
    rare token's range is wide, a likely one's narrow); checked at eps 3/20 for mu from 1/1000 to 9/10, 1e-6 off each
    bound."""
    eps, step = sp.Rational(3, 20), sp.Rational(1, 10**6)
    hp = {"eps_high": eps, "eps_low": eps}
    ok = True
    for mu in (sp.Rational(1, 1000), sp.Rational(1, 10), ob.HALF, sp.Rational(9, 10)):
        high, low = 1 + eps / mu, 1 - eps / mu
        points = [(1, high * (1 + step), 0), (1, high * (1 - step), 1)]
        points += [(-1, low * (1 - step), 0), (-1, low * (1 + step), 1)] if low > 0 else [(-1, step, 1)]
        for adv, r, keep in points:
            ok &= ob.dppo_keep(sp.log(r * mu), sp.log(mu), adv, hp, "binary_tv", ob.AtPoint({})) == keep
    return bool(ok)


def dppo_binary_kl_grows_away_from_mu() -> bool:
    """DPPO-Binary-KL (Qi et al. 2602.04879): the binary KL the layers use (objectives.binary_kl, mu < 1) is 0 at pi =
    mu and has derivative (pi - mu) / (pi (1 - pi)) in pi: it grows on each side of mu, so each one-sided mask (pi >
    mu with KL > eps_high for A > 0, pi < mu with KL > eps_low for A < 0) is a ratio bound, one on each side of 1."""
    p, m = sp.symbols("pi mu", positive=True)
    general = lambda *pairs: pairs[-1][0]  # noqa: E731 - the branch for mu < 1 (the other is mu = 1)
    kl = ob.binary_kl(sp.log(p), sp.log(m), general)
    return bool(sp.simplify(kl.subs(p, m)) == 0
                and sp.simplify(sp.diff(kl, p) - (p - m) / (p * (1 - p))) == 0)


def luspo_is_gspo_scaled_by_length() -> bool:
    """LUSPO (Liu et al. 2602.05261): the implementation's objective (registry defaults) over responses of lengths 1
    and 3 is (1/B) sum_i |o_i| l_i, l_i GSPO's per-sequence loss at the same clip widths, whereas GSPO's own is (1/B)
    sum_i l_i: every token of a response gets the same gradient scale whatever its length."""
    from .exact import symbolic_objective
    from .registry import get_algorithm
    widths = {k: get_algorithm("luspo").defaults[k] for k in ("eps_low", "eps_high")}
    mask = [[1, 0, 0], [1, 1, 1]]
    luspo, _ = symbolic_objective("luspo", 2, 3, mask=mask)
    rows = [symbolic_objective("gspo", 2, 3, mask=[row if k == i else [0, 0, 0] for k, row in enumerate(mask)],
                               **widths)[0] for i in range(2)]
    gspo, _ = symbolic_objective("gspo", 2, 3, mask=mask, **widths)
    return bool(sp.simplify(luspo - (1 * rows[0] + 3 * rows[1]) / 2) == 0
                and sp.simplify(gspo - (rows[0] + rows[1]) / 2) == 0)


def vespo_kernel_is_one_on_policy_and_peaks_at_c1_over_c2() -> bool:
    """VESPO (2602.10693 Sec. 3.4): the kernel the layers use (objectives.vespo_kernel, registry defaults) is 1 at W
    = 1 (on policy the gradient is REINFORCE's -A), has its maximum at W = c1 / c2 and tends to 0 as W -> 0 and W ->
    oo, for both signs of A: the sequence weight is reshaped smoothly, never clipped."""
    from .contract import resolve_hparams
    from .exact import _exact_hp, short_rational
    hp = _exact_hp(resolve_hparams("vespo", {}), short_rational)
    x = sp.Symbol("x", real=True)  # log W
    ok = True
    for adv, sign in ((1, "pos"), (-1, "neg")):
        phi = ob.vespo_kernel(x, adv, hp)  # Piecewise((0, x > cap), (kernel, True))
        kernel = phi.args[-1][0]
        peak = sp.log(hp[f"vespo_k_{sign}"] / hp[f"vespo_lambda_{sign}"])
        ok &= phi.subs(x, 0) == 1 and sp.simplify(sp.diff(phi, x).subs(x, peak)) == 0
        ok &= bool(sp.diff(kernel, x, 2).subs(x, peak) < 0)
        ok &= sp.limit(kernel, x, sp.oo) == 0 and sp.limit(kernel, x, -sp.oo) == 0
    return bool(ok)


def geo_rs_is_seq_rs_with_the_band_to_the_length() -> bool:
    """Rejection sampling (verl's rollout_rs): the geometric-mean mask the layers use (objectives.rollout_weight,
    geo_rs) keeps a row of n tokens exactly where the sequence mask (seq_rs) with the band [lo^n, hi^n] does, as
    prod_t rho = (geometric mean)^n: checked for n = 1, 3, 8 just inside and just outside both ends of [4/5, 5/4]."""
    lo, hi, step = sp.Rational(4, 5), sp.Rational(5, 4), sp.Rational(1, 10**6)
    ok = True
    for n in (1, 3, 8):
        geo = {"rollout_correction": "geo_rs", "mis_low": lo, "mis_high": hi}
        seq = {"rollout_correction": "seq_rs", "mis_low": lo**n, "mis_high": hi**n}
        for mean in (sp.log(hi) + step, sp.log(hi) - step, sp.log(lo) + step, sp.log(lo) - step, sp.Integer(0)):
            at = ob.AtPoint({})
            ok &= ob.rollout_weight(mean, geo, at) == ob.rollout_weight(n * mean, seq, at)
        ok &= ob.rollout_weight(sp.log(hi) + step, geo, ob.AtPoint({})) == 0
    return bool(ok)


def opsm_masks_nothing_on_policy() -> bool:
    """DeepSeek-V3.2's off-policy sequence mask (2512.02556): on policy (pi = pi_old, the mean log gap 0) the
    implementation's GRPO objective with opsm_delta = 0 is GRPO's, for advantages of both signs, while a row whose
    pi fell below pi_old loses its A < 0 tokens' policy terms."""
    from .exact import symbolic_objective
    plain, s = symbolic_objective("grpo", 1, 2, beta=0.0)
    masked, _ = symbolic_objective("grpo", 1, 2, beta=0.0, opsm_delta=0.0)
    at = {s["A"][0][0]: -1, s["A"][0][1]: 1}
    on_policy = {**at, **{s[k][0][t]: s["old"][0][t] for k in ("lp", "sg") for t in range(2)}}
    below = {**at, **{s[k][0][t]: s["old"][0][t] - 1 for k in ("lp", "sg") for t in range(2)}}
    # r = e^-1 below PPO's clip: the A > 0 token keeps -r / 2 (unclipped for A > 0); the A < 0 token's clipped 0.8 / 2
    # is dropped
    kept_term = -sp.exp(sp.Integer(-1)) / 2
    return bool(sp.simplify((masked - plain).xreplace(on_policy)) == 0
                and sp.simplify(masked.xreplace(below) - kept_term) == 0)


CHECKS.update({
    "cispo_gradient_is_truncated_reinforce": cispo_gradient_is_truncated_reinforce,
    "gmpo_bounded_by_arithmetic_mean": gmpo_bounded_by_arithmetic_mean,
    "rloo_is_scaled_centring": rloo_is_scaled_centring,
    "k3_unbiased_under_old_policy": k3_unbiased_under_old_policy,
    "tis_without_cap_is_plain_importance_weighting": tis_without_cap_is_plain_importance_weighting,
    "kl_cov_without_selection_is_plain_pg": kl_cov_without_selection_is_plain_pg,
    "dppo_binary_tv_is_a_ratio_clip_scaled_by_mu": dppo_binary_tv_is_a_ratio_clip_scaled_by_mu,
    "dppo_binary_kl_grows_away_from_mu": dppo_binary_kl_grows_away_from_mu,
    "luspo_is_gspo_scaled_by_length": luspo_is_gspo_scaled_by_length,
    "vespo_kernel_is_one_on_policy_and_peaks_at_c1_over_c2": vespo_kernel_is_one_on_policy_and_peaks_at_c1_over_c2,
    "geo_rs_is_seq_rs_with_the_band_to_the_length": geo_rs_is_seq_rs_with_the_band_to_the_length,
    "opsm_masks_nothing_on_policy": opsm_masks_nothing_on_policy,
})
