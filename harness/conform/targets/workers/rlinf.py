"""Worker of the ``rlinf`` conformance target (run by .venv-targets/rlinf/bin/python): RLinf 0.3.0's reasoning-task
policy loss (``rlinf.algorithms.registry.policy_loss`` -> ``losses.compute_ppo_actor_loss``), advantage estimators
(``registry.calculate_adv_and_returns``) and KL penalty (``algorithms.utils.kl_penalty``), called as its FSDP actor
worker calls them (rlinf/workers/actor/fsdp_actor_worker.py). Only torch is installed: the package ``__init__``
files on the way (which import omegaconf, ray and RLinf's scheduler) are bypassed by bare package modules, and
``rlinf.scheduler`` is a stand-in holding the ``Worker`` name that ``rlinf.utils.utils`` imports (the functions
driven here never use it)."""
from __future__ import annotations

import importlib
import sys
import types
from importlib.metadata import version

import numpy as np
import torch

from _serve import bare_packages, kl_term, leave_own_folder, serve

leave_own_folder(__file__)


def _bare_packages():
    bare_packages("rlinf", ("rlinf", "rlinf.algorithms", "rlinf.utils"))
    scheduler = types.ModuleType("rlinf.scheduler")
    scheduler.Worker = type("Worker", (), {})
    sys.modules["rlinf.scheduler"] = scheduler


_bare_packages()
REGISTRY = importlib.import_module("rlinf.algorithms.registry")
for _name in ("losses", "advantages"):  # each registers its functions in REGISTRY on import
    importlib.import_module(f"rlinf.algorithms.{_name}")
ALGO_UTILS = importlib.import_module("rlinf.algorithms.utils")
UTILS = importlib.import_module("rlinf.utils.utils")


def t32(x):
    """RLinf's losses assert float32 log-probs and advantages."""
    return torch.as_tensor(np.asarray(x, dtype=np.float64)).float()


def policy(kw, logp, old_logp, adv, mask):
    """``policy_loss(task_type="reasoning", loss_type=..., loss_agg_func=get_loss_agg_func(kw["agg"]), ...)`` with
    the actor's keywords: clip_ratio_low/high (default ratio_clip_eps 0.2), clip_ratio_c (the actor's default 3.0),
    clip_log_ratio_min/max (default None) and fast_path_zero_loss_mask=True; float32, a boolean loss mask."""
    leaf = t32(logp).requires_grad_(True)
    loss, _ = REGISTRY.policy_loss(
        task_type="reasoning", loss_type=kw.get("loss_type", "actor"),
        loss_agg_func=UTILS.get_loss_agg_func(kw.get("agg", "token-mean")), logprobs=leaf, old_logprobs=t32(old_logp),
        advantages=t32(adv), clip_ratio_c=kw.get("clip_ratio_c", 3.0), clip_ratio_low=kw.get("clip_ratio_low", 0.2),
        clip_ratio_high=kw.get("clip_ratio_high", 0.2), loss_mask=torch.as_tensor(np.asarray(mask)) > 0,
        clip_log_ratio_min=kw.get("clip_log_ratio_min"), clip_log_ratio_max=kw.get("clip_log_ratio_max"),
        fast_path_zero_loss_mask=True)
    if loss.requires_grad:
        loss.backward()
    return {"loss": loss.detach(), "grad": leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)}


def advantage(kw, rewards, mask):
    """``calculate_adv_and_returns(task_type="reasoning", adv_type=kw["estimator"], rewards [B], loss_mask [B, T],
    group_size)`` in ``kw["dtype"]``, with reinpp's KL coefficient 0. Reply {"advantages": [B, T]}."""
    dtype = getattr(torch, kw["dtype"])
    adv, _ = REGISTRY.calculate_adv_and_returns(
        task_type="reasoning", adv_type=kw["estimator"], rewards=torch.as_tensor(np.asarray(rewards)).to(dtype),
        loss_mask=torch.as_tensor(np.asarray(mask)) > 0, group_size=kw["group_size"], kl_beta=0.0,
        use_reinpp_baseline=kw.get("use_reinpp_baseline", False))
    return {"advantages": adv}


def kl(kw, logp, ref_logp, mask, old_logp=None):
    """``kl_penalty(ref_logprobs, logprobs, kl_penalty_type)``: the arguments in the order the actor's KL loss
    passes them (fsdp_actor_worker.py), the reverse of the signature's ``kl_penalty(logprob, ref_logprob, ...)``."""
    return kl_term(lambda lp, ref, _: ALGO_UTILS.kl_penalty(ref, lp, kw["kl_estimator"]), kw, logp, ref_logp, mask)


serve({"policy": policy, "advantage": advantage, "kl": kl},
      lambda: {"rlinf": version("rlinf"), "torch": torch.__version__.split("+")[0]})
