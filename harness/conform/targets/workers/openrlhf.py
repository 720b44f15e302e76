"""OpenRLHF's losses (``openrlhf.models.loss``: PolicyLoss, DPOLoss), its KL estimators
(``openrlhf.models.utils.compute_approx_kl``), its trainer's advantage estimators
(``openrlhf.trainer.ppo_utils.experience_maker``) and loss normalisers (``openrlhf.utils.loss_utils``), served to
cliplab's conformance target; float64 on the CPU."""
from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import sys
import types

import numpy as np
import torch

from _serve import kl_term, serve


def _import_openrlhf():
    """The two modules without running openrlhf's package ``__init__`` files (they import flash_attn, transformers
    and deepspeed): bare package modules in their place, and an empty ``deepspeed`` for ``models/utils.py``'s
    top-level import (only its ZeRO-3 helpers use it). ``torch.compile`` is the identity during the import: its
    one use there, ``compute_entropy``, is not called by the losses, and compiling costs seconds at start. The
    package is found through its installed files, since this script's own name shadows it on sys.path."""
    root = str(importlib.metadata.distribution("openrlhf").locate_file("openrlhf"))
    for name in ("openrlhf", "openrlhf.models", "openrlhf.utils"):
        module = types.ModuleType(name)
        module.__path__ = ["/".join([root, *name.split(".")[1:]])]
        sys.modules[name] = module
    sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    compile_, torch.compile = torch.compile, lambda fn: fn
    try:
        return (importlib.import_module("openrlhf.models.loss"), importlib.import_module("openrlhf.utils.loss_utils"),
                importlib.import_module("openrlhf.models.utils"))
    finally:
        torch.compile = compile_


LOSS, NORM, UTILS = _import_openrlhf()


def _import_experience_maker():
    """``openrlhf.trainer.ppo_utils.experience_maker`` (the trainer's advantage estimators) with stand-ins for what
    its imports reach but the estimators never use: ``ray`` and ``openrlhf.trainer.ray.launcher`` (the actor
    groups), and ``transformers`` (``utils/utils.py`` imports AutoTokenizer for a tokenizer helper); the trainer
    packages are bare, as in ``_import_openrlhf``."""
    root = str(importlib.metadata.distribution("openrlhf").locate_file("openrlhf"))
    for name in ("openrlhf.trainer", "openrlhf.trainer.ppo_utils", "openrlhf.trainer.ray"):
        module = types.ModuleType(name)
        module.__path__ = ["/".join([root, *name.split(".")[1:]])]
        sys.modules[name] = module
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = type("RayActorGroup", (), {})
    transformers = types.ModuleType("transformers")
    transformers.AutoTokenizer = type("AutoTokenizer", (), {})
    for name, module in (("ray", types.ModuleType("ray")), ("openrlhf.trainer.ray.launcher", launcher),
                         ("transformers", transformers)):
        sys.modules.setdefault(name, module)
    return importlib.import_module("openrlhf.trainer.ppo_utils.experience_maker")


def _t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def _tensors(logp, old_logp, adv, mask, rollout_logp=None):
    """Float64 tensors, the log-probs a leaf; the mask as the trainer's bool ``Experience.action_mask``."""
    return (_t(logp).requires_grad_(True), _t(old_logp), _t(adv), _t(mask) > 0,
            None if rollout_logp is None else _t(rollout_logp))


def _grad(leaf):
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)


def policy(kw, logp, old_logp, adv, mask, rollout_logp=None):
    """``PolicyLoss(**kw)`` on the whole batch as one micro-batch of one rank: the normalisers are the trainer's
    ``get_loss_batch_info`` without a process group (dp_size 1, this batch's token count and non-empty rows)."""
    leaf, old, a, m, roll = _tensors(logp, old_logp, adv, mask, rollout_logp)
    loss = LOSS.PolicyLoss(**kw)(leaf, old, a, m, roll, **NORM.get_loss_batch_info(None, m))[0]
    loss.backward()
    return {"loss": loss, "grad": _grad(leaf)}


def policy_step(kw, logp, old_logp, adv, mask, rollout_logp=None):
    """One optimizer step of OpenRLHF's PPO actor on the whole batch, ``dp_size`` ranks simulated in one process.

    - ranks: contiguous chunks of B / dp_size rows (trainer/ray/launcher.py:async_run_method_batch);
    - micro-batches: consecutive ``micro_batch_size`` rows of a rank (trainer/ray/ppo_actor.py:ppo_train's
      DataLoader; it shuffles, which does not change one step's gradient), ``gas`` = B // micro // dp_size of them
      per rank and step (utils/deepspeed/deepspeed.py:DeepspeedStrategy.__init__, train_batch_size = B);
    - normalisers: the step's tokens and non-empty rows over every rank, divided by gas
      (utils/loss_utils.py:iter_grad_accum_global_norm, _optimizer_step_loss_norm), with dp_size;
    - loss: ``PolicyLoss(**module)(..., dp_size, batch_num_tokens, global_batch_size)`` per micro-batch
      (ppo_actor.py:training_step); DeepSpeed's backward divides it by gas (deepspeed/runtime/engine.py:
      DeepSpeedEngine._scale_loss_by_gas) and the gradients of the ranks are averaged (the all-reduce mean that
      ``dp_size`` compensates). The KL-loss, entropy and aux-loss terms of training_step are not simulated.

    So ``grad`` = sum over ranks and micro-batches of d(loss_mb) / d(logp) / (gas * dp_size), in the batch's shape,
    and ``loss`` = the same sum of loss_mb / (gas * dp_size); ``micro_losses[rank][k]`` are PolicyLoss's own values.
    B must be a multiple of micro_batch_size * dp_size (otherwise the trainer drops or pads rows)."""
    module, micro, dp = kw.get("module", {}), kw.get("micro_batch_size"), kw.get("dp_size", 1)
    for name, value in (("micro_batch_size", micro), ("dp_size", dp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    rows = len(mask)
    if rows % (micro * dp):
        raise ValueError(f"micro_batch_size: {rows} rows do not split into {dp} ranks of micro-batches of {micro}")
    leaf, old, a, m, roll = _tensors(logp, old_logp, adv, mask, rollout_logp)
    gas = rows // micro // dp
    starts = [(r * gas + k) * micro for r in range(dp) for k in range(gas)]
    info = NORM._optimizer_step_loss_norm([m[s:s + micro] for s in starts], None, dp, gas)
    fn = LOSS.PolicyLoss(**module)
    micro_losses, total = [], 0.0
    for s in starts:
        part = slice(s, s + micro)
        loss = fn(leaf[part], old[part], a[part], m[part], None if roll is None else roll[part], **info)[0]
        (loss / (gas * dp)).backward()
        micro_losses.append(float(loss.detach()))
        total += float(loss.detach()) / (gas * dp)
    return {"loss": total, "grad": _grad(leaf),
            "micro_losses": [micro_losses[r * gas:(r + 1) * gas] for r in range(dp)]}


def dpo(kw, logp, ref_logp, mask):
    """``DPOLoss(**kw)`` on sequence log-probs summed over each row's unmasked tokens, as the DPO trainer's
    ``_get_batch_logps`` sums them; rows 2k (chosen) and 2k + 1 (rejected) form pair k."""
    if len(mask) % 2:
        raise ValueError(f"mask: expected an even number of rows (chosen, rejected pairs), got {len(mask)}")
    leaf, ref, m = _t(logp).requires_grad_(True), _t(ref_logp), _t(mask)
    seq, ref_seq = (leaf * m).sum(-1), (ref * m).sum(-1)
    loss = LOSS.DPOLoss(**kw)(seq[0::2], seq[1::2], ref_seq[0::2], ref_seq[1::2])[0]
    loss.backward()
    return {"loss": loss, "grad": _grad(leaf)}


def kl(kw, logp, ref_logp, mask, old_logp=None):
    """``compute_approx_kl(log_probs, log_probs_base, log_probs_old, kl_estimator, unbiased_gradient)`` as the
    PPO actor calls it for its KL loss (trainer/ray/ppo_actor.py), in ``kw["dtype"]``."""
    return kl_term(lambda lp, ref, old: UTILS.compute_approx_kl(
        lp, ref, log_probs_old=old, kl_estimator=kw["kl_estimator"],
        unbiased_gradient=kw.get("unbiased_gradient", False)), kw, logp, ref_logp, mask, old_logp)


def advantage(kw, rewards, mask):
    """``RemoteExperienceMaker.compute_advantages_and_returns`` on one experience of the whole batch (rows in prompt
    order, ``kw["group_size"]`` responses per prompt = args.rollout.n_samples_per_prompt), with the training CLI's
    defaults (train_ppo_ray.py: reward.clip_range (-10, 10), gamma 1, lambd 1, std normalisation on, no length
    penalties) and KL coefficient 0; rewards [B] in ``kw["dtype"]``. Reply {"advantages": [B, T]}."""
    from types import SimpleNamespace as NS
    maker_cls = _import_experience_maker().RemoteExperienceMaker
    args = NS(rollout=NS(n_samples_per_prompt=kw["group_size"], max_new_tokens=None),
              algo=NS(advantage=NS(estimator=kw["estimator"], gamma=kw.get("gamma", 1.0), lambd=1.0,
                                   no_std_norm=False)),
              reward=NS(clip_range=(-10.0, 10.0), overlong_buffer_len=None, stop_properly_penalty_coef=None))
    maker = maker_cls.__new__(maker_cls)
    maker.strategy, maker.args, maker.advantage_estimator = NS(args=args), args, kw["estimator"]
    maker.kl_ctl = NS(value=0.0)
    dtype = getattr(torch, kw["dtype"])
    m = _t(mask) > 0
    experience = NS(rewards=_t(rewards).to(dtype), index=list(range(len(m))), action_mask=m, info={},
                    kl=torch.zeros(m.shape, dtype=dtype), values=None)
    maker.compute_advantages_and_returns([experience])
    return {"advantages": experience.advantages}


def signature(kw):
    """The keyword parameters of the installed ``PolicyLoss`` (the target checks them against the ones it passes)."""
    return {"PolicyLoss": [n for n in inspect.signature(LOSS.PolicyLoss.__init__).parameters if n != "self"]}


def versions():
    return {"openrlhf": importlib.metadata.version("openrlhf"), "torch": torch.__version__.split("+")[0]}


if __name__ == "__main__":
    serve({"policy": policy, "policy_step": policy_step, "dpo": dpo, "kl": kl, "advantage": advantage,
           "signature": signature}, versions)
