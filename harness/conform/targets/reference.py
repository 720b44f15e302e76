"""The reference's named conventions as functions of a batch, computed by the gpu layer in float64 (which
``cliplab verify`` holds equal to the exact spec), and the grids of alternatives a target may match instead."""
from __future__ import annotations

import copy
import itertools
from dataclasses import replace
from functools import partial

import numpy as np
import torch

import gpu
import spec
from gpu.aggregation import agg_weights
from spec.contract import cispo_bounds, resolve_hparams
from spec.registry import (AGG_MODES, DIVERGENCE_CLIPS, GROUP_AGG_MODES, PARTS, RELEASED, ROLLOUT_REJECTION,
                           ROLLOUT_ROW_STATISTIC, get_algorithm)

from harness.conform.cases import Check, Convention, batch_of

#: The aggregation modes of a token-level loss: every mode but seq_mean (a per-sequence loss's mean).
TOKEN_AGG = [m for m in AGG_MODES if m != "seq_mean"]


SEQ_MEANS = ("seq_mean_token_mean", "seq_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def t64(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=torch.float64, requires_grad=grad)


def label(name: str, hp: dict) -> str:
    """``dapo`` or ``dapo[agg=token_mean, dual_clip=3]``: the settings that differ from the paper's."""
    defaults = get_algorithm(name).defaults
    agg = hp.get("agg", defaults.get("agg"))
    shown = {k: v for k, v in hp.items() if (k != "max_len" and (k == "agg" or v != defaults.get(k)))
             or (k == "max_len" and agg == "seq_mean_token_sum_norm")}
    text = name + ("[" + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in sorted(shown.items())) + "]" if shown else "")
    return f"{RELEASED[name]['label']} ({text})" if is_released(name, hp) else text


def is_released(name: str, hp: dict) -> bool:
    """Whether ``hp`` is the setting of ``name``'s released code (registry RELEASED), defaults resolved."""
    if name not in RELEASED:
        return False
    strip = lambda h: {k: v for k, v in h.items() if k != "max_len"}  # noqa: E731
    try:
        return strip(resolve_hparams(name, strip(hp))) == strip(resolve_hparams(name, dict(RELEASED[name]["hp"])))
    except ValueError:
        return False


def released(name: str) -> list:
    """The convention of ``name``'s released code, if the registry names one."""
    return [policy(name, **RELEASED[name]["hp"])] if name in RELEASED else []


def _hp(name, hp, batch):
    """Dr.GRPO's constant L defaults to the batch's padded width unless a check sets max_len."""
    return {"max_len": batch.max_len, **hp}


def policy_value(name: str, hp: dict, batch, rows_counted: bool = False, kl_cap: bool = False):
    """Loss and d loss / d logp of a registry algorithm (with the batch's ``rollout_logp`` extra, when it has one,
    for a rollout correction). Variants, not reference conventions: ``rows_counted`` also counts fully masked
    rows in the mean over sequences (fully masked groups in the mean over groups, for a group mode); ``kl_cap``
    takes the KL term as ``capped_kl``."""
    logp = t64(batch.logp, grad=True)
    hp = _hp(name, hp, batch)
    rollout = batch.extra.get("rollout_logp") if hasattr(batch, "extra") and hp.get("rollout_correction") else None
    beta = _beta(name, hp) if kl_cap else 0.0
    loss, _ = gpu.policy_loss(name, logp, t64(batch.old_logp), t64(batch.adv), t64(batch.mask),
                              group_size=batch.group_size, ref_logp=t64(batch.ref_logp),
                              rollout_logp=None if rollout is None else t64(rollout),
                              **({**hp, "beta": 0.0} if kl_cap else hp))
    if beta > 0:
        weights = agg_weights(t64(batch.mask), hp.get("agg", get_algorithm(name).defaults["agg"]),
                              batch.group_size, hp["max_len"])
        kind = hp.get("kl", get_algorithm(name).defaults["kl"])
        loss = loss + beta * (weights * capped_kl(logp, t64(batch.ref_logp), t64(batch.old_logp), kind)).sum()
    if rows_counted:
        live = batch.mask.sum(1) > 0
        if hp.get("agg", get_algorithm(name).defaults["agg"]) in GROUP_AGG_MODES:
            live = live.reshape(-1, batch.group_size).any(1)
        loss = loss * float(live.sum()) / max(len(live), 1)
    if loss.requires_grad:
        loss.backward()
    grad = logp.grad if logp.grad is not None else torch.zeros_like(logp)
    return float(loss.detach()), grad.numpy()


def capped_kl(logp, ref_logp, old_logp, kind: str):
    """A variant of k3 (and of k3_unbiased, r * k3) that verl's kl_penalty and Unsloth compute: d = ref - logp
    clamped to [-20, 20], then the token's term clamped to [-10, 10] (zero gradient where a clamp bites)."""
    d = torch.clamp(ref_logp - logp, -20.0, 20.0)
    term = torch.expm1(d) - d
    if kind == "k3_unbiased":
        term = torch.exp(logp - old_logp) * term
    return torch.clamp(term, -10.0, 10.0)


def policy(name: str, **hp) -> Convention:
    return _policy_convention(name, hp, label(name, hp))


def _policy_convention(name, hp, text, rows_counted=False, named=True):
    return Convention(text, lambda b: policy_value(name, hp, b, rows_counted), named, ties=policy_ties(name, hp),
                      far_ref=_beta(name, hp) > 0, policy=(name, hp, rows_counted),
                      linear="logp" if linear_in_logp(name) else "")


def _resolved(name, hp):
    """The settings with the registry's defaults (Dr.GRPO's L, unused here, set when missing)."""
    return resolve_hparams(name, {**hp, "max_len": hp.get("max_len") or 1})


def _beta(name, hp):
    return _resolved(name, hp)["beta"]


def policy_ties(name: str, hp: dict) -> dict:
    """Where the loss of ``name`` with ``hp`` switches branch (see Convention.ties): the clip range 1 - eps_low,
    1 + eps_high (PPO Eq. 7), DCPO's bounds at each token's q (Eq. 21-27), the dual clip c (1912.09729 Eq. 5), the
    two-sided clip delta, CISPO's cap (MiniMax-M1 Eq. 5, or eps_high itself with cap_mode absolute), GMPO's
    log-space clip, DPPO's divergence thresholds (Qi et al. 2602.04879, on pi - mu or the binary KL), and the
    rollout weight's TIS cap or MIS bounds, on each token's weight or on the row's (seq_mis, and the rejection bands
    seq_rs and geo_rs). SAPO's gate is smooth: none."""
    alg, h = get_algorithm(name), _resolved(name, hp)
    ratio, out = [], {}
    if alg.clip == "fixed":
        ratio = [1 - h["eps_low"], 1 + h["eps_high"], h["dual_clip"], h["delta"]]
    elif alg.clip == "truncated":
        ratio = list(cispo_bounds(h))
    elif alg.clip == "log":
        out["log_ratio"] = (-h["eps_low"], h["eps_high"])
    elif alg.clip == "dynamic":
        out["dcpo"] = (h["eps_low"], h["eps_high"], h["r_max"])
    elif alg.clip in DIVERGENCE_CLIPS:
        out["dppo"] = (alg.clip, h["eps_low"], h["eps_high"])
    ratio = tuple(v for v in ratio if v is not None and v > 0)
    if ratio:
        out["ratio"] = ratio
    band = tuple(v for v in (h["mis_low"], h["mis_high"]) if v > 0)
    if h["rollout_correction"] == "tis":
        out["rollout"] = (h["tis_cap"],)
    elif h["rollout_correction"] == "mis":
        out["rollout"] = band
    elif h["rollout_correction"] in ROLLOUT_ROW_STATISTIC:
        out["rollout_row"] = (ROLLOUT_ROW_STATISTIC[h["rollout_correction"]], *band)
    return out or None


def linear_in_logp(name: str) -> bool:
    """Whether the loss of ``name`` is sum_t c_t logp_t with c_t held constant (CISPO, DPPO, VESPO, GPG)."""
    alg = get_algorithm(name)
    return alg.clip in (*DIVERGENCE_CLIPS, "truncated", "gamma") or alg.ratio == "none"


def log_ratio_clamped(conv: Convention, c: float = 20.0) -> Convention | None:
    """``conv`` with each token's log-ratio clamped to [-c, c] before the exponential (verl core_algos, OpenRLHF
    PolicyLoss, SkyRL safe_exp_delta): a variant, for token-ratio losses without a KL term."""
    if conv.policy is None or get_algorithm(conv.policy[0]).ratio != "token" or _beta(*conv.policy[:2]) > 0:
        return None

    def fn(b):
        lr = b.logp - b.old_logp
        out = _shifted(b, b.old_logp + np.clip(lr, -c, c))
        value, grad = conv.fn(out)
        return value, np.where((np.abs(lr) > c) & (b.mask > 0), 0.0, grad)
    return _variant(conv, f"clamps the log-ratio at +-{c:g} (value frozen, gradient 0 beyond)", fn)


def seq_log_ratio_capped(conv: Convention, c: float = 10.0) -> Convention | None:
    """``conv`` with the log of the sequence ratio capped at c (verl's and SkyRL's GSPO): a variant, for GSPO and
    GSPO-token without a KL term."""
    if conv.policy is None or get_algorithm(conv.policy[0]).ratio not in ("sequence", "sequence_token") \
            or _beta(*conv.policy[:2]) > 0:
        return None

    def fn(b):
        on = b.mask > 0
        lens = np.maximum(on.sum(1), 1)
        mean = np.where(on, b.logp - b.old_logp, 0.0).sum(1) / lens
        over = (mean > c) & on.any(1)
        value, grad = conv.fn(_shifted(b, b.logp - np.where(over, mean - c, 0.0)[:, None] * on))
        return value, np.where(over[:, None] & on, 0.0, grad)
    return _variant(conv, f"caps the log of the sequence ratio at {c:g} (value frozen, gradient 0 beyond)", fn)


def kl_term_capped(conv: Convention) -> Convention | None:
    """``conv`` with its k3 (or k3_unbiased) term as ``capped_kl``: a variant, for a policy loss with beta > 0 or
    the per-token k3 values."""
    if conv.policy is None and conv.base is None and conv.label == "k3":
        return kl("k3", capped=True)
    if conv.policy is None or _beta(*conv.policy[:2]) <= 0:
        return None
    name, hp, rows_counted = conv.policy
    if _resolved(name, hp)["kl"] not in ("k3", "k3_unbiased"):
        return None
    return _variant(conv, KL_CAP, lambda b: policy_value(name, hp, b, rows_counted, kl_cap=True))


def ratio_truncated(conv: Convention, c: float = 3.0) -> Convention | None:
    """``conv`` with the ratio in its constant weight truncated at c, min(r, c) (verl's DPPO reads clip_ratio_c, 3 by
    default, as a truncated-IS cap): a variant, for DPPO without a KL term (a loss linear in logp)."""
    if conv.linear != "logp" or get_algorithm(conv.policy[0]).clip not in DIVERGENCE_CLIPS \
            or _beta(*conv.policy[:2]) > 0:
        return None

    def fn(b):
        value, grad = conv.fn(b)
        ratio = np.exp(np.where(b.mask > 0, b.logp - b.old_logp, 0.0))
        grad = grad * np.where(ratio > c, c / ratio, 1.0)
        return float((grad * b.logp).sum()), grad
    return replace(_variant(conv, f"truncates the ratio in its weight at {c:g} (gradient scaled by c / r beyond)", fn),
                   linear="logp")


def surrogate_value(conv: Convention) -> Convention | None:
    """``conv`` (a loss sum_t c_t logp_t with c_t constant) with the value sum_t c_t, the surrogate -M r A (SkyRL's
    DPPO): the same gradient, another value; a variant, without a KL term."""
    if conv.linear != "logp" or _beta(*conv.policy[:2]) > 0:
        return None

    def fn(b):
        _, grad = conv.fn(b)
        return float(grad.sum()), grad
    return replace(_variant(conv, "takes the surrogate sum_t c_t as its value (no log-prob factor; the same "
                            "gradient)", fn), linear="sum")


def rejected_rows_dropped(conv: Convention) -> Convention | None:
    """``conv`` with the rows a rejection band (seq_rs, geo_rs) rejects taken out of the response mask, so that
    they count in no mean (verl's trainer, SkyRL and AReaL replace the loss mask): a variant."""
    if conv.policy is None or _resolved(*conv.policy[:2])["rollout_correction"] not in ROLLOUT_REJECTION:
        return None
    name, hp, rows_counted = conv.policy

    def fn(b):
        weights, _ = gpu.rollout_weights(_resolved(name, hp), t64(b.old_logp), t64(b.extra["rollout_logp"]),
                                         t64(b.mask))
        kept = replace(b, mask=b.mask * (weights.numpy() > 0), extra={})
        return policy_value(name, {**hp, "rollout_correction": None, "max_len": hp.get("max_len", b.max_len)},
                            kept, rows_counted)
    return _variant(conv, "leaves the rejected rows out of the loss mask (they count in no mean)", fn)


#: The clamps, caps and floors a target may apply where the reference has none, and the other forms of the same
#: loss; each maps a convention to its variant (None where it does not apply). The engine tries them when no
#: convention explains a family.
VARIANTS = (log_ratio_clamped, seq_log_ratio_capped, kl_term_capped, ratio_truncated, surrogate_value,
            rejected_rows_dropped)


def _shifted(b, logp):
    out = copy.copy(b)
    out.logp = logp
    return out


def _variant(conv: Convention, part: str, fn) -> Convention:
    return Convention(f"{conv.label}, {part}", fn, named=False, ties=conv.ties, policy=conv.policy, base=conv,
                      part=part)


#: Families of policy losses, for the hints of a difference: PPO-clip on token ratios (PPO 1707.06347 Eq. 7 and
#: the GRPO line that keeps it), sequence-level ratios (GSPO 2507.18071, GMPO's geometric mean), and the losses
#: that replace the clip: SAPO's soft gate, CISPO's truncated weight, GPG's plain policy gradient.
FAMILIES = {"token PPO-clip": ("ppo", "grpo", "dr_grpo", "dapo", "dcpo", "clip_cov", "kl_cov"),
            "sequence ratio": ("gspo", "gspo_token", "gmpo"), "soft gate": ("sapo",), "truncated weight": ("cispo",),
            "plain policy gradient": ("gpg",)}


def per_row_ratio(conv: Convention) -> bool:
    """Whether the convention clips one ratio per sequence (GSPO and GSPO-token): its ties are the rows'."""
    return conv.policy is not None and get_algorithm(conv.policy[0]).ratio in ("sequence", "sequence_token")


def family_of(name: str) -> str:
    return next((family for family, names in FAMILIES.items() if name in names), name)


def region(conv: Convention, b, i: int, t: int, target_grad: float, reference_grad: float) -> str:
    """Where token (i, t) of ``b`` lies for a policy convention, in words: the advantage's sign, the ratio (the
    row's sequence ratio for a sequence-level loss) against the clip bounds, and the branch each side takes."""
    if conv.policy is None:
        return ""
    if b.mask[i, t] <= 0:
        return "a masked token, outside the response, where the reference's gradient is 0"
    name, hp = conv.policy[:2]
    alg, h = get_algorithm(name), _resolved(name, hp)
    on = b.mask[i] > 0
    if alg.ratio in ("sequence", "sequence_token", "geometric"):
        what, r = "s", float(np.exp((b.logp[i] - b.old_logp[i])[on].mean())) if on.any() else 1.0
    else:
        what, r = "r", float(np.exp(b.logp[i, t] - b.old_logp[i, t]))
    a = float(b.adv[i, t])
    words = [f"A {'>' if a > 0 else '<' if a < 0 else '='} 0", f"{what} = {r:.6g}"]
    tail = f"the reference's gradient {reference_grad:.6g}, yours {target_grad:.6g}"
    if alg.clip == "fixed":
        lo, hi = 1 - h["eps_low"], 1 + h["eps_high"]
        words[1] = (f"{what} < 1 - eps_low = {lo:g}" if r < lo else f"{what} > 1 + eps_high = {hi:g}" if r > hi
                    else f"{lo:g} <= {what} <= {hi:g}")
        clipped = (a > 0 and r > hi) or (a < 0 and r < lo)
        dual = h["dual_clip"] is not None and a < 0 and r > h["dual_clip"]
        branch = ("the dual clip's constant -c * A" if dual else "the clipped branch" if clipped
                  else "the unclipped branch")
        tail = ("the clip's branches contribute 0 there; " + tail if a == 0 else
                f"the reference takes {branch} (gradient {reference_grad:.6g}), yours gives {target_grad:.6g}"
                + (" (as the clipped branch would)" if target_grad == 0 and reference_grad != 0 else
                   " (as the unclipped branch would)" if reference_grad == 0 and np.isfinite(target_grad)
                   and target_grad != 0 else ""))
    words.append(tail)
    return ", ".join(words[:2]) + ": " + words[2]


def exact_policy(name: str, **hp):
    """The exact (sympy) reference loss of a minimal input."""
    return lambda b: float(spec.policy_loss(name, b.logp, b.old_logp, b.adv, b.mask, group_size=b.group_size,
                                            ref_logp=b.ref_logp,
                                            rollout_logp=b.extra.get("rollout_logp") if hp.get("rollout_correction")
                                            else None,
                                            **_hp(name, hp, b))[0])


def policy_grid(names, base: dict, options: dict, rows_counted: bool = False, exclude=None) -> list:
    """Every combination of ``options`` (None = the registry default) over ``base`` for each algorithm in
    ``names``, less ``exclude`` (name, hp); with ``rows_counted`` also the variant that counts empty rows in the
    mean over sequences, or empty groups in the mean over groups (of ``exclude`` too)."""
    out, keys = [], list(options)
    for name in names:
        for values in itertools.product(*(options[k] for k in keys)):
            hp = {k: v for k, v in {**base, **dict(zip(keys, values))}.items() if v is not None}
            if exclude is None or (name, hp) != exclude:
                out.append(policy(name, **hp))
            agg = hp.get("agg", get_algorithm(name).defaults["agg"])
            if rows_counted and (agg in SEQ_MEANS or agg in GROUP_AGG_MODES):
                unit = ("groups", "groups") if agg in GROUP_AGG_MODES else ("rows", "sequences")
                out.append(_policy_convention(name, hp, label(name, hp) + " with empty {} counted in the mean over "
                                              "{}".format(*unit), rows_counted=True, named=False))
    return out


def policy_check(name: str, call: str, knob: str, run, ref_hp: dict, grid: dict, names=None, seq_adv=None,
                 more=(), cases=None, **fields) -> Check:
    """A check of ``run`` against registry algorithm ``name`` with ``ref_hp``: as candidates, every combination of
    ``grid`` for ``names`` (default: ``name``) with empty rows counted too, and ``more``; on generated batches (one
    advantage per row with ``seq_adv``) unless ``cases``; minimal inputs with the exact (sympy) reference.
    ``fields``: the Check's others (note, reads, dtype, tolerance)."""
    return Check(name, call, knob, run, policy(name, **ref_hp),
                 policy_grid(names or [name], ref_hp, grid, rows_counted=True, exclude=(name, ref_hp)) + list(more),
                 cases or partial(batch_of, seq_adv=seq_adv), exact=exact_policy(name, **ref_hp), **fields)


def aggregate(mode: str, max_len=None) -> Convention:
    """sum(w * l) with the reference weights of ``mode``; the loss matrix is the batch's logp; grad = w."""
    def fn(b):
        w = agg_weights(t64(b.mask), mode, b.group_size, max_len if max_len is not None else b.max_len).numpy()
        return float((w * b.logp).sum()), w
    return Convention(f"agg={mode}", fn)


def all_aggregations(max_len=None) -> list:
    return [aggregate(m, max_len) for m in TOKEN_AGG]


def kl(kind: str, capped: bool = False) -> Convention:
    """Per-token k1/k2/k3 (Schulman's estimators) on unmasked tokens and the gradient of their sum; ``capped``: the
    variant ``capped_kl`` of k3."""
    def fn(b):
        logp = t64(b.logp, grad=True)
        ref_logp = t64(b.ref_logp)
        values = (capped_kl(logp, ref_logp, None, kind) if capped else gpu.kl(logp, ref_logp, kind)) * t64(b.mask)
        values.sum().backward()
        return values.detach().numpy(), logp.grad.numpy()
    if capped:
        return Convention(f"{kind}, {KL_CAP}", fn, named=False, far_ref=True, base=kl(kind), part=KL_CAP)
    return Convention(kind, fn, far_ref=True)


KL_CAP = "caps each token's k3 term at 10 (ref - logp clamped to +-20; gradient 0 beyond)"


def group_advantage(kind: str = "grpo", unbiased: bool = PARTS["grpo_advantage"]["unbiased"],
                    eps: float = PARTS["grpo_advantage"]["eps"]) -> Convention:
    """GRPO (R - mean)/(std + eps) (DeepSeekMath Sec. 4.1.2), Dr.GRPO R - mean (2503.20783 Eq. 3) or RLOO
    R - mean of the others (2402.14740 Sec. 3) per group, broadcast over each row's unmasked tokens; a lone
    response (G = 1) has R - mean = 0."""
    def fn(b):
        r = t64(b.rewards)
        g = b.group_size
        if g == 1:
            adv = torch.zeros_like(r)
        else:
            adv = gpu.group_advantages(r, g, kind=kind, unbiased=unbiased, eps=eps)
        return adv.numpy()[:, None] * b.mask, None
    name = f"{kind}_advantage"
    return Convention(f"{name}[unbiased={unbiased}]" if kind == "grpo" else name, fn)


def gdpo_rewards(b) -> np.ndarray:
    """The [B, 2] rewards of a GDPO batch: each row's rounded advantage, and its ``reward_2`` extra."""
    return np.stack([b.rewards, b.extra["reward_2"][:, 0] if b.mask.size else np.zeros(len(b.mask))], 1)


def gdpo_advantage(weights=(1.0, 1.0), whiten: bool = False) -> Convention:
    """GDPO (2601.05242) advantages of a batch's two rewards (``gdpo_rewards``), each standardised in its group, the
    weighted sum standardised over the batch's responses, broadcast over each row's unmasked tokens. ``whiten``
    standardises the weighted sum over the batch's unmasked tokens instead (unbiased variance, 1e-8 under the
    root), a variant."""
    def fn(b):
        r = t64(gdpo_rewards(b))
        if not whiten:
            return gpu.gdpo_advantages(r, b.group_size, weights=list(weights)).numpy()[:, None] * b.mask, None
        total = sum(w * gpu.group_advantages(r[:, n], b.group_size, kind="grpo") for n, w in enumerate(weights))
        on = b.mask > 0
        values = np.broadcast_to(total.numpy()[:, None], b.mask.shape)
        tokens = values[on]
        return np.where(on, (values - tokens.mean()) / np.sqrt(tokens.var(ddof=1) + 1e-8), 0.0), None
    text = "gdpo_advantage" + (f"[weights={list(weights)}]" if tuple(weights) != (1.0, 1.0) else "")
    if whiten:
        return Convention(text + ", the weighted sum whitened over the batch's tokens (unbiased variance)", fn,
                          named=False)
    return Convention(text, fn)


def reinforce_pp(gamma: float = PARTS["reinforce_pp"]["gamma"]) -> Convention:
    """REINFORCE++ (2501.03262 Sec. 3) advantages without a KL term: each row's outcome reward at its last unmasked
    token, discounted returns, whitened over the batch's unmasked tokens."""
    def fn(b):
        return gpu.reinforce_pp_advantages(t64(b.rewards), t64(b.mask), gamma=gamma).numpy() * b.mask, None
    return Convention(f"reinforce_pp[gamma={gamma:g}]", fn)


def sequence_sum_ratio(eps_low: float, eps_high: float) -> Convention:
    """A variant: PPO-clip (1707.06347 Eq. 7) on the sequence ratio exp(sum_t log r_t), averaged over every row,
    empty ones included; GSPO (2507.18071 Eq. 7) divides the summed log-ratio by |o_i| instead."""
    def fn(b):
        logp = t64(b.logp, grad=True)
        r = torch.exp(((logp - t64(b.old_logp)) * t64(b.mask)).sum(1))
        adv = t64(b.adv[:, 0] if b.adv.size else np.zeros(len(b.mask)))
        loss = -torch.min(r * adv, torch.clamp(r, 1 - eps_low, 1 + eps_high) * adv).mean()
        loss.backward()
        return float(loss.detach()), logp.grad.numpy()
    return Convention(f"PPO-clip on exp(sum_t log r_t) [eps {eps_low:g}/{eps_high:g}], mean over all rows", fn,
                      named=False)


def gae(part: str, gamma: float, lam: float, whiten: bool = False) -> Convention:
    """GAE (1506.02438 Eq. 16) advantages or returns on unmasked tokens; rewards are the batch's adv, values its
    ref_logp. ``whiten`` standardises the advantages over the batch's unmasked tokens (a variant)."""
    def fn(b):
        adv, ret = gpu.gae(t64(b.adv), t64(b.ref_logp), t64(b.mask), gamma=gamma, lam=lam)
        out = (adv if part == "advantages" else ret).numpy() * b.mask
        if whiten:
            on = b.mask > 0
            vals = out[on]
            out = np.where(on, (out - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8), 0.0)
        return out, None
    suffix = ", whitened over the batch's tokens (unbiased variance)" if whiten else ""
    return Convention(f"gae[{part}, gamma={gamma:g}, lam={lam:g}]{suffix}", fn, named=not whiten)


def value_loss(clip: float, agg: str = "token_mean") -> Convention:
    """Clipped critic loss 0.5 * max((v - R)^2, (clip(v, v_old +- d) - R)^2); v = logp, v_old = old_logp,
    R = ref_logp of the batch; gradient in v."""
    def fn(b):
        v = t64(b.logp, grad=True)
        loss, _ = gpu.value_loss(v, t64(b.old_logp), t64(b.ref_logp), t64(b.mask), clip=clip, agg=agg,
                                 group_size=b.group_size, max_len=b.max_len)
        loss.backward()
        return float(loss.detach()), v.grad.numpy()
    return Convention(f"value_loss[clip={clip:g}, agg={agg}]", fn)


def _pair_logps(b):
    """Sequence log-probs (sums over each row's unmasked tokens) of the policy, a leaf in ``logp``, and of the
    reference (``ref_logp``); rows 2k and 2k + 1 are pair k's chosen and rejected responses."""
    if len(b.mask) % 2:
        raise ValueError(f"mask: expected an even number of rows (chosen, rejected pairs), got {len(b.mask)}")
    logp, mask = t64(b.logp, grad=True), t64(b.mask)
    seq, ref = (logp * mask).sum(1), (t64(b.ref_logp) * mask).sum(1)
    return logp, seq[0::2], seq[1::2], ref[0::2], ref[1::2]


def _pair_value(loss_fn, b):
    logp, *pairs = _pair_logps(b)
    loss = loss_fn(*pairs)
    loss.backward()
    return float(loss.detach()), logp.grad.numpy()


def dpo(beta: float, smoothing: float = 0.0) -> Convention:
    """DPO (2305.18290 Eq. 7) of the pairs' sequence log-probs; with ``smoothing`` eps, conservative DPO (Mitchell
    2023, cDPO note Eq. 3): (1 - eps) times the loss of the pairs plus eps times that of the swapped pairs, a
    variant that the reference does not name."""
    def loss(lw, ll, rw, rl):
        kept = gpu.dpo_loss(lw, ll, rw, rl, beta=beta)[0]
        if not smoothing:
            return kept
        return (1 - smoothing) * kept + smoothing * gpu.dpo_loss(ll, lw, rl, rw, beta=beta)[0]

    fn = lambda b: _pair_value(loss, b)  # noqa: E731
    if not smoothing:
        return Convention(label("dpo", {"beta": beta}), fn, far_ref=True)
    return Convention(f"cdpo[beta={beta:g}, label_smoothing={smoothing:g}]", fn, named=False, far_ref=True)


def ipo(tau: float) -> Convention:
    """IPO (Azar et al. 2310.12036 Eq. 17): mean of (h - 1 / (2 tau))^2 with h the pair's log-ratio margin, a
    variant that the reference does not name."""
    def loss(lw, ll, rw, rl):
        return (((lw - rw) - (ll - rl) - 1 / (2 * tau)) ** 2).mean()
    return Convention(f"ipo[tau={tau:g}]", lambda b: _pair_value(loss, b), named=False, far_ref=True)


def exact_dpo(beta: float):
    """The exact (sympy) reference DPO loss of a minimal input."""
    def fn(b):
        mask = np.asarray(b.mask, dtype=float)
        seq, ref = (np.asarray(b.logp) * mask).sum(1), (np.asarray(b.ref_logp) * mask).sum(1)
        return float(spec.dpo_loss(seq[0::2], seq[1::2], ref[0::2], ref[1::2], beta=beta)[0])
    return fn
