"""The objectives' building blocks as sympy expressions; exact evaluation and the derivations both use these."""
from __future__ import annotations

import sympy as sp

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


def ppo_clip_surrogate(r, adv, lo, hi, select=piecewise):
    """PPO Eq. 7 per term: min(r*A, clip(r, lo, hi)*A); the unclipped branch wins ties."""
    c = clip(r, lo, hi, select) * adv
    return select((r * adv, r * adv <= c), (c, True))


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


def kl_estimator(logp, ref_logp, kind):
    """Schulman's estimators of KL(pi || ref) with d = ref_logp - logp: k1 = -d, k2 = d^2/2, k3 = e^d - d - 1."""
    d = ref_logp - logp
    return {"k1": -d, "k2": d**2 / 2, "k3": sp.exp(d) - d - 1}[kind]


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


def policy_objective(alg, hp, live, frozen, old, adv, mask, ref=None, group_size=None, select=piecewise):
    """A registry algorithm's loss (the negated objective) over a [B][T] batch: ``live`` are the logp symbols,
    ``frozen`` their stop-gradient copies, the rest numbers or symbols; ``hp`` holds exact hyper-parameters."""
    n_rows, n_cols = len(mask), len(mask[0]) if mask else 0
    lens = [sum(row) for row in mask]

    def seq_ratio(symbols, i):  # GSPO Eq. 6: s_i = exp(mean_t log(pi / pi_old))
        return sp.exp(sum(symbols[i][t] - old[i][t] for t in range(n_cols) if mask[i][t]) / lens[i])

    def clipped_loss(r, a, q):
        if alg.clip == "dynamic":  # DCPO Eq. 4 with the bounds of Eq. 21-27
            lo, hi = dcpo_lower(q, hp["eps_low"]), dcpo_upper(q, hp["eps_high"], hp["r_max"])
        else:
            lo, hi = 1 - hp["eps_low"], 1 + hp["eps_high"]
        out = -ppo_clip_surrogate(r, a, lo, hi, select)
        return out if hp["dual_clip"] is None else dual_clip_loss(out, a, hp["dual_clip"], select)

    def token_loss(i, t):
        a = adv[i][t]
        if alg.ratio == "sequence":  # GSPO Eq. 7 with the row's advantage
            a_seq = sum(adv[i][k] for k in range(n_cols) if mask[i][k]) / lens[i]
            return clipped_loss(seq_ratio(live, i), a_seq, None)
        if alg.ratio == "sequence_token":  # GSPO Eq. 13: sg[s_i] * pi / sg[pi]
            r = seq_ratio(frozen, i) * sp.exp(live[i][t] - frozen[i][t])
        else:
            r = sp.exp(live[i][t] - old[i][t])
        if alg.clip == "soft":  # SAPO Eq. 6: tau by the sign of A
            return -sapo_gate(r, select((hp["tau_pos"], a > 0), (hp["tau_neg"], True))) * a
        return clipped_loss(r, a, sp.exp(old[i][t]))

    loss = [[sp.Integer(0)] * n_cols for _ in range(n_rows)]
    for i in range(n_rows):
        for t in range(n_cols):
            if mask[i][t]:
                loss[i][t] = token_loss(i, t)
                if ref is not None:  # DeepSeekMath Eq. 3: + beta * KL inside the token sum
                    loss[i][t] += hp["beta"] * kl_estimator(live[i][t], ref[i][t], hp["kl"])
    return aggregate(loss, mask, hp["agg"], group_size, hp["max_len"])
