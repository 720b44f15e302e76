"""Policy, value, KL and DPO losses in torch (any float dtype and device); autograd gives the gradients."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from spec.contract import (check_dcpo_bounds_args, check_old_logp_probabilities, check_dpo_args, check_kl_kind, check_q,
                           check_same_shape, check_token_shapes, check_value_args, policy_options, resolve_hparams,
                           sapo_log_ratio_cap, vespo_log_weight_cap)
from spec.selection import clip_cov_select, kl_cov_select, token_cov
from spec.registry import DIVERGENCE_CLIPS, PARTS, ROLLOUT_REJECTION, ROLLOUT_ROW_STATISTIC, get_algorithm

from .aggregation import agg_weights
from .checks import as_mask, as_tensor


class _UnbiasedK3(torch.autograd.Function):
    """k3_unbiased = r * k3 with r = exp(logp - old_logp), k3 = e^d - d - 1, d = ref_logp - logp (DeepSeek-V3.2
    2512.02556), with its derivatives in closed form: d/dlogp = -r * d (autograd's r * k3 + r * (1 - e^d) subtracts
    two terms of size r * e^d and loses the difference), d/dref = r * (e^d - 1), d/dold = -r * k3. Each product
    with r is formed by ``_times_ratio``."""

    @staticmethod
    def forward(ctx, logp, ref_logp, old_logp):
        d = ref_logp - logp
        log_r = logp - old_logp
        r = torch.exp(log_r)
        em1 = torch.expm1(d)
        value = _times_ratio(log_r, r, em1 - d)
        ctx.save_for_backward(d, log_r, r, em1, value)
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        d, log_r, r, em1, value = ctx.saved_tensors
        need_logp, need_ref, need_old = ctx.needs_input_grad
        return (-_times_ratio(log_r, r, d) * grad if need_logp else None,
                _times_ratio(log_r, r, em1) * grad if need_ref else None, -value * grad if need_old else None)


def _times_ratio(log_r, r, x):
    """r * x for r = exp(log_r): 0 where x is 0, and sign(x) exp(log_r + log|x|) where r overflowed (finite where the
    product is; spec.contract.RATIO_GUARDS['k3_unbiased'])."""
    far = torch.sign(x) * torch.exp(log_r + torch.log(x.abs()))
    return torch.where(x == 0, torch.zeros_like(x), torch.where(torch.isinf(r), far, r * x))


def _kl_value(logp, ref_logp, kind, old_logp=None):
    """k1 = -d, k2 = d^2/2, k3 = exp(d) - d - 1 with d = ref - logp (Schulman's estimators); k3_unbiased = r * k3
    (DeepSeek-V3.2), differentiable through r as well, by ``_UnbiasedK3``."""
    if kind == "k3_unbiased":
        return _UnbiasedK3.apply(logp, ref_logp, old_logp)
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return torch.expm1(d) - d  # (e^d - 1) - d without losing e^d - 1 to rounding near d = 0


def kl(logp, ref_logp, kind="k3", old_logp=None):
    """Per-token KL estimate of KL(pi || ref) from sampled tokens (k3_unbiased needs ``old_logp``)."""
    check_kl_kind(kind, has_old=old_logp is not None)
    logp = as_tensor("logp", logp)
    ref_logp = as_tensor("ref_logp", ref_logp, like=logp)
    check_same_shape("ref_logp", ref_logp.shape, "logp", logp.shape)
    if old_logp is not None:
        old_logp = as_tensor("old_logp", old_logp, like=logp).detach()
        check_same_shape("old_logp", old_logp.shape, "logp", logp.shape)
    return _kl_value(logp, ref_logp, kind, old_logp)


def dcpo_bounds(q, eps_low=0.16, eps_high=0.2, r_max=10.0):
    """DCPO Eq. 21-27: the branch around r = 1 of abs((r - 1) * r * q) <= eps, capped at r_max."""
    q = as_tensor("q", q)
    check_dcpo_bounds_args(eps_low, eps_high, r_max)
    if q.numel():
        check_q(float(q.min()), float(q.max()))
    return _bounds_unchecked(q, eps_low, eps_high, r_max)


def _bounds_unchecked(q, eps_low, eps_high, r_max):
    lo = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * eps_low / q, min=0.0))
    hi = torch.clamp(0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / q), max=r_max)
    return lo, hi


def _clip_terms(log_r, adv, lo, hi, dual_clip, delta=None, flows=None):
    """PPO-clip (1707.06347 Eq. 7) with the optional two-sided clip min(r, delta) (INTELLECT-2 2505.07291) and
    dual clip (1912.09729 Eq. 5) of r = exp(log_r): per-element loss and the indicator of a zeroed gradient.

    The loss is -r * A, differentiable in ``log_r``, where the unclipped term is active, A != 0 and ``flows`` (the
    token's loss reaches the total), and a constant elsewhere; exp is taken of ``log_r`` only there (the guards of
    spec.contract.RATIO_GUARDS), so a clipped ratio may overflow to inf without turning autograd's 0 * inf into NaN."""
    with torch.no_grad():
        r = torch.exp(torch.where(adv == 0, torch.zeros_like(log_r), log_r))  # A = 0: loss 0 at any ratio
        capped_r = r if delta is None else torch.where(r > delta, torch.full_like(r, delta), r)
        unclipped = capped_r * adv
        clipped_value = torch.clamp(r, lo, hi) * adv
        use_unclipped = unclipped <= clipped_value
        value = -torch.where(use_unclipped, unclipped, clipped_value)
        clipped = ~use_unclipped
        live = use_unclipped & (adv != 0)
        if delta is not None:
            clipped = clipped | (use_unclipped & (r > delta) & (adv != 0))
            live = live & (r <= delta)
        if dual_clip is not None:
            cap = -dual_clip * adv
            capped = (adv < 0) & (value > cap)
            value = torch.where(capped, cap, value)
            clipped = clipped | capped
            live = live & ~capped
        if flows is not None:
            live = live & flows
    return _surrogate(live, log_r, adv, value), clipped


def _surrogate(live, log_r, adv, value):
    """-exp(log_r) * A where ``live``, ``value`` elsewhere; the gradient reaches ``log_r`` only through the live
    tokens, whose exp alone is taken (the double where)."""
    r = torch.exp(torch.where(live, log_r, torch.zeros_like(log_r)))
    return torch.where(live, -r * adv, value)


def _sapo_loss(log_r, adv, tau_pos, tau_neg):
    """SAPO Eq. 5-6: l = -(4/tau) sigmoid(tau (r - 1)) A, tau by the sign of A; the gate saturated (4/tau, no
    gradient) past spec.contract.sapo_log_ratio_cap, where r is not formed."""
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    cap = torch.where(adv > 0, torch.full_like(adv, sapo_log_ratio_cap(tau_pos)),
                      torch.full_like(adv, sapo_log_ratio_cap(tau_neg)))
    saturated = log_r > cap
    r = torch.exp(torch.where(saturated, torch.zeros_like(log_r), log_r))
    gate = torch.where(saturated, torch.ones_like(r), torch.sigmoid(tau * (r - 1.0)))
    return -(4.0 / tau) * gate * adv


def _row_mean(x, mask, lens):
    return (x * mask).sum(1) / lens.clamp(min=1.0)


def rollout_weights(hp, old_logp, rollout_logp, mask):
    """Rollout correction with rho = exp(old_logp - rollout_logp): TIS min(rho, C) (Yao et al. 2025), token MIS
    (IcePop) rho * 1[C_lo <= rho <= C_hi], sequence MIS on prod_t rho, rejection sampling 1[C_lo <= rho <= C_hi] on
    prod_t rho (seq_rs) or its geometric mean (geo_rs; spec.objectives.rollout_weight); returns (weights [B, T],
    stats)."""
    kind = hp["rollout_correction"]
    if kind is None:
        return torch.ones_like(mask), {}
    log_rho = torch.where(mask > 0, old_logp - rollout_logp.detach(), torch.zeros_like(mask))
    row = ROLLOUT_ROW_STATISTIC.get(kind)
    if row is not None:
        log_rho = log_rho.sum(1, keepdim=True)
        if row == "geometric_mean":
            log_rho = log_rho / mask.sum(1, keepdim=True).clamp(min=1.0)
        log_rho = log_rho.expand_as(mask)
    rho = torch.exp(log_rho)
    if kind == "tis":
        w, cut = torch.clamp(rho, max=hp["tis_cap"]), rho > hp["tis_cap"]
    else:
        cut = (rho < hp["mis_low"]) | (rho > hp["mis_high"])
        w = torch.where(cut, torch.zeros_like(rho), torch.ones_like(rho) if kind in ROLLOUT_REJECTION else rho)
    n = mask.sum().clamp(min=1.0)
    return w, {"rc_weight_mean": float((w * mask).sum() / n), "rc_cut_frac": float((cut.to(mask.dtype) * mask).sum()
                                                                                     / n)}


def _vespo_kernel(hp, log_ratio, adv, mask):
    """VESPO's phi(W) = W^c1 e^(c2 (1 - W)) per row ([B, 1]; spec.objectives.vespo_kernel), log W the row's sum of
    log-ratios, (c1, c2) by the sign of the row's A; 0 past vespo_log_weight_cap, where W is not formed."""
    x = (log_ratio * mask).sum(1, keepdim=True)
    pos = _row_mean(adv, mask, mask.sum(1))[:, None] >= 0
    pick = lambda a, b: torch.where(pos, torch.full_like(x, a), torch.full_like(x, b))  # noqa: E731
    k, lam = pick(hp["vespo_k_pos"], hp["vespo_k_neg"]), pick(hp["vespo_lambda_pos"], hp["vespo_lambda_neg"])
    cap = pick(vespo_log_weight_cap(hp["vespo_k_pos"], hp["vespo_lambda_pos"]),
               vespo_log_weight_cap(hp["vespo_k_neg"], hp["vespo_lambda_neg"]))
    saturated = x > cap
    x = torch.where(saturated, torch.zeros_like(x), x)
    return torch.where(saturated, torch.zeros_like(x), torch.exp(k * x - lam * torch.expm1(x)))


def _log1mexp(z):
    """log(1 - e^z) for z < 0, accurate on both sides of -log 2 (Maechler 2012): NaN or -inf at z >= 0."""
    return torch.where(z > -math.log(2.0), torch.log(-torch.expm1(z)), torch.log1p(-torch.exp(z)))


def _binary_kl(x, y):
    """KL(Bern(mu) || Bern(pi)) for mu = e^y, pi = e^x (spec.objectives.binary_kl), the second term 0 at mu = 1;
    NaN where x >= 0 (unread there)."""
    rest = torch.where(y == 0, torch.zeros_like(y), -torch.expm1(y) * (_log1mexp(y) - _log1mexp(x)))
    return torch.exp(y) * (y - x) + rest


def _dppo_inside(kind, hp, logp, old_logp, adv, on):
    """DPPO's trust-region mask (spec.objectives.dppo_keep; Qi et al. 2602.04879): False where the token's update
    left the region in the direction its A pushes, True elsewhere and on padding (no gradient flows through it)."""
    zero = torch.zeros_like(logp)
    x, y = torch.where(on, logp, zero), torch.where(on, old_logp, zero)
    if kind == "binary_tv":
        moved = torch.exp(x) - torch.exp(y)
        up, down = ~(moved > hp["eps_high"]), ~(moved < -hp["eps_low"])
    else:
        kl = _binary_kl(x, y)
        up = ~((x > y) & ((x >= 0) | (kl > hp["eps_high"])))
        down = ~((x < y) & (kl > hp["eps_low"]))
    return torch.where(adv > 0, up, torch.where(adv < 0, down, torch.ones_like(on)))


def _sequence_terms(alg, hp, log_ratio, adv, mask, flows):
    """GSPO (Eq. 5-7) and GMPO (geometric mean of log-clipped token ratios): per-row loss, the zeroed-gradient
    indicator per token, and the ratio shown in stats. ``flows``: the rows whose loss reaches the total."""
    lens = mask.sum(1)
    a_seq = _row_mean(adv, mask, lens)
    if alg.ratio == "sequence":
        log_s = _row_mean(log_ratio, mask, lens)
        seq_loss, seq_clipped = _clip_terms(log_s, a_seq, 1 - hp["eps_low"], 1 + hp["eps_high"], hp["dual_clip"],
                                            hp["delta"], flows)
        s = torch.exp(log_s.detach())
        return seq_loss, seq_clipped[:, None].expand_as(mask) & (mask > 0), s[:, None].expand_as(mask)
    sgn = torch.sign(a_seq)[:, None]
    x_clip = torch.clamp(log_ratio, -hp["eps_low"], hp["eps_high"])
    use_x = sgn * log_ratio <= sgn * x_clip  # the unclipped term wins ties, as in PPO
    c = torch.where(use_x, log_ratio, x_clip)
    c = torch.where(sgn == 0, torch.zeros_like(c), c)  # A = 0: loss 0 at any ratio
    seq_loss = -a_seq * torch.exp(_row_mean(c, mask, lens))
    return seq_loss, ~use_x & (mask > 0), torch.exp(log_ratio.detach())


def policy_loss(name, logp, old_logp, adv, mask, *, group_size=None, ref_logp=None, rollout_logp=None,
                cov_select=None, **hp):
    """Loss (0-d tensor, differentiable in ``logp``) and stats of a registry algorithm on a [B, T] batch."""
    alg = get_algorithm(name)
    hp = resolve_hparams(name, hp)
    logp = as_tensor("logp", logp)
    old_logp = as_tensor("old_logp", old_logp, like=logp).detach()
    adv = as_tensor("adv", adv, like=logp).detach()
    if adv.dim() == 1 and logp.dim() == 2 and len(adv) == len(logp):  # a sequence advantage per row
        adv = adv[:, None].expand_as(logp)
    mask = as_mask(mask, logp)
    ref_logp, rollout_logp, cov_select = policy_options(
        name, alg, hp, {"logp": logp.shape, "old_logp": old_logp.shape, "adv": adv.shape, "mask": mask.shape}, mask,
        group_size, ref_logp, rollout_logp, cov_select, lambda arg, x: as_tensor(arg, x, like=logp).detach(),
        lambda arg, x: as_mask(x, logp, arg))
    on = mask > 0
    adv = torch.where(on, adv, torch.zeros_like(adv))  # a huge advantage on padding never meets a row's ratio
    log_ratio = torch.where(on, logp - old_logp, torch.zeros_like(logp))
    weights = agg_weights(mask, hp["agg"], group_size, hp["max_len"])
    rc_weights, stats = rollout_weights(hp, old_logp, rollout_logp, mask)
    scale = weights * rc_weights
    if hp["opsm_delta"] is not None:  # DeepSeek-V3.2's off-policy sequence mask, a weight of 0 or 1
        gap = _row_mean(-log_ratio.detach(), mask, mask.sum(1))
        dropped = (adv < 0) & (gap > hp["opsm_delta"])[:, None] & on
        scale = torch.where(dropped, torch.zeros_like(scale), scale)
        stats["opsm_frac"] = float((dropped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0))
    flows = scale != 0  # the tokens whose loss reaches the total: not padding, not cut by a rollout correction
    n = mask.sum().clamp(min=1.0)
    chosen = coef = None

    if alg.ratio in ("sequence", "geometric"):
        seq_loss, clipped, ratio = _sequence_terms(alg, hp, log_ratio, adv, mask, flows.any(1))
        loss_tok = seq_loss[:, None].expand_as(mask)
    else:
        if alg.ratio == "sequence_token":  # GSPO Eq. 13: s_it = sg[s_i] * pi / sg[pi], as log s_it
            log_s = _row_mean(log_ratio, mask, mask.sum(1)).detach()
            log_r = torch.where(on, log_s[:, None] + (logp - logp.detach()), torch.zeros_like(logp))
        else:
            log_r = log_ratio
        ratio = torch.exp(log_r.detach())
        clipped = torch.zeros_like(on)
        if alg.clip == "soft":
            loss_tok = _sapo_loss(log_r, adv, hp["tau_pos"], hp["tau_neg"])
        elif alg.clip == "truncated":  # MiniMax-M1 Eq. 4: -sg(clip(r)) * A * logp, the gradient never vanishes
            # [1 - eps_low, 1 + eps_high] (MiniMax-M1 Eq. 5), or TRL's clamp(r, max=eps_high): [0, eps_high]
            lo, hi = (1 - hp["eps_low"], 1 + hp["eps_high"]) if hp["cap_mode"] == "relative" else (0.0, hp["eps_high"])
            coef = -torch.clamp(ratio, lo, hi) * adv
            stats["trunc_frac"] = float((((ratio < lo) | (ratio > hi)).to(mask.dtype) * mask).sum() / n)
        elif alg.clip == "gamma":  # VESPO: -sg(phi(W)) A logp, W the product of the row's token ratios
            coef = -_vespo_kernel(hp, log_ratio.detach(), adv, mask) * adv
        elif alg.clip in DIVERGENCE_CLIPS:  # DPPO: -sg(M r) A logp, M the trust-region mask
            check_old_logp_probabilities(alg.name, bool((old_logp[on] > 0).any()))
            inside = _dppo_inside(alg.clip, hp, logp.detach(), old_logp, adv, on)
            coef = torch.where(inside & (adv != 0), -ratio * adv, torch.zeros_like(adv))  # 0 whatever r is
            clipped = ~inside & on
        elif alg.ratio == "none":  # GPG: -A * logp
            coef = -adv
        elif alg.clip == "off":  # KL-Cov: -r*A, plus kl_cov_coef * |log r| on the selected tokens
            chosen = _cov_selection(alg, hp, logp, adv, mask, clipped, cov_select)
            loss_tok = (_surrogate(flows & (adv != 0), log_r, adv, torch.zeros_like(adv))
                        + chosen.to(logp.dtype) * hp["kl_cov_coef"] * log_ratio.abs())
        else:
            if alg.clip == "dynamic":
                check_old_logp_probabilities(alg.name, bool((old_logp[on] > 0).any()))
                q = torch.exp(torch.where(on, old_logp, torch.zeros_like(old_logp)))
                lo, hi = _bounds_unchecked(q, hp["eps_low"], hp["eps_high"], hp["r_max"])
            else:
                lo, hi = 1 - hp["eps_low"], 1 + hp["eps_high"]
            if alg.select == "clip_cov":  # Clip-Cov: the selected tokens keep their value, lose their gradient
                # not those capped by delta or the dual clip
                ppo_clipped = ratio * adv > torch.clamp(ratio, lo, hi) * adv
                chosen = _cov_selection(alg, hp, logp, adv, mask, ppo_clipped, cov_select)
            grads = flows if chosen is None else flows & ~chosen
            loss_tok, clipped = _clip_terms(log_r, adv, lo, hi, hp["dual_clip"], hp["delta"], grads)
            if chosen is not None:
                clipped = clipped | chosen

    stats.update({"clip_frac": float((clipped.to(mask.dtype) * mask).sum() / n),
                  "ratio_mean": float(torch.where(on, ratio, torch.zeros_like(ratio)).sum() / n),
                  "tokens": int(mask.sum())})
    if chosen is not None:
        stats["cov_frac"] = float((chosen.to(mask.dtype) * mask).sum() / n)
    if coef is None:
        loss = (scale * torch.where(flows, loss_tok, torch.zeros_like(loss_tok))).sum()
    else:
        loss = _linear_loss(coef, logp, scale)
    if hp["beta"] > 0:
        # padding is zeroed before any exp, so that e^d never overflows there: autograd's 0 * inf would be NaN
        zero = torch.zeros_like(logp)
        lp_on, ref_on, old_on = (torch.where(on, x, zero) for x in (logp, ref_logp, old_logp))
        kl_tok = _kl_value(lp_on, ref_on, hp["kl"], old_on)
        loss = loss + hp["beta"] * (weights * kl_tok).sum()
        stats["kl_mean"] = float(kl_tok.detach().sum() / n)
    return loss, stats


def _linear_loss(coef, logp, scale):
    """sum(scale * coef * logp), a loss linear in logp (CISPO, GPG), with coef scaled by a power of 2 to at most 1
    and the total scaled back, which changes no bit, so that no term passes the float range before the total does
    (spec.contract.RATIO_GUARDS['linear_in_logp'])."""
    largest = math.frexp(torch.finfo(coef.dtype).max)[1] - 1  # 2^largest and 2^-largest are finite and not 0
    exponent = torch.frexp(coef.detach().abs().max()).exponent.clamp(-largest, largest)
    exponent = exponent.to(coef.dtype)  # a float exponent: torch's ldexp differentiates an integer one as 0
    return torch.ldexp((scale * (torch.ldexp(coef, -exponent) * logp)).sum(), exponent)


def _cov_selection(alg, hp, logp, adv, mask, ppo_clipped, cov_select):
    """The tokens Clip-Cov detaches or KL-Cov penalises: ``cov_select`` when given, else by Cov(log pi, A)
    (computed in float64 by spec.selection, so that every layer selects the same tokens); Clip-Cov's candidates
    leave out the ``ppo_clipped`` tokens."""
    if cov_select is not None:
        return cov_select > 0
    as_np = lambda x: x.detach().to("cpu", torch.float64).numpy()  # noqa: E731
    cov = token_cov(as_np(logp), as_np(adv), as_np(mask))
    if alg.select == "clip_cov":
        chosen = clip_cov_select(cov, as_np(mask), ppo_clipped.cpu().numpy(), hp["clip_cov_lb"], hp["clip_cov_ub"],
                                 hp["clip_cov_ratio"], hp["cov_seed"])
    else:
        chosen = kl_cov_select(cov, as_np(mask), hp["kl_cov_ratio"])
    return torch.as_tensor(chosen, device=mask.device)


def value_loss(values, old_values, returns, mask, clip=PARTS["value_loss"]["clip"], agg="token_mean",
               group_size=None, max_len=None):
    """Clipped critic loss 0.5 * max((v - R)^2, (clip(v, v_old - d, v_old + d) - R)^2) (PPO value clipping)."""
    check_value_args(clip, agg, max_len)
    values = as_tensor("values", values)
    old_values = as_tensor("old_values", old_values, like=values).detach()
    returns = as_tensor("returns", returns, like=values).detach()
    mask = as_mask(mask, values)
    check_token_shapes({"values": values.shape, "old_values": old_values.shape, "returns": returns.shape,
                        "mask": mask.shape}, group_size, agg)
    v_clip = torch.maximum(torch.minimum(values, old_values + clip), old_values - clip)
    plain, clipped = (values - returns) ** 2, (v_clip - returns) ** 2
    loss_tok = torch.where(mask > 0, 0.5 * torch.maximum(plain, clipped), torch.zeros_like(plain))
    weights = agg_weights(mask, agg, group_size, max_len)
    stats = {"clip_frac": float(((clipped > plain).to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0))}
    return (weights * loss_tok).sum(), stats


def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta=0.1):
    """DPO Eq. 7: mean of -log sigmoid(beta * ((lw - rw) - (ll - rl))) over preference pairs."""
    lw = as_tensor("logp_chosen", logp_chosen, ndim=1)
    names = ("logp_rejected", "ref_chosen", "ref_rejected")
    ll, rw, rl = (as_tensor(n, x, like=lw, ndim=1) for n, x in zip(names, (logp_rejected, ref_chosen, ref_rejected)))
    for n, x in zip(names, (ll, rw, rl)):
        check_same_shape(n, x.shape, "logp_chosen", lw.shape)
    check_dpo_args(beta, len(lw))
    margin = beta * ((lw - rw.detach()) - (ll - rl.detach()))
    m = margin.detach()
    stats = {"reward_accuracy": float((m > 0).float().mean()), "margin_mean": float(m.mean() / beta)}
    return -F.logsigmoid(margin).mean(), stats
