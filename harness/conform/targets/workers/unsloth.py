"""Worker of the ``unsloth`` conformance target: unsloth-zoo's ``rl_replacements.grpo_compute_loss`` on given
per-token log-probs, float64, with the gradient w.r.t. the policy's log-probs. unsloth_zoo's package __init__
refuses to load without unsloth (and a GPU), and its ``temporary_patches`` package __init__ patches dozens of
models at import: both are registered as bare packages, so only the modules rl_replacements imports are loaded.
Of ``datasets`` those import two class names only (for a dataset helper the loss never calls): a stub module
stands in for it, which keeps pyarrow and pandas out of the environment."""
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types

import numpy as np
import torch

from _serve import serve


def _bare_package(name: str) -> None:
    spec = importlib.util.find_spec(name)
    module = types.ModuleType(name)
    module.__path__, module.__spec__ = list(spec.submodule_search_locations), spec
    sys.modules[name] = module


def _datasets_stub() -> None:
    module = types.ModuleType("datasets")
    module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    module.Dataset = type("Dataset", (), {})
    module.IterableDataset = type("IterableDataset", (), {})
    sys.modules["datasets"] = module


_bare_package("unsloth_zoo")
_bare_package("unsloth_zoo.temporary_patches")
_datasets_stub()
from unsloth_zoo.rl_replacements import grpo_compute_loss  # noqa: E402


def loss(kw: dict, logp, old_logp, ref_logp, adv, mask, rollout_logp=None) -> dict:
    """``grpo_compute_loss(ref, new, old, sampling_per_token_logps, input_ids, mask, beta, advantages, **kw)`` as
    Unsloth's GRPO trainer calls it for one micro-batch (advantages one per row; num_items_in_batch the batch's
    token count; sampling_per_token_logps the rollout engine's log-probs, when given)."""
    new = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    mask_t = torch.tensor(mask, dtype=torch.float64)
    kw = {"num_items_in_batch": mask_t.sum(), **kw}
    beta = kw.pop("beta", 0.0)
    out = grpo_compute_loss(torch.tensor(ref_logp, dtype=torch.float64), new,
                            torch.tensor(old_logp, dtype=torch.float64),
                            None if rollout_logp is None else torch.tensor(rollout_logp, dtype=torch.float64),
                            torch.zeros(np.shape(logp), dtype=torch.long), mask_t, beta,
                            torch.tensor(adv, dtype=torch.float64), **kw)
    value = out[0]
    value.backward()
    return {"loss": value, "grad": new.grad if new.grad is not None else torch.zeros_like(new)}


def versions() -> dict:
    """Keyed by the target's name, as the conformance matrix reads it."""
    return {"unsloth": "zoo " + importlib.metadata.version("unsloth_zoo"), "torch": torch.__version__.split("+")[0]}


serve({"loss": loss}, versions)
