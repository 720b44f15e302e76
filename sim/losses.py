"""Policy, value, KL and DPO losses in float64 NumPy with analytic gradients (the reference conventions)."""
from __future__ import annotations

import numpy as np

from spec.contract import (check_dcpo_bounds_args, check_old_logp_probabilities, check_dpo_args, check_kl_kind, check_q,
                           check_same_shape, check_token_shapes, check_value_args, policy_options, resolve_hparams,
                           sapo_log_ratio_cap, vespo_log_weight_cap)
from spec.selection import clip_cov_select, kl_cov_select, token_cov
from spec.registry import DIVERGENCE_CLIPS, PARTS, ROLLOUT_REJECTION, ROLLOUT_ROW_STATISTIC, get_algorithm

from .aggregation import agg_weights, block_count, block_sum
from spec.arrays import as_float, as_mask


def _kl_terms(d, kind, log_ratio=None):
    """k1 = -d, k2 = d^2/2, k3 = exp(d) - d - 1 with d = ref - logp, k3_unbiased = r * k3 with r = exp(log_ratio)
    (DeepSeek-V3.2); returns (value, d value / d logp)."""
    if kind == "k1":
        return -d, np.ones_like(d)
    if kind == "k2":
        return 0.5 * d * d, -d
    em1 = np.expm1(d)  # k3 = (e^d - 1) - d without losing e^d - 1 to rounding near d = 0
    if kind == "k3_unbiased":  # d/dlogp [r k3] = r k3 + r (1 - e^d) = -r d
        return _times_ratio(log_ratio, em1 - d), -_times_ratio(log_ratio, d)
    return em1 - d, -em1


def _times_ratio(log_r, x):
    """r * x for r = exp(log_r): 0 where x is 0, and sign(x) exp(log_r + log|x|) where r overflows (finite where the
    product is; spec.contract.RATIO_GUARDS['k3_unbiased'])."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        r = np.exp(log_r)
        far = np.sign(x) * np.exp(log_r + np.log(np.abs(x)))
        return np.where(x == 0, 0.0, np.where(np.isinf(r), far, r * x))


def kl(logp, ref_logp, kind="k3", old_logp=None):
    """Per-token KL estimate of KL(pi || ref) from sampled tokens (Schulman's k1/k2/k3; k3_unbiased needs
    ``old_logp``)."""
    check_kl_kind(kind, has_old=old_logp is not None)
    logp, ref_logp = as_float("logp", logp), as_float("ref_logp", ref_logp)
    check_same_shape("ref_logp", ref_logp.shape, "logp", logp.shape)
    log_ratio = None
    if old_logp is not None:
        old_logp = as_float("old_logp", old_logp)
        check_same_shape("old_logp", old_logp.shape, "logp", logp.shape)
        log_ratio = logp - old_logp
    return _kl_terms(ref_logp - logp, kind, log_ratio)[0]


def dcpo_bounds(q, eps_low=0.16, eps_high=0.2, r_max=10.0):
    """DCPO Eq. 21-27: the branch around r = 1 of abs((r - 1) * r * q) <= eps, capped at r_max."""
    q = check_dcpo_q(q, eps_low, eps_high, r_max)
    return _bounds_unchecked(q, eps_low, eps_high, r_max)


def check_dcpo_q(q, eps_low, eps_high, r_max):
    """``dcpo_bounds``' checks: q a finite float64 array of probabilities in (0, 1] (returned), valid widths."""
    q = as_float("q", q)
    check_dcpo_bounds_args(eps_low, eps_high, r_max)
    if q.size:
        check_q(float(q.min()), float(q.max()))
    return q


def _bounds_unchecked(q, eps_low, eps_high, r_max):
    with np.errstate(over="ignore", divide="ignore"):
        lo = 0.5 + 0.5 * np.sqrt(np.maximum(1.0 - 4.0 * eps_low / q, 0.0))
        hi = np.minimum(0.5 + 0.5 * np.sqrt(1.0 + 4.0 * eps_high / q), r_max)
    return lo, hi


def _clip_terms(r, adv, lo, hi, dual_clip, delta=None):
    """PPO-clip (1707.06347 Eq. 7) with the optional two-sided clip min(r, delta) (INTELLECT-2 2505.07291) and
    dual clip (1912.09729 Eq. 5): loss, d loss / d log r, and the indicator of a zeroed gradient. A token with
    A = 0 is unclipped with loss 0 at any ratio (spec.contract.RATIO_GUARDS), also where r overflowed to inf."""
    r = np.where(adv == 0, 1.0, r)
    unclipped = (r if delta is None else np.where(r > delta, delta, r)) * adv
    clipped_value = np.minimum(np.maximum(r, lo), hi) * adv  # np.clip(r, lo, hi) for r >= 0 and lo, hi >= 0
    use_unclipped = unclipped <= clipped_value
    loss = np.where(use_unclipped, unclipped, clipped_value)
    np.negative(loss, out=loss)
    live = use_unclipped if delta is None else use_unclipped & (r <= delta)
    dloss = np.where(live, loss, 0.0)  # where live, loss = -r * adv
    clipped = ~use_unclipped
    if delta is not None:
        clipped |= use_unclipped & (r > delta) & (adv != 0)
    if dual_clip is not None:
        cap = -dual_clip * adv
        capped = (adv < 0) & (loss > cap)
        np.copyto(loss, cap, where=capped)
        np.copyto(dloss, 0.0, where=capped)
        clipped |= capped
    return loss, dloss, clipped


def _sapo_terms(log_r, adv, tau_pos, tau_neg):
    """SAPO Eq. 5-6: l = -(4/tau) sigmoid(tau (r - 1)) A; d/d log r = -sech^2(tau (r-1)/2) r A; the gate saturated
    (4/tau, derivative 0) past spec.contract.sapo_log_ratio_cap, where r is not formed."""
    tau = np.where(adv > 0, tau_pos, tau_neg)
    saturated = log_r > np.where(adv > 0, sapo_log_ratio_cap(tau_pos), sapo_log_ratio_cap(tau_neg))
    r = np.exp(np.where(saturated, 0.0, log_r))
    th = np.where(saturated, 1.0, np.tanh(0.5 * tau * (r - 1.0)))
    loss = -(2.0 / tau) * (1.0 + th) * adv
    dloss = -(1.0 - th * th) * r * adv
    return loss, dloss


def _row_mean(x, mask, lens):
    return np.divide((x * mask).sum(1), lens, out=np.zeros(len(lens)), where=lens > 0)


def _cispo_bounds(hp):
    """CISPO's weight interval: [1 - eps_low, 1 + eps_high] (MiniMax-M1 Eq. 5), or [0, eps_high] with
    cap_mode='absolute' (TRL's clamp(r, max=epsilon_high): no lower bound)."""
    if hp["cap_mode"] == "absolute":
        return 0.0, hp["eps_high"]
    return 1 - hp["eps_low"], 1 + hp["eps_high"]


def _vespo_kernel(hp, log_ratio, adv, mask):
    """VESPO's phi(W) = W^c1 e^(c2 (1 - W)) per row ([B, 1]; spec.objectives.vespo_kernel), log W the row's sum of
    log-ratios, (c1, c2) by the sign of the row's A; 0 past vespo_log_weight_cap, where W is not formed."""
    x = (log_ratio * mask).sum(1, keepdims=True)
    pos = _row_mean(adv, mask, mask.sum(1))[:, None] >= 0
    k = np.where(pos, hp["vespo_k_pos"], hp["vespo_k_neg"])
    lam = np.where(pos, hp["vespo_lambda_pos"], hp["vespo_lambda_neg"])
    cap = np.where(pos, vespo_log_weight_cap(hp["vespo_k_pos"], hp["vespo_lambda_pos"]),
                   vespo_log_weight_cap(hp["vespo_k_neg"], hp["vespo_lambda_neg"]))
    saturated = x > cap
    x = np.where(saturated, 0.0, x)
    return np.where(saturated, 0.0, np.exp(k * x - lam * np.expm1(x)))


def _log1mexp(z):
    """log(1 - e^z) for z < 0, accurate on both sides of -log 2 (Maechler 2012): NaN or -inf at z >= 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(z > -np.log(2.0), np.log(-np.expm1(z)), np.log1p(-np.exp(z)))


def _binary_kl(x, y):
    """KL(Bern(mu) || Bern(pi)) for mu = e^y, pi = e^x (spec.objectives.binary_kl): mu (y - x) + (1 - mu)
    (log(1 - mu) - log(1 - pi)), the second term 0 at mu = 1; NaN where x >= 0 (unread there)."""
    with np.errstate(invalid="ignore", over="ignore"):
        rest = np.where(y == 0, 0.0, -np.expm1(y) * (_log1mexp(y) - _log1mexp(x)))
    return np.exp(y) * (y - x) + rest


def _dppo_inside(kind, hp, logp, old_logp, adv, on):
    """DPPO's trust-region mask (spec.objectives.dppo_keep; Qi et al. 2602.04879): False where the token's update
    left the region in the direction its A pushes (pi - mu past eps_high for A > 0, below -eps_low for A < 0, or
    the binary KL past them on that side; pi >= 1 counts as infinitely far), True elsewhere and on padding."""
    x, y = np.where(on, logp, 0.0), np.where(on, old_logp, 0.0)
    if kind == "binary_tv":
        with np.errstate(over="ignore"):
            moved = np.exp(x) - np.exp(y)
        up, down = ~(moved > hp["eps_high"]), ~(moved < -hp["eps_low"])
    else:
        kl = _binary_kl(x, y)
        up = ~((x > y) & ((x >= 0) | (kl > hp["eps_high"])))
        down = ~((x < y) & (kl > hp["eps_low"]))
    return np.where(adv > 0, up, np.where(adv < 0, down, True))


def _rollout_weights(hp, old_logp, rollout_logp, mask, on, n, blocks=1):
    """Rollout correction with rho = exp(old_logp - rollout_logp): TIS min(rho, C) (Yao et al. 2025), token MIS
    (IcePop) rho * 1[C_lo <= rho <= C_hi], sequence MIS on prod_t rho, rejection sampling 1[C_lo <= rho <= C_hi] on
    prod_t rho (seq_rs) or its geometric mean (geo_rs; spec.objectives.rollout_weight); returns (weights [B, T],
    stats), the weights None without a correction. ``on`` is ``mask > 0``, ``n`` its count per block (at least 1)."""
    kind = hp["rollout_correction"]
    if kind is None:
        return None, {}
    log_rho = np.where(on, old_logp - rollout_logp, 0.0)
    row = ROLLOUT_ROW_STATISTIC.get(kind)
    with np.errstate(over="ignore"):
        if row is not None:  # [B, 1]: broadcast by what uses it
            log_rho = log_rho.sum(1, keepdims=True)
            if row == "geometric_mean":
                log_rho = log_rho / np.maximum(mask.sum(1, keepdims=True), 1.0)
        rho = np.exp(log_rho)
    if kind == "tis":
        w, cut = np.minimum(rho, hp["tis_cap"]), rho > hp["tis_cap"]
    else:
        cut = (rho < hp["mis_low"]) | (rho > hp["mis_high"])
        w = np.where(cut, 0.0, 1.0 if kind in ROLLOUT_REJECTION else rho)
    return w, {"rc_weight_mean": block_sum(w * mask, blocks) / n, "rc_cut_frac": block_count(cut & on, blocks) / n}


def _sequence_terms(alg, hp, log_ratio, adv, mask, on):
    """GSPO (Eq. 5-7) and GMPO (geometric mean of log-clipped token ratios): per-row loss, its gradient per token
    d loss_i / d logp_t, the zeroed-gradient indicator per token, and the ratio shown in stats ([B, 1] for GSPO)."""
    lens = mask.sum(1)
    safe_lens = np.where(lens > 0, lens, 1.0)[:, None]
    a_seq = _row_mean(adv, mask, lens)
    if alg.ratio == "sequence":
        with np.errstate(over="ignore"):
            s = np.exp(_row_mean(log_ratio, mask, lens))
        seq_loss, dseq, seq_clipped = _clip_terms(s, a_seq, 1 - hp["eps_low"], 1 + hp["eps_high"], hp["dual_clip"],
                                                  hp["delta"])
        dtok = np.where(on, dseq[:, None] / safe_lens, 0.0)  # padding gets 0, also beside an overflowed row
        return seq_loss, dtok, seq_clipped[:, None] & on, s[:, None]
    sgn = np.sign(a_seq)[:, None]
    x_clip = np.clip(log_ratio, -hp["eps_low"], hp["eps_high"])
    use_x = sgn * log_ratio <= sgn * x_clip  # the unclipped term wins ties, as in PPO
    c = np.where(sgn == 0, 0.0, np.where(use_x, log_ratio, x_clip))  # A = 0: loss 0 at any ratio
    with np.errstate(over="ignore"):
        g = np.exp(_row_mean(c, mask, lens))
        ratio = np.exp(log_ratio)
    seq_loss = -a_seq * g
    dtok = np.where(use_x & on, seq_loss[:, None] / safe_lens, 0.0)  # a clipped token gets 0 in an overflowed row
    return seq_loss, dtok, ~use_x & on, ratio


def policy_loss(name, logp, old_logp, adv, mask, *, group_size=None, ref_logp=None, rollout_logp=None,
                cov_select=None, **hp):
    """Loss, gradient d loss / d logp and stats of a registry algorithm on a [B, T] batch (float64)."""
    alg = get_algorithm(name)
    hp = resolve_hparams(name, hp)
    logp, old_logp = as_float("logp", logp), as_float("old_logp", old_logp)
    adv = as_float("adv", adv)
    if adv.ndim == 1 and logp.ndim == 2 and len(adv) == len(logp):  # a sequence advantage per row
        adv = np.broadcast_to(adv[:, None], logp.shape)
    mask = as_mask(mask)
    ref_logp, rollout_logp, cov_select = policy_options(
        name, alg, hp, {"logp": logp.shape, "old_logp": old_logp.shape, "adv": adv.shape, "mask": mask.shape}, mask,
        group_size, ref_logp, rollout_logp, cov_select, as_float, lambda arg, x: as_mask(x, arg))
    adv = np.where(mask > 0, adv, 0.0)  # a huge advantage on padding would overflow against a sequence's ratio
    loss, grad, stats = policy_terms(alg, hp, logp, old_logp, adv, mask, group_size, ref_logp, rollout_logp,
                                     cov_select)
    return float(loss[0]), grad, {k: (int if k == "tokens" else float)(v[0]) for k, v in stats.items()}


def policy_terms(alg, hp, logp, old_logp, adv, mask, group_size=None, ref_logp=None, rollout_logp=None,
                 cov_select=None, keep=None, blocks=1, shown_stats=True):
    """``policy_loss`` on inputs already checked: ``alg`` the registry entry, ``hp`` its resolved hyper-parameters,
    float64 [B, T] arrays (the simulator's loop checks once per run, not once per update). ``keep`` (a dict, optional)
    receives what ``StepClips.add`` would compute again: ``token_ratio`` and, for DCPO, ``bounds`` (q, lo, hi).

    ``blocks``: the rows are that many independent batches of equal size (the simulator's stacked seeds), each
    aggregated on its own; the loss and every stat are then [blocks] arrays (Clip-Cov takes a ``cov_seed`` per
    block). ``shown_stats=False`` leaves out the stats only a caller that shows them reads (``ratio_mean``,
    ``kl_mean``): the simulator's loop reads the loss, the gradient, ``tokens``, ``clip_frac`` and the losses' own
    stats."""
    on = mask > 0
    tokens = block_count(on, blocks)  # the mask is 0/1: its sum per block
    n = np.maximum(tokens, 1).astype(float)
    log_ratio = np.where(on, logp - old_logp, 0.0)
    weights = agg_weights(mask, hp["agg"], group_size, hp["max_len"], blocks)
    rc_weights, stats = _rollout_weights(hp, old_logp, rollout_logp, mask, on, n, blocks)
    policy_weights = weights if rc_weights is None else weights * rc_weights
    if hp["opsm_delta"] is not None:  # DeepSeek-V3.2's off-policy sequence mask, a weight of 0 or 1
        dropped = (adv < 0) & (_row_mean(-log_ratio, mask, mask.sum(1)) > hp["opsm_delta"])[:, None] & on
        policy_weights = np.where(dropped, 0.0, policy_weights)
        stats["opsm_frac"] = block_count(dropped, blocks) / n

    if alg.ratio in ("sequence", "geometric"):
        seq_loss, dtok, clipped, ratio = _sequence_terms(alg, hp, log_ratio, adv, mask, on)
        loss_tok = seq_loss[:, None]
        grad = _weighted(policy_weights.sum(1, keepdims=True), dtok)
    else:
        with np.errstate(over="ignore"):
            ratio = np.exp(log_ratio)
            if keep is not None:
                keep["token_ratio"] = ratio
            if alg.ratio == "sequence_token":
                ratio = np.exp(_row_mean(log_ratio, mask, mask.sum(1)))[:, None]  # [B, 1]: broadcast where used
        clipped = np.zeros(mask.shape, dtype=bool)
        if alg.clip == "soft":
            loss_tok, dtok = _sapo_terms(log_ratio, adv, hp["tau_pos"], hp["tau_neg"])
        elif alg.clip == "truncated":  # MiniMax-M1 Eq. 4: -sg(clip(r)) * A * logp, the gradient never vanishes
            lo, hi = _cispo_bounds(hp)
            dtok = -np.clip(ratio, lo, hi) * adv
            loss_tok = None  # linear in logp: dtok * logp (below)
            stats["trunc_frac"] = block_count(((ratio < lo) | (ratio > hi)) & on, blocks) / n
        elif alg.clip == "gamma":  # VESPO: -sg(phi(W)) A logp, W the product of the row's token ratios
            dtok = -_vespo_kernel(hp, log_ratio, adv, mask) * adv
            loss_tok = None  # linear in logp: dtok * logp (below)
        elif alg.clip in DIVERGENCE_CLIPS:  # DPPO: -sg(M r) A logp, M the trust-region mask
            check_old_logp_probabilities(alg.name, np.count_nonzero((old_logp > 0) & on) > 0)
            inside = _dppo_inside(alg.clip, hp, logp, old_logp, adv, on)
            dtok = -_weighted(np.where(inside, adv, 0.0), ratio)  # 0 outside and at A = 0, whatever r is
            loss_tok = None  # linear in logp: dtok * logp (below)
            clipped = ~inside & on
        elif alg.ratio == "none":  # GPG: -A * logp
            loss_tok, dtok = None, -adv
        elif alg.clip == "off":  # KL-Cov: -r*A, plus kl_cov_coef * |log r| on the selected tokens
            chosen = _cov_selection(alg, hp, logp, adv, mask, clipped, cov_select, blocks)
            surrogate = -np.where(adv == 0, 0.0, ratio) * adv  # A = 0: 0 at any ratio
            loss_tok = surrogate + chosen * hp["kl_cov_coef"] * np.abs(log_ratio)
            dtok = surrogate + chosen * hp["kl_cov_coef"] * np.sign(log_ratio)
        else:
            if alg.clip == "dynamic":
                check_old_logp_probabilities(alg.name, np.count_nonzero((old_logp > 0) & on) > 0)
                q = np.exp(np.where(on, old_logp, 0.0))
                lo, hi = _bounds_unchecked(q, hp["eps_low"], hp["eps_high"], hp["r_max"])
                if keep is not None:
                    keep["bounds"] = q, lo, hi
            else:
                lo, hi = 1 - hp["eps_low"], 1 + hp["eps_high"]
            loss_tok, dtok, clipped = _clip_terms(ratio, adv, lo, hi, hp["dual_clip"], hp["delta"])
            if alg.select == "clip_cov":  # Clip-Cov: the selected tokens keep their value, lose their gradient
                # not the tokens capped by delta or the dual clip
                with np.errstate(invalid="ignore"):  # A = 0 at r = inf: NaN > x, not clipped (as r * 0 = 0)
                    ppo_clipped = ratio * adv > np.minimum(np.maximum(ratio, lo), hi) * adv
                chosen = _cov_selection(alg, hp, logp, adv, mask, ppo_clipped, cov_select, blocks)
                dtok = np.where(chosen, 0.0, dtok)
                clipped = clipped | chosen
        grad = _weighted(policy_weights, dtok)

    exponent = 0  # the loss is summed scaled by 2^-exponent
    if loss_tok is None:  # CISPO, GPG: dtok * logp, dtok scaled by a power of 2 to at most 1, changing no bit, so that
        # no term passes the range before the total does (RATIO_GUARDS['linear_in_logp'])
        exponent = np.frexp(np.abs(dtok).max(initial=0.0))[1]
        loss_tok = np.ldexp(dtok, -exponent) * logp
    loss_tok = _weighted(policy_weights, np.where(on, loss_tok, 0.0))
    stats["clip_frac"] = block_count(clipped & on, blocks) / n
    if shown_stats:
        stats["ratio_mean"] = block_sum(_weighted(mask, ratio), blocks) / n
    stats["tokens"] = tokens
    if alg.select is not None:
        stats["cov_frac"] = block_count(chosen & on, blocks) / n
    loss = np.ldexp(block_sum(loss_tok, blocks), exponent)
    if hp["beta"] > 0:
        # d is 0 on padding (so k1..k3_unbiased are), before any exp: padding never overflows
        kl_tok, dkl = _kl_terms(np.where(on, ref_logp - logp, 0.0), hp["kl"], log_ratio)
        beta_weights = weights * hp["beta"]
        loss += block_sum(beta_weights * kl_tok, blocks)
        dkl = np.where(on, dkl, 0.0)
        dkl *= beta_weights
        grad += dkl
        if shown_stats:
            stats["kl_mean"] = block_sum(kl_tok, blocks) / n
    return loss, grad, stats


def _weighted(weights, x):
    """weights * x, and 0 where the weight is 0 (padding, a token MIS cuts) whatever x holds, inf included."""
    return np.multiply(weights, x, out=np.zeros(np.broadcast_shapes(np.shape(weights), np.shape(x))),
                       where=weights != 0)


def _cov_selection(alg, hp, logp, adv, mask, ppo_clipped, cov_select, blocks=1):
    """The tokens Clip-Cov detaches or KL-Cov penalises: ``cov_select`` when given, else by Cov(log pi, A), within
    each block (Clip-Cov's random choice with that block's ``cov_seed``, its candidates leaving out the
    ``ppo_clipped`` tokens)."""
    if cov_select is not None:
        return cov_select > 0
    seeds = hp["cov_seed"] if isinstance(hp["cov_seed"], (list, tuple)) else [hp["cov_seed"]] * blocks
    parts, rows = [], len(mask) // blocks
    for i, seed in enumerate(seeds):
        b = slice(i * rows, (i + 1) * rows)
        cov = token_cov(logp[b], adv[b], mask[b])
        if alg.select == "clip_cov":
            parts.append(clip_cov_select(cov, mask[b], ppo_clipped[b], hp["clip_cov_lb"], hp["clip_cov_ub"],
                                         hp["clip_cov_ratio"], seed))
        else:
            parts.append(kl_cov_select(cov, mask[b], hp["kl_cov_ratio"]))
    return parts[0] if blocks == 1 else np.concatenate(parts)


def value_loss(values, old_values, returns, mask, clip=PARTS["value_loss"]["clip"], agg="token_mean",
               group_size=None, max_len=None, blocks=1):
    """Clipped critic loss 0.5 * max((v - R)^2, (clip(v, v_old - d, v_old + d) - R)^2) (PPO value clipping).
    ``blocks``: stacked independent batches, aggregated each on its own (the loss is then their sum)."""
    check_value_args(clip, agg, max_len)
    values, old_values = as_float("values", values), as_float("old_values", old_values)
    returns, mask = as_float("returns", returns), as_mask(mask)
    check_token_shapes({"values": values.shape, "old_values": old_values.shape, "returns": returns.shape,
                        "mask": mask.shape}, group_size, agg)
    v_clip = np.clip(values, old_values - clip, old_values + clip)
    plain, clipped = (values - returns) ** 2, (v_clip - returns) ** 2
    use_clipped = clipped > plain
    loss_tok = np.where(mask > 0, 0.5 * np.maximum(plain, clipped), 0.0)  # padding never turns 0 * inf into NaN
    dtok = np.where(use_clipped, 0.0, values - returns)  # the clipped branch wins only where v was clipped
    weights = agg_weights(mask, agg, group_size, max_len, blocks)
    stats = {"clip_frac": float((use_clipped * mask).sum() / max(mask.sum(), 1.0))}
    return float((weights * loss_tok).sum()), weights * dtok, stats


def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta=0.1):
    """DPO Eq. 7: mean of -log sigmoid(beta * ((lw - rw) - (ll - rl))); gradients w.r.t. chosen and rejected."""
    names = ("logp_chosen", "logp_rejected", "ref_chosen", "ref_rejected")
    lw, ll, rw, rl = (as_float(n, x, ndim=1) for n, x in zip(names, (logp_chosen, logp_rejected, ref_chosen,
                                                                          ref_rejected)))
    for n, x in zip(names[1:], (ll, rw, rl)):
        check_same_shape(n, x.shape, "logp_chosen", lw.shape)
    check_dpo_args(beta, len(lw))
    loss, grad, margin = dpo_terms(lw[None], ll[None], rw[None], rl[None], beta)
    margin = margin[0]
    stats = {"reward_accuracy": float((margin > 0).mean()), "margin_mean": float(margin.mean() / beta)}
    return float(loss[0]), (grad[0], -grad[0]), stats


def dpo_terms(lw, ll, rw, rl, beta):
    """``dpo_loss`` on checked [blocks, N] arrays, each row a batch of its own (the simulator's stacked seeds): the
    mean loss of each row, d loss / d logp_chosen (d / d logp_rejected is its negative) and the margins."""
    margin = beta * ((lw - rw) - (ll - rl))
    loss = np.logaddexp(0.0, -margin)  # -log sigmoid(m)
    n = margin.shape[1]
    dmargin = -0.5 * (1.0 - np.tanh(0.5 * margin)) / n  # d/dm of mean(-log sigmoid(m)) = -sigmoid(-m)/N
    return np.add.reduce(loss, 1) / n, beta * dmargin, margin
