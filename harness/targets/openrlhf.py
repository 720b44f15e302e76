"""OpenRLHF's ``openrlhf.models.loss.PolicyLoss`` (policy_loss_type ppo and gspo, token- or sample-level
aggregation, dual clip). openrlhf.models imports flash-attn at import time, so this target needs it installed."""
from __future__ import annotations

import torch

from spec.registry import AGG_MODES

from ..conform_cases import Check, batch_of
from . import reference as ref
from .reference import t64

INSTALL = "pip install openrlhf (its models package imports flash_attn, which needs a CUDA build)"
ALL_AGG = [m for m in AGG_MODES if m != "seq_mean"]


class Target:
    name = "openrlhf"

    def __init__(self):
        from . import require
        self.loss = require("openrlhf.models.loss", INSTALL)
        import openrlhf
        self.versions = {"openrlhf": getattr(openrlhf, "__version__", "unknown"),
                         "torch": torch.__version__.split("+")[0]}
        self.how = "PolicyLoss(...)(log_probs, old_log_probs, advantages, action_mask), float64, one rank."

    def run(self, **kw):
        module = self.loss.PolicyLoss(**kw)

        def run(b):
            logp = t64(b.logp, grad=True)
            loss = module(logp, t64(b.old_logp), t64(b.adv), t64(b.mask))[0]
            loss.backward()
            return float(loss.detach()), logp.grad.numpy(), b
        return run

    def _check(self, name, knob, kw, ref_hp, seq_adv=None, names=None):
        return Check(name, "PolicyLoss(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")", knob,
                     self.run(**kw), ref.policy(name, **ref_hp),
                     ref.policy_grid(names or [name], ref_hp, {"agg": ALL_AGG, "dual_clip": [None, 3.0]},
                                     rows_counted=True, exclude=(name, ref_hp)),
                     lambda s, f: batch_of(s, f, seq_adv=seq_adv), exact=ref.exact_policy(name, **ref_hp))

    def checks(self) -> list[Check]:
        return [
            self._check("ppo", "defaults (token_level_loss=True)", {}, {}),
            self._check("ppo", "dual_clip=3", {"dual_clip": 3.0}, {"dual_clip": 3.0}),
            self._check("grpo", "token_level_loss=False", {"token_level_loss": False}, {"beta": 0.0}),
            self._check("dapo", "clip_eps_high=0.28 (token_level_loss=True)", {"clip_eps_high": 0.28}, {}),
            self._check("gspo", "policy_loss_type='gspo', clip 3e-4/4e-4",
                        {"policy_loss_type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4},
                        {"eps_low": 3e-4, "eps_high": 4e-4}, seq_adv=True, names=["gspo", "gspo_token"]),
        ]
