"""OpenRLHF 0.11.2's PPO actor for one optimisation step, through the ``policy_step`` op of its out-of-process
worker (``harness/conform/targets/workers/openrlhf.py``, environment ``make target-openrlhf``): ranks are contiguous row
chunks, each cut into micro-batches of ``micro_batch_size`` rows; every micro-batch's ``PolicyLoss`` gets dp_size
and the step's tokens and non-empty rows over all ranks divided by the accumulation steps
(``utils/loss_utils.py::iter_grad_accum_global_norm``), DeepSpeed divides each loss by the accumulation steps and
the ranks' gradients are averaged. The worker's docstring names the trainer lines it follows."""
from __future__ import annotations

from harness.conform.cases import StepCheck
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import RemoteTarget, loss_and_grad


class StepTarget(RemoteTarget):
    name = "openrlhf"

    how = ("`policy_step` of the OpenRLHF worker: `PolicyLoss(...)(..., dp_size, batch_num_tokens, "
           "global_batch_size)` per micro-batch with the normalisers of `iter_grad_accum_global_norm` "
           "(the non-dynamic batch path), each loss's gradient divided by gas x dp_size (DeepSpeed's "
           "1 / gas, then the ranks' mean); float64, gradient w.r.t. the per-token log-probs. Not driven: "
           "the dynamic-batch path (`train.dynamic_batch_enable`), whose normalisers come from the replay "
           "buffer.")

    def run(self, **module):
        def step(b, micro, ranks):
            kw = {"module": module, "micro_batch_size": micro or len(b.mask) // ranks, "dp_size": ranks}
            out = self.worker.call("policy_step", kw, logp=b.logp, old_logp=b.old_logp, adv=b.adv, mask=b.mask)
            return loss_and_grad(self.name, out, b.mask.shape)[1], b
        return step

    def step_checks(self) -> list[StepCheck]:
        gspo = {"policy_loss_type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}
        return [
            self._check("ppo", "token_level_loss=True (default)", {}, {}),
            self._check("grpo", "token_level_loss=False", {"token_level_loss": False}, {"beta": 0.0},
                        note="global_batch_size counts the step's rows with tokens over every rank "
                        "(`_optimizer_step_loss_norm`): no factor in masked_rows, where verl's and TRL's is 6/8."),
            self._check("dapo", "clip_eps_high=0.28, token_level_loss=True", {"clip_eps_high": 0.28},
                        {"agg": "token_mean"}),
            self._check("gspo", "policy_loss_type='gspo', clip 3e-4/4e-4", gspo, {}),
        ]

    def _check(self, name, knob, module, ref_hp, note=""):
        call = "PolicyLoss(" + ", ".join(f"{k}={v!r}" for k, v in module.items()) + ") per micro-batch"
        return StepCheck(name, call, knob, self.run(**module), ref.policy(name, **ref_hp), note=note)
