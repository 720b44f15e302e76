"""Policy, value, KL and DPO losses in float64 NumPy with analytic gradients (the reference conventions)."""
from __future__ import annotations

import numpy as np

from spec.contract import (check_dcpo_old_logp, check_dpo_args, check_kl_kind, check_q, check_reference,
                           check_same_shape, check_token_shapes, check_value_args, resolve_hparams)
from spec.registry import PARTS, get_algorithm

from .aggregation import agg_weights
from spec.arrays import as_float, as_mask


def _kl_terms(logp, ref_logp, kind):
    """k1 = -d, k2 = d^2/2, k3 = exp(d) - d - 1 with d = ref - logp; returns (value, d value / d logp)."""
    d = ref_logp - logp
    if kind == "k1":
        return -d, np.ones_like(d)
    if kind == "k2":
        return 0.5 * d * d, -d
    ed = np.exp(d)
    return ed - d - 1.0, 1.0 - ed


def kl(logp, ref_logp, kind="k3"):
    """Per-token KL estimate of KL(pi || ref) from sampled tokens (Schulman's k1/k2/k3)."""
    check_kl_kind(kind)
    logp, ref_logp = as_float("logp", logp), as_float("ref_logp", ref_logp)
    check_same_shape("ref_logp", ref_logp.shape, "logp", logp.shape)
    return _kl_terms(logp, ref_logp, kind)[0]


def dcpo_bounds(q, eps_low=0.16, eps_high=0.2, r_max=10.0):
    """DCPO Eq. 21-27: the branch around r = 1 of abs((r - 1) * r * q) <= eps, capped at r_max."""
    q = as_float("q", q)
    if q.size:
        check_q(float(q.min()), float(q.max()))
    return _bounds_unchecked(q, eps_low, eps_high, r_max)


def _bounds_unchecked(q, eps_low, eps_high, r_max):
    with np.errstate(over="ignore", divide="ignore"):
        lo = 0.5 + 0.5 * np.sqrt(np.maximum(1.0 - 4.0 * eps_low / q, 0.0))
        hi = np.minimum(0.5 + 0.5 * np.sqrt(1.0 + 4.0 * eps_high / q), r_max)
    return lo, hi


def _clip_terms(r, adv, lo, hi, dual_clip):
    """PPO-clip (1707.06347 Eq. 7) with optional dual clip: loss, d loss / d log r, and the clipped indicator."""
    unclipped = r * adv
    clipped_value = np.clip(r, lo, hi) * adv
    use_unclipped = unclipped <= clipped_value
    loss = -np.where(use_unclipped, unclipped, clipped_value)
    dloss = np.where(use_unclipped, -unclipped, 0.0)
    clipped = ~use_unclipped
    if dual_clip is not None:
        cap = -dual_clip * adv
        capped = (adv < 0) & (loss > cap)
        loss = np.where(capped, cap, loss)
        dloss = np.where(capped, 0.0, dloss)
        clipped = clipped | capped
    return loss, dloss, clipped


def _sapo_terms(r, adv, tau_pos, tau_neg):
    """SAPO Eq. 5-6: l = -(4/tau) sigmoid(tau (r - 1)) A; d/d log r = -sech^2(tau (r-1)/2) r A."""
    tau = np.where(adv > 0, tau_pos, tau_neg)
    th = np.tanh(0.5 * tau * (r - 1.0))
    loss = -(2.0 / tau) * (1.0 + th) * adv
    dloss = -(1.0 - th * th) * r * adv
    return loss, dloss


def _seq_mean_log_ratio(log_ratio, mask):
    lens = mask.sum(1)
    return np.divide((log_ratio * mask).sum(1), lens, out=np.zeros(len(lens)), where=lens > 0), lens


def _seq_adv(adv, mask, lens):
    """The sequence advantage: the mean of the row's token advantages (the constant itself when constant)."""
    return np.divide((adv * mask).sum(1), lens, out=np.zeros(len(lens)), where=lens > 0)


def policy_loss(name, logp, old_logp, adv, mask, *, group_size=None, ref_logp=None, **hp):
    """Loss, gradient d loss / d logp and stats of a registry algorithm on a [B, T] batch (float64)."""
    alg = get_algorithm(name)
    hp = resolve_hparams(name, hp)
    logp, old_logp = as_float("logp", logp), as_float("old_logp", old_logp)
    adv = as_float("adv", adv)
    if adv.ndim == 1 and logp.ndim == 2 and len(adv) == len(logp):  # a sequence advantage per row
        adv = np.broadcast_to(adv[:, None], logp.shape)
    mask = as_mask(mask)
    shapes = {"logp": logp.shape, "old_logp": old_logp.shape, "adv": adv.shape, "mask": mask.shape}
    check_reference(name, hp["beta"], ref_logp)
    if hp["beta"] > 0:
        ref_logp = as_float("ref_logp", ref_logp)
        shapes["ref_logp"] = ref_logp.shape
    check_token_shapes(shapes, group_size, hp["agg"])
    on = mask > 0
    log_ratio = np.where(on, logp - old_logp, 0.0)
    weights = agg_weights(mask, hp["agg"], group_size, hp["max_len"])

    if alg.ratio == "sequence":
        z, lens = _seq_mean_log_ratio(log_ratio, mask)
        s = np.exp(z)
        seq_loss, dseq, seq_clipped = _clip_terms(s, _seq_adv(adv, mask, lens), 1 - hp["eps_low"],
                                                  1 + hp["eps_high"], hp["dual_clip"])
        w_row = weights.sum(1)
        loss_tok = np.broadcast_to(seq_loss[:, None], mask.shape)
        grad = (w_row * dseq / np.where(lens > 0, lens, 1.0))[:, None] * mask
        ratio, clipped = np.broadcast_to(s[:, None], mask.shape), np.broadcast_to(seq_clipped[:, None], mask.shape)
    else:
        if alg.ratio == "sequence_token":
            ratio = np.broadcast_to(np.exp(_seq_mean_log_ratio(log_ratio, mask)[0])[:, None], mask.shape)
        else:
            ratio = np.exp(log_ratio)
        if alg.clip == "soft":
            loss_tok, dtok = _sapo_terms(ratio, adv, hp["tau_pos"], hp["tau_neg"])
            clipped = np.zeros(mask.shape, dtype=bool)
        else:
            if alg.clip == "dynamic":
                check_dcpo_old_logp((old_logp[on] > 0).any())
                lo, hi = _bounds_unchecked(np.exp(np.where(on, old_logp, 0.0)), hp["eps_low"], hp["eps_high"],
                                           hp["r_max"])
            else:
                lo, hi = 1 - hp["eps_low"], 1 + hp["eps_high"]
            loss_tok, dtok, clipped = _clip_terms(ratio, adv, lo, hi, hp["dual_clip"])
        grad = weights * dtok

    loss_tok = np.where(on, loss_tok, 0.0)
    stats = _stats(ratio, clipped, mask)
    if hp["beta"] > 0:
        kl_tok, dkl = _kl_terms(logp, ref_logp, hp["kl"])
        loss_tok = loss_tok + hp["beta"] * np.where(on, kl_tok, 0.0)
        grad = grad + hp["beta"] * weights * dkl
        stats["kl_mean"] = float((kl_tok * mask).sum() / max(mask.sum(), 1.0))
    return float((weights * loss_tok).sum()), grad, stats


def _stats(ratio, clipped, mask):
    n = max(mask.sum(), 1.0)
    return {"clip_frac": float((clipped * mask).sum() / n), "ratio_mean": float((ratio * mask).sum() / n),
            "tokens": int(mask.sum())}


def value_loss(values, old_values, returns, mask, clip=PARTS["value_loss"]["clip"], agg="token_mean",
               group_size=None, max_len=None):
    """Clipped critic loss 0.5 * max((v - R)^2, (clip(v, v_old - d, v_old + d) - R)^2) (PPO value clipping)."""
    check_value_args(clip, agg, max_len)
    values, old_values = as_float("values", values), as_float("old_values", old_values)
    returns, mask = as_float("returns", returns), as_mask(mask)
    check_token_shapes({"values": values.shape, "old_values": old_values.shape, "returns": returns.shape,
                        "mask": mask.shape}, group_size, agg)
    v_clip = np.clip(values, old_values - clip, old_values + clip)
    plain, clipped = (values - returns) ** 2, (v_clip - returns) ** 2
    use_clipped = clipped > plain
    loss_tok = 0.5 * np.maximum(plain, clipped)
    dtok = np.where(use_clipped, 0.0, values - returns)  # the clipped branch wins only where v was clipped
    weights = agg_weights(mask, agg, group_size, max_len)
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
    margin = beta * ((lw - rw) - (ll - rl))
    loss = np.logaddexp(0.0, -margin)  # -log sigmoid(m)
    dmargin = -0.5 * (1.0 - np.tanh(0.5 * margin)) / lw.size  # d/dm of mean(-log sigmoid(m)) = -sigmoid(-m)/N
    stats = {"reward_accuracy": float((margin > 0).mean()), "margin_mean": float(margin.mean() / beta)}
    return float(loss.mean()), (beta * dmargin, -beta * dmargin), stats
