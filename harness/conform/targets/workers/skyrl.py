"""Worker of the ``skyrl`` conformance target (run by .venv-targets/skyrl/bin/python): SkyRL 0.4.0's
``skyrl.backends.skyrl_train.utils.ppo_utils`` policy losses and advantage estimators, called as its trainer and
worker call them. The package ``__init__`` files of ``skyrl.backends`` import the JAX/Tinker backends, which do
not import on Python 3.11, so the packages on the way to ``ppo_utils`` are registered bare; Ray is a stand-in
that says no cluster is running (ppo_utils then keeps its registries in-process)."""
from __future__ import annotations

import sys
import types

import numpy as np
import torch

from _serve import bare_packages, kl_term, leave_own_folder, serve

leave_own_folder(__file__)


def _bare_packages():
    """``skyrl.backends`` down to ``...utils`` as empty packages (with ``__path__``), and a Ray without a cluster."""
    bare_packages("skyrl", ("skyrl.backends", "skyrl.backends.skyrl_train", "skyrl.backends.skyrl_train.utils"))
    ray = types.ModuleType("ray")
    ray.remote = lambda cls: cls
    ray.is_initialized = lambda: False
    sys.modules["ray"] = ray


_bare_packages()
import skyrl  # noqa: E402
from skyrl.backends.skyrl_train.utils import ppo_utils  # noqa: E402
from skyrl.train.config.config import AlgorithmConfig, build_nested_dataclass  # noqa: E402


def t64(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def policy(kw, logp, old_logp, adv, mask, rollout_logp=None):
    """``PolicyLossRegistry.get(kw["loss"])`` on advantages pre-scaled by the trainer's loss reduction
    (``apply_loss_reduction_to_advantages_minibatch``, one mini-batch, micro-batch = whole batch); kw["config"]
    holds AlgorithmConfig fields (nested ones as dicts); kw["prompt_size"] rows per prompt for prompt_mean."""
    config = build_nested_dataclass(AlgorithmConfig, {"policy_loss_type": kw["loss"],
                                                      "loss_reduction": kw["reduction"], **kw.get("config", {})})
    m = t64(mask)
    size = kw.get("prompt_size")
    bounds = None if size is None else [(s, s + size) for s in range(0, len(m), size)]
    scaled = ppo_utils.apply_loss_reduction_to_advantages_minibatch(
        t64(adv), m, kw["reduction"], micro_batch_size=len(m), max_seq_len=kw.get("max_seq_len"),
        prompt_boundaries=bounds)
    lp = t64(logp).requires_grad_(True)
    fn = ppo_utils.PolicyLossRegistry.get(kw["loss"])
    loss, _ = fn(lp, t64(old_logp), scaled, config, m, None if rollout_logp is None else t64(rollout_logp))
    loss.backward()
    return {"loss": loss.detach(), "grad": lp.grad if lp.grad is not None else torch.zeros_like(lp)}


def advantage(kw, rewards, mask, values=None):
    """``AdvantageEstimatorRegistry.get(kw["estimator"])`` on token rewards [B, T] (``index``: kw["group_size"]
    contiguous rows per prompt); returns advantages and returns."""
    g = kw.get("group_size", 1)
    index = np.array([f"p{r // g}" for r in range(len(rewards))], dtype=object)
    fn = ppo_utils.AdvantageEstimatorRegistry.get(kw["estimator"])
    adv, ret = fn(token_level_rewards=t64(rewards), response_mask=t64(mask), index=index,
                  values=None if values is None else t64(values), gamma=kw.get("gamma", 1.0),
                  lambd=kw.get("lambd", 1.0), grpo_norm_by_std=kw.get("grpo_norm_by_std", True))
    return {"advantages": adv, "returns": ret}


def kl(kw, logp, ref_logp, mask, old_logp=None):
    """``compute_approx_kl(log_probs, log_probs_base, loss_mask, kl_estimator_type)`` as the worker calls it for
    its KL loss (workers/worker.py), in ``kw["dtype"]``."""
    return kl_term(lambda lp, ref, _: ppo_utils.compute_approx_kl(
        lp, ref, loss_mask=torch.as_tensor(np.asarray(mask)).to(lp.dtype), kl_estimator_type=kw["kl_estimator"]),
        kw, logp, ref_logp, mask)


serve({"policy": policy, "advantage": advantage, "kl": kl},
      lambda: {"skyrl": skyrl.__version__, "torch": torch.__version__.split("+")[0]})
