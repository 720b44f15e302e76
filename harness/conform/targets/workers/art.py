"""Worker of the ``art`` conformance target (run by .venv-targets/art/bin/python): OpenPipe ART 0.5.23's
``art.loss.loss_fn``, called as its Unsloth backend's compute_loss calls it (art/unsloth/train.py): ``LossInputs``
of the packed tensors, the new log-probs, no reference log-probs or entropies, and the experimental TrainConfig.
Only torch and pydantic are installed: the ``art`` and ``art.utils`` package ``__init__`` files (which import
litellm, openai, weave, ...) are bypassed by bare package modules, and ``art.dev`` is a stand-in whose TrainConfig
is ``dict`` (art.loss reads dev.TrainConfig for one annotation; the real one is a TypedDict, a dict at run time,
whose module imports openai)."""
from __future__ import annotations

import importlib
import sys
import types
from importlib.metadata import version

import numpy as np
import torch

from _serve import bare_packages, leave_own_folder, serve

leave_own_folder(__file__)


def _bare_packages():
    bare_packages("art", ("art", "art.utils"))
    dev = types.ModuleType("art.dev")
    dev.TrainConfig = dict
    sys.modules["art.dev"] = dev
    sys.modules["art"].dev = dev


_bare_packages()
LOSS = importlib.import_module("art.loss")


def t64(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def policy(kw, logp, old_logp, adv, mask):
    """``loss_fn(LossInputs(inputs), new_logprobs, None, None, kw)`` on each row packed as ART packs a trajectory:
    one prompt token, then the response. ``inputs``' per-token tensors are indexed by token (logprobs[t] scores token
    t, NaN on the prompt), the new log-probs by the position that predicts the next token, so LossInputs shifts the
    former by one; every row is a group of its own (group_ids 1..B), weights 1. Reply {"loss": policy_loss,
    "grad": d loss / d logp}."""
    rows, width = np.shape(mask)
    pad = np.zeros((rows, 1))
    leaf = t64(logp).requires_grad_(True)
    new = torch.cat([leaf, t64(pad)], 1)  # new[:, t] scores token t + 1; the last position scores nothing
    on = np.hstack([pad, mask]) > 0
    inputs = {"tokens": torch.zeros((rows, width + 1), dtype=torch.long),
              "logprobs": t64(np.hstack([np.full((rows, 1), np.nan), old_logp])),
              "advantages": t64(np.hstack([pad, adv])), "assistant_mask": torch.as_tensor(on),
              "weights": t64(on.astype(float)),
              "group_ids": torch.as_tensor(np.repeat(np.arange(1, rows + 1)[:, None], width + 1, 1)),
              "parent_ids": torch.zeros((rows, width + 1), dtype=torch.long)}
    loss = LOSS.loss_fn(LOSS.LossInputs(inputs=inputs), new, None, None, dict(kw)).policy_loss
    loss.backward()
    return {"loss": loss.detach(), "grad": leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)}


serve({"policy": policy}, lambda: {"art": version("openpipe-art"), "torch": torch.__version__.split("+")[0]})
