"""cliplab's losses and DCPO's SAS in verl's registries. Importing this module registers them, so a verl run selects
one with a config line::

    actor_rollout_ref.actor.policy_loss.loss_mode=cliplab_dcpo   algorithm.adv_estimator=cliplab_sas

Load it in every verl process through verl's plugin entry point (group ``verl.plugins``) or
``VERL_USE_EXTERNAL_MODULES=gpu.integrations.verl_plugin``. Clip widths come from verl's ``clip_ratio_low`` /
``clip_ratio_high`` and SAPO's temperatures from ``tau_pos`` / ``tau_neg``; G from ``rollout_n``; Dr.GRPO's L from
``loss_scale_factor`` (else the padded response width); the aggregation is the paper's, or the one named:
``cliplab_dapo_token_mean``, ``cliplab_dcpo_seq_mean_token_sum``, ... Besides verl's ``actor/pg_clipfrac`` (cliplab's
clip_frac) each loss logs ``actor/cliplab_rur``, the share of responses with a non-zero advantage.

SAS keeps each prompt's history under a stable key (the dataset's ``extra_info.index``, else a hash of the prompt's
token ids), not verl's ``uid``, which is new at every step; the history is saved in each ``global_step_N`` checkpoint
folder and restored on resume. ``algorithm.adv_estimator=<estimator>_overlong_filter`` (e.g. ``grpo_overlong_filter``)
masks truncated responses out of the loss first (DAPO 2503.14476 Sec. 3.4). Both act in verl's
``RayPPOTrainer.compute_advantage`` step, whose batch holds the prompts and response masks: run them with
``trainer.use_v1=False`` (verl 0.9.1's V1 trainer gives the advantage step only uids and rewards)."""
from __future__ import annotations

import functools
import hashlib
import os

import torch

from spec.records import read_json, write_json
from spec.registry import AGG_MODES, DIVERGENCE_CLIPS, GROUP_AGG_MODES, POLICY_ALGORITHMS, get_algorithm

from ..advantages import SmoothAdvantage
from ..losses import policy_loss

#: verl loss name -> (cliplab algorithm, aggregation mode or None for the paper's): ``cliplab_dapo`` (Eq. 8,
#: group_token_mean) and ``cliplab_dapo_token_mean`` etc. verl's own ``loss_agg_mode`` is not read: its default,
#: token-mean, is not what most of these papers aggregate with.
LOSSES = {f"cliplab_{name}": (name, None) for name in POLICY_ALGORITHMS}
LOSSES.update({f"cliplab_{name}_{agg}": (name, agg) for name in POLICY_ALGORITHMS for agg in AGG_MODES})
SAS_NAME = "cliplab_sas"
OVERLONG_FILTER = "_overlong_filter"
#: The SAS history's file in each verl checkpoint folder (global_step_N/).
SAS_STATE = "cliplab_sas.json"


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
    if alg.clip in ("fixed", "dynamic", "log", "truncated", *DIVERGENCE_CLIPS):  # DPPO's thresholds: verl's too
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
    """DCPO SAS (2509.02333 Eq. 9-12, 29-30) as a verl advantage estimator: rows are grouped by ``index`` (verl's
    uid) and each group's history is kept under its prompt key, given as ``prompt_keys`` or, inside
    ``compute_advantage``, read from the batch (``prompt_keys``)."""

    def __init__(self):
        self.smoother = SmoothAdvantage()
        self.batch_keys = None  # the prompt keys of the batch compute_advantage is working on

    def __call__(self, token_level_rewards, response_mask, index, config=None, prompt_keys=None, **kwargs):
        keys = self.batch_keys if prompt_keys is None else prompt_keys
        if keys is None:
            raise ValueError(f"{SAS_NAME}: no stable prompt key for this batch (verl's uid is new at every step); "
                             "run verl's RayPPOTrainer (trainer.use_v1=False) with this plug-in loaded, or pass "
                             "prompt_keys")
        if len(keys) != len(index):
            raise ValueError(f"prompt_keys: expected one per row ({len(index)}), got {len(keys)}")
        scores = token_level_rewards.sum(-1)
        adv = torch.zeros_like(scores)
        groups: dict = {}
        for row, uid in enumerate(index):
            groups.setdefault(uid, []).append(row)
        with torch.no_grad():
            for uid, rows in groups.items():
                key = keys[rows[0]]
                if any(keys[r] != key for r in rows):
                    raise ValueError(f"prompt_keys: the responses of uid {uid} have different prompt keys")
                adv[rows] = self.smoother([key], scores[rows], len(rows)).to(adv.dtype)
        adv = adv[:, None] * response_mask
        return adv, adv


def _prompt_hash(ids: torch.Tensor) -> str:
    return "prompt:" + hashlib.sha256(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()[:32]


def prompt_keys(data) -> list[str]:
    """Each row's stable prompt key: ``index:<i>`` where its ``extra_info`` carries the dataset's index (verl's RL
    dataset reads ``extra_info.index``), else ``prompt:<sha256 of the prompt's token ids>`` (padding left out)."""
    if "prompts" not in data.batch.keys():
        raise ValueError(f"{SAS_NAME}: the batch has no prompts (verl's V1 trainer gives its advantage step only "
                         "uids and rewards); set trainer.use_v1=False")
    prompts = data.batch["prompts"]
    on = data.batch["attention_mask"][:, :prompts.shape[1]].bool()
    hashes = [_prompt_hash(ids[m]) for ids, m in zip(prompts, on)]
    extra = data.non_tensor_batch.get("extra_info")
    keys = [f"index:{e['index']}" if isinstance(e, dict) and "index" in e else h
            for e, h in zip(extra if extra is not None else [None] * len(hashes), hashes)]
    seen: dict = {}
    for key, h in zip(keys, hashes):
        if seen.setdefault(key, h) != h:
            raise ValueError(f"extra_info.index: {key[6:]} names two different prompts in one batch; give each "
                             "prompt its own index, or none (the prompt's token ids then key SAS's history)")
    return keys


def mask_truncated(data) -> int:
    """DAPO's overlong filtering (2503.14476 Sec. 3.4): the responses that fill the whole response width (verl's
    ``response_length/clip_ratio`` convention) leave the loss: their response mask is zeroed. Returns how many."""
    if "responses" not in data.batch.keys():
        raise ValueError(f"algorithm.adv_estimator: {OVERLONG_FILTER[1:]} needs the batch's responses and a response "
                         "mask that reaches the actor update (verl's V1 trainer gives neither); set "
                         "trainer.use_v1=False")
    mask = data.batch["response_mask"]
    truncated = mask.sum(-1) >= data.batch["responses"].shape[-1]
    data.batch["response_mask"] = mask * ~truncated[:, None]
    return int(truncated.sum())


def _with_prompt_keys(compute_advantage):
    """verl's compute_advantage, which also serves cliplab's SAS (prompt keys from the batch) and
    ``<estimator>_overlong_filter`` (truncated responses masked first)."""
    @functools.wraps(compute_advantage)
    def wrapped(data, adv_estimator, *args, **kwargs):
        name = str(getattr(adv_estimator, "value", adv_estimator))
        if name.endswith(OVERLONG_FILTER):
            mask_truncated(data)
            name = name[:-len(OVERLONG_FILTER)]
        if name != SAS_NAME:
            return compute_advantage(data, name, *args, **kwargs)
        _SAS.batch_keys = prompt_keys(data)
        try:
            return compute_advantage(data, name, *args, **kwargs)
        finally:
            _SAS.batch_keys = None
    wrapped.cliplab = True
    return wrapped


def _uses_sas(config) -> bool:
    return str(config.algorithm.adv_estimator).removesuffix(OVERLONG_FILTER) == SAS_NAME


def _saving_sas(save_checkpoint):
    """RayPPOTrainer._save_checkpoint that first writes SAS's history into the step's folder (before verl marks the
    checkpoint as the latest)."""
    @functools.wraps(save_checkpoint)
    def wrapped(self):
        if _uses_sas(self.config):
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(folder, exist_ok=True)
            write_json(os.path.join(folder, SAS_STATE), _SAS.smoother.state_dict())
        return save_checkpoint(self)
    wrapped.cliplab = True
    return wrapped


def _loading_sas(load_checkpoint):
    """RayPPOTrainer._load_checkpoint that restores SAS's history from the folder verl resumes from (a fresh run
    starts with none); a checkpoint without it is refused rather than resumed with SAS's history lost."""
    @functools.wraps(load_checkpoint)
    def wrapped(self):
        out = load_checkpoint(self)
        if _uses_sas(self.config):
            _SAS.smoother = SmoothAdvantage()
            if self.global_steps > 0:
                trainer = self.config.trainer
                folder = (trainer.resume_from_path if trainer.resume_mode == "resume_path" else
                          os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}"))
                path = os.path.join(folder, SAS_STATE)
                if not os.path.exists(path):
                    raise ValueError(f"{path}: missing; this checkpoint has no SAS history, so {SAS_NAME} cannot "
                                     "continue it (resume from a checkpoint written with this plug-in, or start anew)")
                _SAS.smoother.load_state_dict(read_json(path))
        return out
    wrapped.cliplab = True
    return wrapped


def _patch_trainer() -> bool:
    """Route verl's RayPPOTrainer through the wrappers above; False where verl's trainer does not import (an
    environment with verl's losses only)."""
    try:
        from verl.trainer.ppo import ray_trainer
    except ImportError:
        return False
    if not getattr(ray_trainer.compute_advantage, "cliplab", False):
        ray_trainer.compute_advantage = _with_prompt_keys(ray_trainer.compute_advantage)
    cls = ray_trainer.RayPPOTrainer
    for name, wrap in (("_save_checkpoint", _saving_sas), ("_load_checkpoint", _loading_sas)):
        if not getattr(getattr(cls, name), "cliplab", False):
            setattr(cls, name, wrap(getattr(cls, name)))
    return True


def _unreachable(name: str):
    def estimator(*args, **kwargs):
        raise ValueError(f"algorithm.adv_estimator={name}: only verl's RayPPOTrainer with this plug-in loaded "
                         "masks truncated responses (set trainer.use_v1=False)")
    return estimator


_SAS = SasEstimator()
_LOSS_FNS = {verl_name: make_policy_loss(name, agg) for verl_name, (name, agg) in LOSSES.items()}
#: Estimators with DAPO's overlong filter: names verl's config accepts; the work is done in compute_advantage.
FILTERED = {f"{base}{OVERLONG_FILTER}": _unreachable(f"{base}{OVERLONG_FILTER}")
            for base in ("grpo", SAS_NAME)}


def register() -> list[str]:
    """Register every cliplab loss and SAS in verl's registries and wrap verl's RayPPOTrainer (idempotent); returns
    the registered names."""
    from verl.trainer.ppo import core_algos
    for verl_name, fn in _LOSS_FNS.items():
        core_algos.register_policy_loss(verl_name)(fn)
    for name, fn in ((SAS_NAME, _SAS), *FILTERED.items()):
        if core_algos.ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            core_algos.register_adv_est(name)(fn)
    _patch_trainer()
    return [*_LOSS_FNS, SAS_NAME, *FILTERED]


register()
