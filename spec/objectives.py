"""The objectives' building blocks as sympy expressions; exact evaluation and the derivations both use these."""
from __future__ import annotations

import sympy as sp

from .contract import SAPO_SATURATION, cispo_bounds, vespo_log_weight_cap
from .registry import DIVERGENCE_CLIPS, ROLLOUT_REJECTION, ROLLOUT_ROW_STATISTIC

HALF = sp.Rational(1, 2)


def piecewise(*pairs):
    """The symbolic choice: a Piecewise whose first true condition is active."""
    return sp.Piecewise(*pairs)


class AtPoint:
    """The choice made at a point: picks, exactly, the first branch whose condition holds at ``values``.

    Passing an ``AtPoint`` as ``select`` builds the expression that is active at the point, whose derivative there
    is the derivative of the piecewise objective (the branch convention at ties is the one the layers use).
    """

    def __init__(self, values):
        self.values = values

    def __call__(self, *pairs):
        for branch, cond in pairs:
            if self.holds(cond):
                return branch
        raise ValueError("no branch holds at the point")

    def holds(self, cond):
        cond = sp.sympify(cond)
        if cond in (sp.true, sp.false):
            return bool(cond)
        if isinstance(cond, sp.And):
            return all(self.holds(c) for c in cond.args)
        diff = (cond.lhs - cond.rhs).xreplace(self.values)
        # exact numbers are compared at 60 digits; symbolic ones by their sign under the symbols' assumptions
        diff = sp.N(diff, 60) if diff.is_number else sp.simplify(diff)
        decided = cond.func(diff, 0)
        if decided not in (sp.true, sp.false):
            raise ValueError(f"cannot decide {cond} at the point")
        return bool(decided)


def clip(r, lo, hi, select=piecewise):
    """clip(r, lo, hi), r itself on the closed interval (as np.clip and torch.clamp)."""
    return select((lo, r < lo), (hi, r > hi), (r, True))


def ppo_clip_surrogate(r, adv, lo, hi, select=piecewise, delta=None):
    """PPO Eq. 7 per term: min(r*A, clip(r, lo, hi)*A), with min(r, delta) in the first term under the two-sided
    clip; the unclipped branch wins ties."""
    c = clip(r, lo, hi, select) * adv
    u = capped_ratio(r, delta, select) * adv
    return select((u, u <= c), (c, True))


def ppo_clipped(r, adv, lo, hi):
    """The clipped indicator that ``clip_frac`` counts: the min picks the clipped branch strictly."""
    return sp.Not(r * adv <= clip(r, lo, hi) * adv)


def dual_clip_loss(loss, adv, c, select=piecewise):
    """Dual clip (Ye et al. 1912.09729 Eq. 5 as a loss): for A < 0, loss = min(loss, -c*A)."""
    return select((-c * adv, sp.And(adv < 0, loss > -c * adv)), (loss, True))


def dcpo_lower(q, eps_low):
    """DCPO Eq. 25-27 lower bound: 0.5 + 0.5*sqrt(max(1 - 4*eps_low/q, 0))."""
    return HALF + HALF * sp.sqrt(sp.Max(1 - 4 * eps_low / q, 0))


def dcpo_upper(q, eps_high, r_max):
    """DCPO Eq. 21-24 upper bound: min(0.5 + 0.5*sqrt(1 + 4*eps_high/q), r_max)."""
    return sp.Min(HALF + HALF * sp.sqrt(1 + 4 * eps_high / q), r_max)


def sapo_gate(r, tau):
    """SAPO Eq. 5: f(r) = (4/tau) * sigmoid(tau * (r - 1))."""
    return 4 / tau / (1 + sp.exp(-tau * (r - 1)))


def saturated_sapo_gate(r, tau, select=piecewise):
    """SAPO's gate as every layer computes it: 4/tau where tau (r - 1) > SAPO_SATURATION (spec.contract.RATIO_GUARDS:
    within e^-4096 of the gate, and e^(-e^x) at a log-ratio x of 1e300 is not evaluable), the gate elsewhere."""
    return select((4 / tau, tau * (r - 1) > SAPO_SATURATION), (sapo_gate(r, tau), True))


def kl_estimator(logp, ref_logp, kind, old_logp=None):
    """Schulman's estimators of KL(pi || ref) with d = ref_logp - logp: k1 = -d, k2 = d^2/2, k3 = e^d - d - 1;
    k3_unbiased = exp(logp - old_logp) * k3 (DeepSeek-V3.2 2512.02556)."""
    d = ref_logp - logp
    if kind == "k3_unbiased":
        return sp.exp(logp - old_logp) * (sp.exp(d) - d - 1)
    return {"k1": -d, "k2": d**2 / 2, "k3": sp.exp(d) - d - 1}[kind]


def capped_ratio(r, delta, select=piecewise):
    """The two-sided clip's min(r, delta) (INTELLECT-2 2505.07291); r itself wins the tie."""
    return r if delta is None else select((delta, r > delta), (r, True))


def binary_kl(x, y, select=piecewise):
    """KL(Bern(mu) || Bern(pi)) of the sampled token, mu = e^y, pi = e^x (DPPO-Binary-KL, Qi et al. 2602.04879):
    mu (y - x) + (1 - mu) log((1 - mu) / (1 - pi)), the second term 0 at mu = 1; for x < 0 and y <= 0."""
    mu = sp.exp(y)
    rest = select((0, sp.Eq(y, 0)), ((1 - mu) * (sp.log(1 - mu) - sp.log(1 - sp.exp(x))), True))
    return mu * (y - x) + rest


def dppo_keep(x, y, adv, hp, kind, select=piecewise):
    """DPPO's trust-region mask (Qi et al. 2602.04879, DPPO-Binary-TV / -KL) of a token with log-probs x (current)
    and y (old): 0 where the update left the region in the direction A pushes it, 1 elsewhere. Binary TV: pi - mu
    > eps_high for A > 0, pi - mu < -eps_low for A < 0. Binary KL: pi > mu with KL > eps_high (or pi >= 1, where
    it is infinite) for A > 0, pi < mu with KL > eps_low for A < 0. A = 0 is never masked."""
    if kind == "binary_tv":
        moved = sp.exp(x) - sp.exp(y)
        up = select((0, moved > hp["eps_high"]), (1, True))
        down = select((0, moved < -hp["eps_low"]), (1, True))
    else:  # each branch is reached only where its KL is defined
        up = select((1, x <= y), (0, x >= 0), (0, binary_kl(x, y, select) > hp["eps_high"]), (1, True))
        down = select((1, x >= y), (0, binary_kl(x, y, select) > hp["eps_low"]), (1, True))
    return select((up, adv > 0), (down, adv < 0), (1, True))


def vespo_kernel(x, adv, hp, select=piecewise):
    """VESPO's reshaping kernel (2602.10693 Sec. 3.4) phi(W) = W^c1 e^(c2 (1 - W)) of the sequence weight W = e^x,
    (c1, c2) by the sign of the row's A (>= 0: the _pos pair); 0 past spec.contract.vespo_log_weight_cap
    (RATIO_GUARDS['vespo_saturation'])."""
    k = select((hp["vespo_k_pos"], adv >= 0), (hp["vespo_k_neg"], True))
    lam = select((hp["vespo_lambda_pos"], adv >= 0), (hp["vespo_lambda_neg"], True))
    caps = [sp.Rational(vespo_log_weight_cap(float(hp[f"vespo_k_{s}"]), float(hp[f"vespo_lambda_{s}"])))
            for s in ("pos", "neg")]
    cap = select((caps[0], adv >= 0), (caps[1], True))
    return select((0, x > cap), (sp.exp(k * x + lam * (1 - sp.exp(x))), True))


def gmpo_clipped_log_ratio(x, sign, eps_low, eps_high, select=piecewise):
    """GMPO's token term sgn(A) * min(sgn(A) x, sgn(A) clip(x, -eps_low, eps_high)) for x = log r; x itself wins
    the tie."""
    xc = clip(x, -eps_low, eps_high, select)
    return select((x, sign * x <= sign * xc), (xc, True))


def rollout_weight(log_rho, hp, select=piecewise):
    """Rollout correction with rho = exp(log_rho): TIS min(rho, C) (Yao et al. 2025); MIS / IcePop (Ring-1T report,
    2025) rho * 1[C_lo <= rho <= C_hi] (token, or with the row's sum of log_rho for seq_mis); rejection sampling
    1[C_lo <= rho <= C_hi] with the row's product of rho (seq_rs) or their geometric mean (geo_rs, log_rho the row's
    mean), as verl's rollout_rs sequence and geometric modes."""
    rho = sp.exp(log_rho)
    if hp["rollout_correction"] == "tis":
        return select((hp["tis_cap"], rho > hp["tis_cap"]), (rho, True))
    kept = 1 if hp["rollout_correction"] in ROLLOUT_REJECTION else rho
    return select((kept, sp.And(rho >= hp["mis_low"], rho <= hp["mis_high"])), (0, True))


def off_policy_keep(adv, mean_log_gap, delta, select=piecewise):
    """DeepSeek-V3.2's off-policy sequence mask (2512.02556, OPSM): 0 for a token with A < 0 in a row whose mean
    log(pi_old / pi) over its tokens (``mean_log_gap``, pi held as a stop-gradient copy) exceeds delta, else 1."""
    return select((0, sp.And(adv < 0, mean_log_gap > delta)), (1, True))


def aggregate(loss, mask, agg, group_size=None, max_len=None):
    """The reference's aggregation modes, written as their formulas over a [B][T] loss (masked rows skipped)."""
    rows = range(len(mask))
    lens = [sum(m) for m in mask]
    row_sum = [sum(l * m for l, m in zip(loss[i], mask[i])) for i in rows]
    nonempty = [i for i in rows if lens[i] > 0]
    if not nonempty:
        return sp.Integer(0)
    if agg == "token_mean":
        return sum(row_sum) / sum(lens)
    if agg in ("seq_mean_token_mean", "seq_mean"):
        return sum(row_sum[i] / lens[i] for i in nonempty) / len(nonempty)
    if agg == "seq_mean_token_sum":
        return sum(row_sum[i] for i in nonempty) / len(nonempty)
    if agg == "seq_mean_token_sum_norm":
        return sum(row_sum[i] / max_len for i in nonempty) / len(nonempty)
    groups = [range(g, g + group_size) for g in range(0, len(mask), group_size)]
    groups = [g for g in groups if sum(lens[i] for i in g) > 0]
    if agg == "group_token_mean":
        return sum(sum(row_sum[i] for i in g) / sum(lens[i] for i in g) for g in groups) / len(groups)
    if agg == "group_seq_sum_token_mean":
        return sum(sum(row_sum[i] / lens[i] for i in g if lens[i] > 0) for g in groups) / len(groups)
    raise ValueError(f"agg: unknown aggregation mode {agg!r}")


def policy_objective(alg, hp, live, frozen, old, adv, mask, ref=None, group_size=None, select=piecewise,
                     rollout=None, chosen=None):
    """A registry algorithm's loss (the negated objective) over a [B][T] batch: ``live`` are the logp symbols,
    ``frozen`` their stop-gradient copies, the rest numbers or symbols; ``hp`` holds exact hyper-parameters;
    ``rollout`` the engine's log-probs (rollout correction); ``chosen`` the 0/1 Clip-Cov / KL-Cov selection."""
    n_rows, n_cols = len(mask), len(mask[0]) if mask else 0
    lens = [sum(row) for row in mask]
    tokens = [[t for t in range(n_cols) if mask[i][t]] for i in range(n_rows)]

    def seq_ratio(symbols, i):  # GSPO Eq. 6: s_i = exp(mean_t log(pi / pi_old))
        return sp.exp(sum(symbols[i][t] - old[i][t] for t in tokens[i]) / lens[i])

    def seq_adv(i):  # the row's advantage: the mean of its token advantages
        return sum(adv[i][k] for k in tokens[i]) / lens[i]

    def clipped_loss(r, a, q):
        if alg.clip == "dynamic":  # DCPO Eq. 4 with the bounds of Eq. 21-27
            lo, hi = dcpo_lower(q, hp["eps_low"]), dcpo_upper(q, hp["eps_high"], hp["r_max"])
        else:
            lo, hi = 1 - hp["eps_low"], 1 + hp["eps_high"]
        out = -ppo_clip_surrogate(r, a, lo, hi, select, hp["delta"])
        return out if hp["dual_clip"] is None else dual_clip_loss(out, a, hp["dual_clip"], select)

    def gmpo_loss(i):  # GMPO: -A_i * exp(mean_t of the log-clipped token log-ratios)
        a = seq_adv(i)
        terms = [gmpo_clipped_log_ratio(live[i][t] - old[i][t], sp.sign(a), hp["eps_low"], hp["eps_high"], select)
                 for t in tokens[i]]
        return -a * sp.exp(sum(terms) / lens[i])

    def token_loss(i, t):
        a = adv[i][t]
        if alg.ratio == "sequence":  # GSPO Eq. 7 with the row's advantage
            return clipped_loss(seq_ratio(live, i), seq_adv(i), None)
        if alg.ratio == "geometric":
            return gmpo_loss(i)
        if alg.ratio == "none":  # GPG: the plain policy gradient -A log pi
            return -a * live[i][t]
        if alg.ratio == "sequence_token":  # GSPO Eq. 13: sg[s_i] * pi / sg[pi]
            r = seq_ratio(frozen, i) * sp.exp(live[i][t] - frozen[i][t])
        else:
            r = sp.exp(live[i][t] - old[i][t])
        if alg.clip == "soft":  # SAPO Eq. 6: tau by the sign of A
            return -saturated_sapo_gate(r, select((hp["tau_pos"], a > 0), (hp["tau_neg"], True)), select) * a
        if alg.clip == "truncated":  # MiniMax-M1 Eq. 4: -sg(clip(r)) * A * log pi
            lo, hi = cispo_bounds(hp)
            return -clip(sp.exp(frozen[i][t] - old[i][t]), lo, hi, select) * a * live[i][t]
        if alg.clip == "gamma":  # VESPO: -sg(phi(W)) A log pi, W the product of the row's token ratios
            weight = vespo_kernel(sum(frozen[i][k] - old[i][k] for k in tokens[i]), seq_adv(i), hp, select)
            return -weight * a * live[i][t]
        if alg.clip in DIVERGENCE_CLIPS:  # DPPO: -sg(M r) A log pi, M the trust-region mask
            keep = dppo_keep(frozen[i][t], old[i][t], a, hp, alg.clip, select)
            return -keep * sp.exp(frozen[i][t] - old[i][t]) * a * live[i][t]
        if alg.clip == "off":  # KL-Cov: -r A, plus the |log r| penalty on the selected tokens
            return -r * a + (hp["kl_cov_coef"] * sp.Abs(live[i][t] - old[i][t]) if chosen and chosen[i][t] else 0)
        if chosen and chosen[i][t]:  # Clip-Cov: the value at the stop-gradient copy, so no gradient
            return clipped_loss(sp.exp(frozen[i][t] - old[i][t]), a, sp.exp(old[i][t]))
        return clipped_loss(r, a, sp.exp(old[i][t]))

    def correction(i, t):
        if hp["rollout_correction"] is None:
            return 1
        row = ROLLOUT_ROW_STATISTIC.get(hp["rollout_correction"])
        if row is not None:  # the row's log of prod_t rho, or of their geometric mean
            total = sum(old[i][k] - rollout[i][k] for k in tokens[i])
            return rollout_weight(total if row == "product" else total / lens[i], hp, select)
        return rollout_weight(old[i][t] - rollout[i][t], hp, select)

    def off_policy(i, t):
        if hp["opsm_delta"] is None:
            return 1
        gap = sum(old[i][k] - frozen[i][k] for k in tokens[i]) / lens[i]
        return off_policy_keep(adv[i][t], gap, hp["opsm_delta"], select)

    loss = [[sp.Integer(0)] * n_cols for _ in range(n_rows)]
    for i in range(n_rows):
        for t in tokens[i]:
            loss[i][t] = correction(i, t) * off_policy(i, t) * token_loss(i, t)
            if ref is not None:  # DeepSeekMath Eq. 3: + beta * KL inside the token sum
                loss[i][t] += hp["beta"] * kl_estimator(live[i][t], ref[i][t], hp["kl"], old[i][t])
    return aggregate(loss, mask, hp["agg"], group_size, hp["max_len"])
