"""cliplab's losses and DCPO's SAS in verl's registries. Importing this module registers them, so a verl run selects
one with a config line::

    actor_rollout_ref.actor.policy_loss.loss_mode=cliplab_dcpo   algorithm.adv_estimator=cliplab_sas

Load it in every verl process through verl's plugin entry point (group ``verl.plugins``) or
``VERL_USE_EXTERNAL_MODULES=gpu.integrations.verl_plugin``. Clip widths come from verl's ``clip_ratio_low`` /
``clip_ratio_high`` and SAPO's temperatures from ``tau_pos`` / ``tau_neg``; G from ``rollout_n``; Dr.GRPO's L from
``loss_scale_factor`` (else the padded response width); the aggregation is the paper's, or the one named:
``cliplab_dapo_token_mean``, ``cliplab_dcpo_seq_mean_token_sum``, ... Besides verl's ``actor/pg_clipfrac`` (cliplab's
clip_frac) each loss logs ``actor/cliplab_rur``, the share of responses with a non-zero advantage."""
from __future__ import annotations

import torch

from spec.registry import AGG_MODES, GROUP_AGG_MODES, POLICY_ALGORITHMS, get_algorithm

from ..advantages import SmoothAdvantage
from ..losses import policy_loss

#: verl loss name -> (cliplab algorithm, aggregation mode or None for the paper's): ``cliplab_dapo`` (Eq. 8,
#: group_token_mean) and ``cliplab_dapo_token_mean`` etc. verl's own ``loss_agg_mode`` is not read: its default,
#: token-mean, is not what most of these papers aggregate with.
LOSSES = {f"cliplab_{name}": (name, None) for name in POLICY_ALGORITHMS}
LOSSES.update({f"cliplab_{name}_{agg}": (name, agg) for name in POLICY_ALGORITHMS for agg in AGG_MODES})
SAS_NAME = "cliplab_sas"


def _global_scale(mask, agg, group_size, info) -> float:
    """Factor that turns a micro-batch-normalised loss into verl's global-batch normalisation (verl's agg_loss:
    divide by the global token or sequence count, times dp_size), so that gradients add up across micro-batches
    and ranks. 1 when ``info`` is empty (one rank, one micro-batch)."""
    dp = float(info.get("dp_size") or 1)
    tokens, seqs = info.get("batch_num_tokens"), info.get("global_batch_size")
    if agg == "token_mean" and tokens is not None:
        return float(mask.sum().clamp(min=1.0)) / float(tokens) * dp
    if agg in GROUP_AGG_MODES and seqs is not None:
        local_groups = float((mask.reshape(-1, group_size * mask.shape[1]).sum(1) > 0).sum().clamp(min=1))
        return local_groups * group_size / float(seqs) * dp
    if agg not in GROUP_AGG_MODES and agg != "token_mean" and seqs is not None:
        return float((mask.sum(1) > 0).sum().clamp(min=1)) / float(seqs) * dp
    return dp


def hyperparameters(name: str, agg: str | None, config, width: int) -> dict:
    """cliplab hyper-parameters of ``name`` from a verl ActorConfig."""
    alg = get_algorithm(name)
    hp = {"agg": agg or alg.defaults["agg"], "beta": 0.0}  # verl adds its KL loss itself (use_kl_loss)
    if alg.clip in ("fixed", "dynamic", "log", "truncated"):
        hp["eps_low"] = float(config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio)
        hp["eps_high"] = float(config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio)
    if alg.select is not None:  # Clip-Cov and KL-Cov read verl's policy_loss section
        pl = config.policy_loss
        hp.update({"clip_cov_ratio": float(pl.clip_cov_ratio), "clip_cov_lb": float(pl.clip_cov_lb),
                   "clip_cov_ub": float(pl.clip_cov_ub)} if alg.select == "clip_cov" else
                  {"kl_cov_ratio": float(pl.kl_cov_ratio), "kl_cov_coef": float(pl.ppo_kl_coef)})
    if alg.clip == "soft":
        hp["tau_pos"], hp["tau_neg"] = float(config.tau_pos), float(config.tau_neg)
    if hp["agg"] == "seq_mean_token_sum_norm":
        hp["max_len"] = config.get("loss_scale_factor") or width
    return hp


def make_policy_loss(name: str, agg: str | None = None):
    """A verl policy-loss function computing cliplab's ``name`` (gpu.policy_loss) with verl's signature."""
    get_algorithm(name)

    def loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                rollout_is_weights=None):
        if config is None:
            raise ValueError(f"config: cliplab_{name} needs verl's ActorConfig (clip ratios, rollout_n)")
        if rollout_is_weights is not None:
            raise ValueError(f"rollout_is_weights: cliplab_{name} does not apply rollout correction weights; "
                             "turn policy_loss.rollout_correction off")
        hp = hyperparameters(name, agg, config, response_mask.shape[-1])
        group_size = int(config.get("rollout_n") or 1)
        needs_groups = hp["agg"] in GROUP_AGG_MODES
        if needs_groups and response_mask.shape[0] % group_size:
            raise ValueError(f"rollout_n: {hp['agg']} needs whole groups of {group_size} responses in each "
                             f"micro-batch, got {response_mask.shape[0]} rows")
        mask = response_mask.to(log_prob.dtype)
        loss, stats = policy_loss(name, log_prob, old_log_prob, advantages, mask,
                                  group_size=group_size if needs_groups else None, **hp)
        loss = loss * _global_scale(mask, hp["agg"], group_size, dict(config.get("global_batch_info") or {}))
        on = mask > 0
        ppo_kl = float((old_log_prob - log_prob).detach()[on].mean()) if on.any() else 0.0
        rows = on.any(-1)  # RUR: share of (non-empty) responses with a non-zero advantage (DCPO Table 2)
        rur = float(((advantages != 0) & on).any(-1)[rows].float().mean()) if rows.any() else 0.0
        return loss, {"actor/pg_clipfrac": stats["clip_frac"], "actor/ppo_kl": ppo_kl,
                      "actor/pg_clipfrac_lower": 0.0, "actor/cliplab_rur": rur}
    loss_fn.__name__ = f"cliplab_{name}" + (f"_{agg}" if agg else "")
    loss_fn.__doc__ = f"cliplab {name} ({get_algorithm(name).source}), aggregation {agg or 'as in the paper'}."
    return loss_fn


class SasEstimator:
    """DCPO SAS (2509.02333 Eq. 9-12, 29-30) as a verl advantage estimator; history is kept per ``index`` value,
    so it spans visits only where the index names the prompt stably (verl's default uid is new at every step)."""

    def __init__(self):
        self.smoother = SmoothAdvantage()

    def __call__(self, token_level_rewards, response_mask, index, config=None, **kwargs):
        scores = token_level_rewards.sum(-1)
        adv = torch.zeros_like(scores)
        order: dict = {}
        for row, key in enumerate(index):
            order.setdefault(key, []).append(row)
        with torch.no_grad():
            for key, rows in order.items():
                adv[rows] = self.smoother([key], scores[rows], len(rows)).to(adv.dtype)
        adv = adv[:, None] * response_mask
        return adv, adv


_SAS = SasEstimator()
_LOSS_FNS = {verl_name: make_policy_loss(name, agg) for verl_name, (name, agg) in LOSSES.items()}


def register() -> list[str]:
    """Register every cliplab loss and SAS in verl's registries (idempotent); returns the registered names."""
    from verl.trainer.ppo import core_algos
    for verl_name, fn in _LOSS_FNS.items():
        core_algos.register_policy_loss(verl_name)(fn)
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(SAS_NAME) is not _SAS:
        core_algos.register_adv_est(SAS_NAME)(_SAS)
    return [*_LOSS_FNS, SAS_NAME]


register()
