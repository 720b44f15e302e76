"""Policy, value, KL and DPO losses in torch (any float dtype and device); autograd gives the gradients."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from spec.contract import (check_dcpo_old_logp, check_dpo_args, check_kl_kind, check_q, check_reference,
                           check_same_shape, check_token_shapes, check_value_args, resolve_hparams)
from spec.registry import PARTS, get_algorithm

from .aggregation import agg_weights
from .checks import as_mask, as_tensor


def _kl_value(logp, ref_logp, kind):
    """k1 = -d, k2 = d^2/2, k3 = exp(d) - d - 1 with d = ref - logp (Schulman's estimators)."""
    d = ref_logp - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return torch.exp(d) - d - 1.0


def kl(logp, ref_logp, kind="k3"):
    """Per-token KL estimate of KL(pi || ref) from sampled tokens."""
    check_kl_kind(kind)
    logp = as_tensor("logp", logp)
    ref_logp = as_tensor("ref_logp", ref_logp, like=logp)
    check_same_shape("ref_logp", ref_logp.shape, "logp", logp.shape)
    return _kl_value(logp, ref_logp, kind)


def dcpo_bounds(q, eps_low=0.16, eps_high=0.2, r_max=10.0):
    """DCPO Eq. 21-27: the branch around r = 1 of abs((r - 1) * r * q) <= eps, capped at r_max."""
    q = as_tensor("q", q)
    if q.numel():
        check_q(float(q.min()), float(q.max()))
    return _bounds_unchecked(q, eps_low, eps_high, r_max)


def _bounds_unchecked(q, eps_low, eps_high, r_max):
    lo = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * eps_low / q, min=0.0))
    hi = torch.clamp(0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / q), max=r_max)
    return lo, hi


def _clip_terms(r, adv, lo, hi, dual_clip):
    """PPO-clip (1707.06347 Eq. 7) with optional dual clip: per-element loss and the clipped indicator."""
    unclipped = r * adv
    clipped_value = torch.clamp(r, lo, hi) * adv
    use_unclipped = unclipped <= clipped_value
    loss = -torch.where(use_unclipped, unclipped, clipped_value)
    clipped = ~use_unclipped
    if dual_clip is not None:
        cap = -dual_clip * adv
        capped = (adv < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        clipped = clipped | capped
    return loss, clipped


def _sapo_loss(r, adv, tau_pos, tau_neg):
    """SAPO Eq. 5-6: l = -(4/tau) sigmoid(tau (r - 1)) A, tau by the sign of A."""
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    return -(4.0 / tau) * torch.sigmoid(tau * (r - 1.0)) * adv


def _row_mean(x, mask, lens):
    return (x * mask).sum(1) / lens.clamp(min=1.0)


def policy_loss(name, logp, old_logp, adv, mask, *, group_size=None, ref_logp=None, **hp):
    """Loss (0-d tensor, differentiable in ``logp``) and stats of a registry algorithm on a [B, T] batch."""
    alg = get_algorithm(name)
    hp = resolve_hparams(name, hp)
    logp = as_tensor("logp", logp)
    old_logp = as_tensor("old_logp", old_logp, like=logp).detach()
    adv = as_tensor("adv", adv, like=logp).detach()
    if adv.dim() == 1 and logp.dim() == 2 and len(adv) == len(logp):  # a sequence advantage per row
        adv = adv[:, None].expand_as(logp)
    mask = as_mask(mask, logp)
    shapes = {"logp": logp.shape, "old_logp": old_logp.shape, "adv": adv.shape, "mask": mask.shape}
    check_reference(name, hp["beta"], ref_logp)
    if hp["beta"] > 0:
        ref_logp = as_tensor("ref_logp", ref_logp, like=logp).detach()
        shapes["ref_logp"] = ref_logp.shape
    check_token_shapes(shapes, group_size, hp["agg"])
    on = mask > 0
    log_ratio = torch.where(on, logp - old_logp, torch.zeros_like(logp))
    weights = agg_weights(mask, hp["agg"], group_size, hp["max_len"])
    lens = mask.sum(1)

    if alg.ratio == "sequence":
        s = torch.exp(_row_mean(log_ratio, mask, lens))
        seq_loss, seq_clipped = _clip_terms(s, _row_mean(adv, mask, lens), 1 - hp["eps_low"], 1 + hp["eps_high"],
                                            hp["dual_clip"])
        loss_tok = seq_loss[:, None].expand_as(mask)
        ratio, clipped = s.detach()[:, None].expand_as(mask), seq_clipped[:, None].expand_as(mask)
    else:
        if alg.ratio == "sequence_token":  # GSPO Eq. 13: s_it = sg[s_i] * pi / sg[pi]
            s = torch.exp(_row_mean(log_ratio, mask, lens)).detach()
            r = s[:, None] * torch.exp(logp - logp.detach())
        else:
            r = torch.exp(log_ratio)
        if alg.clip == "soft":
            loss_tok = _sapo_loss(r, adv, hp["tau_pos"], hp["tau_neg"])
            clipped = torch.zeros_like(on)
        else:
            if alg.clip == "dynamic":
                check_dcpo_old_logp(bool((old_logp[on] > 0).any()))
                q = torch.exp(torch.where(on, old_logp, torch.zeros_like(old_logp)))
                lo, hi = _bounds_unchecked(q, hp["eps_low"], hp["eps_high"], hp["r_max"])
            else:
                lo, hi = 1 - hp["eps_low"], 1 + hp["eps_high"]
            loss_tok, clipped = _clip_terms(r, adv, lo, hi, hp["dual_clip"])
        ratio = r.detach()

    loss_tok = torch.where(on, loss_tok, torch.zeros_like(loss_tok))
    n = mask.sum().clamp(min=1.0)
    stats = {"clip_frac": float((clipped.to(mask.dtype) * mask).sum() / n),
             "ratio_mean": float((ratio * mask).sum() / n), "tokens": int(mask.sum())}
    if hp["beta"] > 0:
        kl_tok = torch.where(on, _kl_value(logp, ref_logp, hp["kl"]), torch.zeros_like(logp))
        loss_tok = loss_tok + hp["beta"] * kl_tok
        stats["kl_mean"] = float(kl_tok.detach().sum() / n)
    return (weights * loss_tok).sum(), stats


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
    loss_tok = 0.5 * torch.maximum(plain, clipped)
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
