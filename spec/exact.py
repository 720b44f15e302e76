"""Exact evaluation of every objective for small inputs: floats become exact rationals, gradients come from sympy."""
from __future__ import annotations

import numpy as np
import sympy as sp

from .arrays import as_float, as_mask
from .contract import (check_advantage_kind, check_dcpo_bounds_args, check_dpo_args, check_group_size, check_kl_kind,
                       check_old_logp_probabilities, check_overlong, check_prompt_ids, check_q, check_reinforce_args,
                       check_reward_weights, check_same_shape, check_token_shapes, check_unit_interval,
                       check_value_args, policy_options, resolve_hparams)
from . import objectives as ob
from .registry import PARTS, PROBABILITY_CLIPS, get_algorithm
from .selection import clip_cov_select, kl_cov_select, token_cov


def rational(x):
    """The exact value of a float (its binary expansion) or of an int; sympy expressions pass through."""
    return x if isinstance(x, sp.Basic) else sp.Rational(float(x)) if isinstance(x, float) else sp.sympify(x)


def short_rational(x):
    """A float as the shortest decimal that round-trips to it, exactly (0.2 -> 1/5, 1e-6 -> 1/1000000): the value
    a paper or a config writes, for expressions a person reads."""
    return sp.Rational(repr(float(x))) if isinstance(x, float) else rational(x)


def _exact(name, x, ndim=None):
    """A checked numeric array as an object array of exact rationals; symbolic arrays pass through unchecked."""
    arr = np.asarray(x, dtype=object)
    if any(isinstance(v, sp.Basic) and not v.is_Number for v in arr.flat):
        return np.vectorize(sp.sympify, otypes=[object])(arr) if arr.size else arr
    checked = as_float(name, x, ndim)
    return np.vectorize(rational, otypes=[object])(checked) if checked.size else checked.astype(object)


def _mask_ints(mask):
    return as_mask(mask).astype(int).tolist()


def _substitute(expr, values):
    return sp.sympify(expr).xreplace(values)


def policy_loss(name, logp, old_logp, adv, mask, *, group_size=None, ref_logp=None, rollout_logp=None,
                cov_select=None, **hp):
    """Exact loss and gradient d loss / d logp (object array) of a registry algorithm on a small [B, T] batch, at any
    finite input (SAPO's gate saturated as spec.contract.RATIO_GUARDS states; the other guards hold exactly)."""
    alg = get_algorithm(name)
    hp = resolve_hparams(name, hp)
    lp_num = as_float("logp", logp)
    old, adv_ = _exact("old_logp", old_logp), _exact("adv", adv)
    if adv_.ndim == 1 and lp_num.ndim == 2 and len(adv_) == len(lp_num):  # a sequence advantage per row
        adv_ = np.repeat(adv_[:, None], lp_num.shape[1], axis=1)
    m = as_mask(mask)
    ref, rollout, cov_select = policy_options(
        name, alg, hp, {"logp": lp_num.shape, "old_logp": old.shape, "adv": adv_.shape, "mask": m.shape}, m,
        group_size, ref_logp, rollout_logp, cov_select, _exact, lambda arg, x: as_mask(x, arg))
    mask = m.astype(int).tolist()
    n_rows, n_cols = lp_num.shape
    if alg.clip in PROBABILITY_CLIPS:
        check_old_logp_probabilities(name, (as_float("old_logp", old_logp)[m > 0] > 0).any())

    live, frozen = _symbols("lp", n_rows, n_cols), _symbols("sg", n_rows, n_cols)
    values = {}
    for i in range(n_rows):
        for t in range(n_cols):
            values[live[i][t]] = values[frozen[i][t]] = rational(float(lp_num[i, t]))
    ehp, select = _exact_hp(hp), ob.AtPoint(values)
    chosen = None
    if alg.select is not None:
        chosen = cov_select if cov_select is not None else _cov_selection(alg, hp, lp_num, m, old, adv_, live,
                                                                           select)
        chosen = (np.asarray(chosen) > 0).astype(int).tolist()
    objective = ob.policy_objective(alg, ehp, live, frozen, old, adv_, mask, ref, group_size, select, rollout, chosen)
    grad = np.empty((n_rows, n_cols), dtype=object)
    for i in range(n_rows):
        for t in range(n_cols):
            grad[i, t] = _substitute(sp.diff(objective, live[i][t]), values) if mask[i][t] else sp.Integer(0)
    return _substitute(objective, values), grad


def _cov_selection(alg, hp, lp_num, m, old, adv_, live, select):
    """The Clip-Cov / KL-Cov selection (spec.selection, in float64); the tokens PPO-clip clips (A r > A clip(r),
    whatever delta and the dual clip do), which Clip-Cov leaves out, decided exactly."""
    cov = token_cov(lp_num, adv_.astype(float), m)
    if alg.select == "kl_cov":
        return kl_cov_select(cov, m, hp["kl_cov_ratio"])
    ehp = _exact_hp(hp)
    lo, hi = 1 - ehp["eps_low"], 1 + ehp["eps_high"]
    clipped = np.zeros(m.shape, dtype=bool)
    for i, t in zip(*np.nonzero(m)):
        r = sp.exp(live[i][t] - old[i, t])
        clipped[i, t] = not select.holds(r * adv_[i, t] <= ob.clip(r, lo, hi, select) * adv_[i, t])
    return clip_cov_select(cov, m, clipped, hp["clip_cov_lb"], hp["clip_cov_ub"], hp["clip_cov_ratio"],
                           hp["cov_seed"])


def _symbols(prefix, n_rows, n_cols):
    return [[sp.Symbol(f"{prefix}_{i}_{t}", real=True) for t in range(n_cols)] for i in range(n_rows)]


def _exact_hp(hp, exact=rational):
    """Numeric hyper-parameters as sympy numbers: binary-exact (``rational``) where the float layers are matched at a
    point, ``short_rational`` in expressions to read."""
    return {k: exact(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for k, v in hp.items()}


def symbolic_objective(name, rows, cols, *, mask=None, group_size=None, cov_select=None, **hp):
    """A policy loss as one sympy expression over symbols ``lp_i_t`` (logp), ``old_i_t``, ``A_i_t`` (and
    ``ref_i_t`` when beta > 0, ``ro_i_t`` the engine's log-probs under a rollout correction), for a batch of the
    given size and mask (all ones by default); stop-gradient copies of logp (GSPO-token, CISPO, Clip-Cov) are
    ``sg_i_t``; ``cov_select`` is the Clip-Cov / KL-Cov selection (none by default). Returns (expression,
    symbols by name)."""
    alg = get_algorithm(name)
    hp = resolve_hparams(name, hp)
    mask = np.ones((rows, cols), dtype=int) if mask is None else as_mask(mask).astype(int)
    check_token_shapes({"mask": mask.shape}, group_size, hp["agg"])
    syms = {k: _symbols(k, rows, cols) for k in ("lp", "sg", "old", "A", "ref", "ro")}
    chosen = None if cov_select is None else as_mask(cov_select, "cov_select").astype(int).tolist()
    expr = ob.policy_objective(alg, _exact_hp(hp, short_rational), syms["lp"], syms["sg"], syms["old"], syms["A"], mask.tolist(),
                               syms["ref"] if hp["beta"] > 0 else None, group_size, ob.piecewise,
                               syms["ro"] if hp["rollout_correction"] else None, chosen)
    return expr, syms


def kl(logp, ref_logp, kind="k3", old_logp=None):
    """Exact per-token KL estimates (object array); k3_unbiased needs ``old_logp``."""
    check_kl_kind(kind, has_old=old_logp is not None)
    lp, ref = _exact("logp", logp), _exact("ref_logp", ref_logp)
    check_same_shape("ref_logp", ref.shape, "logp", lp.shape)
    old = lp if old_logp is None else _exact("old_logp", old_logp)
    check_same_shape("old_logp", old.shape, "logp", lp.shape)
    return np.vectorize(lambda a, b, o: ob.kl_estimator(a, b, kind, o), otypes=[object])(lp, ref, old)


def dcpo_bounds(q, eps_low=0.16, eps_high=0.2, r_max=10.0):
    """Exact DCPO bounds (lo, hi) for each q (Eq. 21-27)."""
    q_num = as_float("q", q)
    check_dcpo_bounds_args(eps_low, eps_high, r_max)
    if q_num.size:
        check_q(float(q_num.min()), float(q_num.max()))
    qs = _exact("q", q)
    lo = np.vectorize(lambda v: ob.dcpo_lower(v, rational(eps_low)), otypes=[object])(qs)
    hi = np.vectorize(lambda v: ob.dcpo_upper(v, rational(eps_high), rational(r_max)), otypes=[object])(qs)
    return lo, hi


def value_loss(values, old_values, returns, mask, clip=PARTS["value_loss"]["clip"], agg="token_mean",
               group_size=None, max_len=None):
    """Exact clipped critic loss 0.5 * max((v - R)^2, (clip(v, v_old +- d) - R)^2) and its gradient in v."""
    check_value_args(clip, agg, max_len)
    v_num = as_float("values", values)
    old, ret = _exact("old_values", old_values), _exact("returns", returns)
    m = as_mask(mask)
    check_token_shapes({"values": v_num.shape, "old_values": old.shape, "returns": ret.shape, "mask": m.shape},
                       group_size, agg)
    d = rational(clip)
    syms = [[sp.Symbol(f"v_{i}_{t}", real=True) for t in range(v_num.shape[1])] for i in range(v_num.shape[0])]
    vals = {s: rational(float(v_num[i, t])) for i, row in enumerate(syms) for t, s in enumerate(row)}
    select = ob.AtPoint(vals)
    loss = []
    for i, row in enumerate(syms):
        loss.append([])
        for t, v in enumerate(row):
            v_clip = ob.clip(v, old[i, t] - d, old[i, t] + d, select)
            plain, clipped = (v - ret[i, t]) ** 2, (v_clip - ret[i, t]) ** 2
            loss[-1].append(select((clipped, clipped > plain), (plain, True)) / 2)
    objective = ob.aggregate(loss, m.astype(int).tolist(), agg, group_size,
                             None if max_len is None else rational(max_len))
    grad = np.vectorize(lambda s: _substitute(sp.diff(objective, s), vals), otypes=[object])(
        np.array(syms, dtype=object))
    return _substitute(objective, vals), grad


def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta=0.1):
    """Exact DPO Eq. 7 loss and its gradients w.r.t. the chosen and rejected sequence log-probs."""
    names = ("logp_chosen", "logp_rejected", "ref_chosen", "ref_rejected")
    lw, ll, rw, rl = (_exact(n, x, ndim=1) for n, x in zip(names, (logp_chosen, logp_rejected, ref_chosen,
                                                                     ref_rejected)))
    for n, x in zip(names[1:], (ll, rw, rl)):
        check_same_shape(n, x.shape, "logp_chosen", lw.shape)
    check_dpo_args(beta, len(lw))
    w = sp.symbols(f"w0:{len(lw)}", real=True)
    l_ = sp.symbols(f"l0:{len(lw)}", real=True)
    b = rational(beta)
    objective = sum(sp.log(1 + sp.exp(-b * ((w[k] - rw[k]) - (l_[k] - rl[k])))) for k in range(len(lw))) / len(lw)
    vals = {**dict(zip(w, lw)), **dict(zip(l_, ll))}
    grads = tuple(np.array([_substitute(sp.diff(objective, s), vals) for s in syms], dtype=object)
                  for syms in (w, l_))
    return _substitute(objective, vals), grads


def _grouped(rewards, group_size):
    r = _exact("rewards", rewards, ndim=1)
    check_group_size(group_size, len(r), needed=True, why="group advantages")
    return r.reshape(-1, group_size)


def _standardise(x, mu, var):
    """(x - mu) / sigma, and 0 where sigma is 0."""
    sigma = sp.sqrt(var)
    return sp.Piecewise((0, sp.Eq(sigma, 0)), ((x - mu) / sigma, True))


def group_advantages(rewards, group_size, kind="grpo", eps=PARTS["grpo_advantage"]["eps"],
                     unbiased=PARTS["grpo_advantage"]["unbiased"]):
    """Exact GRPO (R - mean)/(std + eps) (DeepSeekMath Sec. 4.1.2), Dr.GRPO R - mean (2503.20783 Eq. 3), RLOO
    R_i - mean_{j != i} R_j (2402.14740, Sec. 3) or GPG alpha (R - mean), alpha = B / M (2504.02546 Sec. 2)."""
    groups = _grouped(rewards, group_size)
    check_advantage_kind(kind, group_size, unbiased, eps)
    if kind == "gpg":  # M: the responses of groups whose rewards are not all equal (they carry a gradient)
        live = sum(len(g) for g in groups if max(g) > min(g))
        alpha = sp.Rational(len(groups) * group_size, live) if live else sp.Integer(0)
    out = []
    for g in groups:
        mu = sum(g) / len(g)
        if kind == "dr_grpo":
            out += [x - mu for x in g]
            continue
        if kind == "rloo":
            out += [x - (sum(g) - x) / (len(g) - 1) for x in g]
            continue
        if kind == "gpg":
            out += [alpha * (x - mu) for x in g]
            continue
        var = sum((x - mu) ** 2 for x in g) / (len(g) - (1 if unbiased else 0))
        den = sp.sqrt(var) + rational(eps)
        out += [sp.Piecewise((0, sp.Eq(den, 0)), ((x - mu) / den, True)) for x in g]
    return np.array(out, dtype=object)


def gdpo_advantages(rewards, group_size, weights=None, eps=PARTS["gdpo_advantage"]["eps"],
                    unbiased=PARTS["gdpo_advantage"]["unbiased"]):
    """Exact GDPO (2601.05242): each reward (a column of the [B, N] ``rewards``) standardised within its group
    (group_advantages, kind grpo), their sum weighted by ``weights`` (all 1 by default) standardised over the batch,
    (S - mean_B) / (std_B + eps), 0 where that denominator is 0."""
    r = _exact("rewards", rewards, ndim=2)
    w = check_reward_weights(weights, r.shape[1])
    total = sum(rational(wn) * group_advantages(r[:, n], group_size, "grpo", eps, unbiased) for n, wn in enumerate(w))
    mu = sum(total) / len(total)
    var = sum((x - mu) ** 2 for x in total) / (len(total) - (1 if unbiased else 0))
    den = sp.sqrt(var) + rational(eps)
    return np.array([sp.Piecewise((0, sp.Eq(den, 0)), ((x - mu) / den, True)) for x in total], dtype=object)


class SmoothAdvantage:
    """Exact DCPO SAS (2509.02333 Eq. 9-12, pooled statistics Eq. 29-30) with per-prompt visit history."""

    def __init__(self):
        self.history: dict = {}

    def __call__(self, prompt_ids, rewards, group_size):
        groups = _grouped(rewards, group_size)
        ids = list(prompt_ids)
        check_prompt_ids(ids, len(groups))
        out = []
        for pid, r in zip(ids, groups):
            visits, mu_old, var_old = self.history.get(pid, (0, sp.Integer(0), sp.Integer(0)))
            i = visits + 1
            mu_new = sum(r) / len(r)
            var_new = sum((x - mu_new) ** 2 for x in r) / len(r)
            mu_tot = (mu_new + (i - 1) * mu_old) / i
            var_tot = (var_new + (i - 1) * var_old) / i + sp.Rational(i - 1, i**2) * (mu_old - mu_new) ** 2
            for x in r:
                a_new, a_tot = _standardise(x, mu_new, var_new), _standardise(x, mu_tot, var_tot)
                sa_new = sp.Rational(i - 1, i) * a_new + a_tot / i
                sa_tot = a_new / i + sp.Rational(i - 1, i) * a_tot
                out.append(sp.Piecewise((sa_new, sp.Abs(sa_new) < sp.Abs(sa_tot)), (sa_tot, True)))
            self.history[pid] = (i, mu_tot, var_tot)
        return np.array(out, dtype=object)


def gae(rewards, values, mask, gamma=PARTS["gae"]["gamma"], lam=PARTS["gae"]["lam"]):
    """GAE (1506.02438 Eq. 16) by its recursion over the valid tokens of each row (symbolic inputs allowed)."""
    r, v = _exact("rewards", rewards, ndim=2), _exact("values", values, ndim=2)
    m = as_mask(mask)
    for name, x in (("values", v), ("mask", m)):
        check_same_shape(name, x.shape, "rewards", r.shape)
    for name, x in (("gamma", gamma), ("lam", lam)):
        if not (isinstance(x, sp.Basic) and not x.is_number):  # symbols are allowed for the derivations
            check_unit_interval(name, x)
    g, lam_ = rational(gamma), rational(lam)
    adv = np.zeros(r.shape, dtype=object)
    adv[:] = sp.Integer(0)
    for i in range(r.shape[0]):
        next_v, next_a = sp.Integer(0), sp.Integer(0)
        for t in reversed(range(r.shape[1])):
            if m[i, t]:
                next_a = r[i, t] + g * next_v - v[i, t] + g * lam_ * next_a
                next_v = v[i, t]
                adv[i, t] = next_a
    return adv, np.where(m > 0, adv + v, sp.Integer(0))


def overlong_penalty(lengths, max_len=PARTS["overlong"]["max_len"], cache_len=PARTS["overlong"]["cache_len"]):
    """DAPO Eq. 13 soft overlong punishment, exactly."""
    lengths = as_float("lengths", lengths)
    check_overlong(max_len, cache_len)
    start = rational(max_len) - rational(cache_len)

    def one(n):
        n = rational(float(n))
        return sp.Integer(0) if n <= start else (start - n) / rational(cache_len) if n <= max_len else sp.Integer(-1)
    return np.array([one(n) for n in lengths.flat], dtype=object).reshape(lengths.shape)


def reinforce_pp_advantages(rewards, mask, *, logp=None, ref_logp=None, beta=0.0, group_size=None,
                            baseline=False, gamma=PARTS["reinforce_pp"]["gamma"], eps=PARTS["reinforce_pp"]["eps"]):
    """Exact REINFORCE++ (2501.03262, Sec. 3): the outcome reward at each row's last token (R - mean_g with
    ``baseline``) minus beta * k1 per token, discounted returns, whitened over the batch's tokens."""
    r = _exact("rewards", rewards, ndim=1)
    m = as_mask(mask)
    check_reinforce_args(len(r), m.shape, beta, gamma, eps, group_size, baseline, logp, ref_logp)
    if baseline:
        groups = r.reshape(-1, group_size)
        r = np.array([x - sum(g) / group_size for g in groups for x in g], dtype=object)
    k1 = None
    if beta > 0:
        lp, ref = _exact("logp", logp), _exact("ref_logp", ref_logp)
        check_same_shape("logp", lp.shape, "mask", m.shape)
        check_same_shape("ref_logp", ref.shape, "mask", m.shape)
        k1 = lp - ref
    g, b = rational(gamma), rational(beta)
    ret = np.full(m.shape, sp.Integer(0), dtype=object)
    for i in range(m.shape[0]):
        on = list(np.flatnonzero(m[i]))
        acc = sp.Integer(0)
        for t in reversed(on):
            acc = (r[i] if t == on[-1] else 0) - (b * k1[i, t] if k1 is not None else 0) + g * acc
            ret[i, t] = acc
    vals = [ret[i, t] for i, t in zip(*np.nonzero(m))]
    if not vals:
        return ret
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / max(len(vals) - 1, 1)  # the unbiased variance, as verl's whitening
    den = sp.sqrt(var + rational(eps))
    return np.where(m > 0, (ret - mean) / den, sp.Integer(0))


def dynamic_sampling_filter(rewards, group_size):
    """Keep a group (True) iff its values are not all equal: given 0/1 correctness, DAPO Eq. 11's 0 < #correct < G."""
    return np.array([max(g) > min(g) for g in _grouped(rewards, group_size)], dtype=bool)
