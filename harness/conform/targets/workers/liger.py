"""Worker of the ``liger`` conformance target: Liger-Kernel's ``LigerFusedLinearGRPOLoss`` (compiled=False, torch
only) on hidden states and an output weight, with the gradients w.r.t. both."""
import importlib.metadata

import torch
from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

from _serve import serve


def loss(kw: dict, hidden, weight, ids, mask, adv, old_logp, ref_logp) -> dict:
    """``LigerFusedLinearGRPOLoss(compiled=False, **kw)(hidden, weight, ids, mask, adv, ...)`` with one advantage
    per row and the completion mask as integers, as a GRPO trainer passes them."""
    h = torch.tensor(hidden, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    f64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    value, _metrics = LigerFusedLinearGRPOLoss(compiled=False, **kw)(
        h, w, torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long), f64(adv),
        ref_per_token_logps=f64(ref_logp), old_per_token_logps=f64(old_logp))
    value.backward()
    return {"loss": value, "grad_hidden": h.grad, "grad_weight": w.grad}


def versions() -> dict:
    """Keyed by the target's name, as the conformance matrix reads it."""
    return {"liger": "kernel " + importlib.metadata.version("liger_kernel"), "torch": torch.__version__.split("+")[0]}


serve({"loss": loss}, versions)
