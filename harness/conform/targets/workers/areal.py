"""Worker of the ``areal`` conformance target (run by .venv-targets/areal/bin/python): AReaL 1.0.4's
``areal.utils.functional.functional`` (PPO/DAPO/GSPO actor loss, SAPO, DPO), called as its actor and DPO engine
call them, and ``areal.utils.data.KLEstimator`` as its PPO actor calls it. Only torch is installed: the packages on
the way are registered bare; ``areal.api.cli_args.RejectionSamplingConfig`` is a stand-in (its rejection-sampling
path is never driven: ``rejection_sampling=None``), and ``areal.utils.data`` holds only AReaL's own
``KLEstimator``, its class statement run alone from the installed file (the module imports einops, torchdata and
AReaL's trainer configuration; the class needs torch only)."""
from __future__ import annotations

import ast
import os
import sys
import types
from importlib.metadata import version

import numpy as np
import torch

from _serve import bare_packages, kl_term, leave_own_folder, serve

leave_own_folder(__file__)


def _bare_packages():
    root = bare_packages("areal", ("areal", "areal.api", "areal.utils", "areal.utils.functional"))
    cli_args = types.ModuleType("areal.api.cli_args")
    cli_args.RejectionSamplingConfig = type("RejectionSamplingConfig", (), {})
    sys.modules["areal.api.cli_args"] = cli_args
    data = types.ModuleType("areal.utils.data")
    path = os.path.join(root, "utils", "data.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    statement = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KLEstimator")
    exec(compile(ast.Module([statement], []), path, "exec"), vars(data) | {"torch": torch}, vars(data))
    sys.modules["areal.utils.data"] = data


_bare_packages()
from areal.utils.functional import functional as F  # noqa: E402


def t64(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def _loss(fn, logp, **kw):
    lp = t64(logp).requires_grad_(True)
    loss, _ = fn(lp, **kw)
    loss.backward()
    return {"loss": loss.detach(), "grad": lp.grad if lp.grad is not None else torch.zeros_like(lp)}


def ppo(kw, logp, old_logp, adv, mask):
    """``ppo_actor_loss_fn`` with the decoupled proximal policy off: proximal_logprobs = old_logprobs."""
    old = t64(old_logp)
    return _loss(F.ppo_actor_loss_fn, logp, proximal_logprobs=old, old_logprobs=old, advantages=t64(adv),
                 loss_mask=t64(mask) > 0, **kw)


def sapo(kw, logp, old_logp, adv, mask):
    return _loss(F.sapo_loss_fn, logp, old_logprobs=t64(old_logp), advantages=t64(adv), loss_mask=t64(mask) > 0,
                 **kw)


def dpo(kw, logp, ref_logp, mask):
    """Rows 2k, 2k+1 are pair k's chosen and rejected responses. Each row is packed as AReaL's DPO engine receives
    it: one prompt token, then the response (logprobs[i] scores token i + 1, so loss_mask is one ahead); then
    ``dpo_pair_logratios``, the pair logits and ``dpo_preference_loss`` averaged over pairs, as its
    ``compute_dpo_loss`` combines them."""
    rows, width = np.shape(mask)
    if rows % 2:
        raise ValueError(f"dpo: expected chosen/rejected row pairs, got {rows} rows")
    pad = np.zeros((rows, 1))
    lp = t64(np.hstack([logp, pad])).reshape(-1).requires_grad_(True)
    ref = t64(np.hstack([ref_logp, pad])).reshape(-1)
    loss_mask = t64(np.hstack([pad, mask])).reshape(-1) > 0
    cu_seqlens = torch.arange(rows + 1) * (width + 1)
    policy, reference, _ = F.dpo_pair_logratios(lp, ref, cu_seqlens, loss_mask, torch.ones(rows // 2, dtype=bool))
    logits = (policy[:, 0] - policy[:, 1]) - (reference[:, 0] - reference[:, 1])
    loss = F.dpo_preference_loss(logits, **kw).mean()
    loss.backward()
    return {"loss": loss.detach(), "grad": lp.grad.reshape(rows, width + 1)[:, :width]}


def kl(kw, logp, ref_logp, mask, old_logp=None):
    """``KLEstimator(kl_estimator)(log_probs, log_probs_base)`` in ``kw["dtype"]``; AReaL's PPO actor calls it on
    (old_logp, ref_logp) for the KL penalty in its rewards (trainer/ppo/actor.py)."""
    estimator = sys.modules["areal.utils.data"].KLEstimator(kw["kl_estimator"])
    return kl_term(lambda lp, ref, _: estimator(lp, ref), kw, logp, ref_logp, mask)


serve({"ppo": ppo, "sapo": sapo, "dpo": dpo, "kl": kl},
      lambda: {"areal": version("areal"), "torch": torch.__version__.split("+")[0]})
