"""OpenPipe ART 0.5.23 (``art.loss.loss_fn``: CISPO by default, PPO with ``ppo=True``, the sequence-level ratio of
``importance_sampling_level``), called as its Unsloth backend calls it, in its own virtualenv (``make target-art``) by
``workers/art.py``."""
from __future__ import annotations

from harness.conform.cases import Check
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import RemoteTarget

CLAMP = "ART clamps the log-ratio to [-20, 20] before its exp (`loss.py`, log_ratio_bound)."


class Target(RemoteTarget):
    name = "art"

    how = ("`loss_fn(LossInputs(inputs), new_logprobs, None, None, experimental_config)` as the Unsloth backend's "
           "compute_loss calls it, each response packed after one prompt token (LossInputs shifts the per-token "
           "inputs by one), a group id per response, weights 1, no reference model (kl_penalty_coef 0); the "
           "loss is `policy_loss` (the sum over the batch's tokens / their count), its gradient d loss / d "
           "new_logprobs by autograd, float64, in ART's own virtualenv (torch and pydantic; its package __init__ "
           "files bypassed). Not checked: truncated_importance_sampling (it needs the sampler's log-probs, "
           "original_logprobs), mask_prob_ratio, kimi_k2_tau and the KL advantage shaping (no reference "
           "convention).")

    def _policy(self, name, knob, config, ref_hp, grid=None, seq_adv=None, names=None, note=""):
        call = "loss_fn(experimental_config={" + ", ".join(f"{k!r}: {v!r}" for k, v in config.items()) + "})"
        return ref.policy_check(name, call, knob, self.loss_run("policy", config), ref_hp,
                                grid or {"agg": ref.TOKEN_AGG}, names, seq_adv,
                                note=" ".join(filter(None, (note, CLAMP))))

    def checks(self) -> list[Check]:
        dual = {"agg": ref.TOKEN_AGG, "dual_clip": [None, 3.0]}
        gspo = {"ppo": True, "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}
        return [
            self._policy("cispo", "ART defaults (ppo=False: epsilon 1, epsilon_high 4)", {}, {},
                         grid={"agg": ref.TOKEN_AGG, "cap_mode": ["relative", "absolute"]},
                         note="ART's default loss weighs A * logp by clip(r, 1 - epsilon, 1 + epsilon_high), r "
                         "detached: CISPO (MiniMax-M1 Eq. 4-5); epsilon 1 puts the lower bound at 0."),
            self._policy("ppo", "ppo=True (epsilon 0.2)", {"ppo": True}, {}, grid=dual),
            self._policy("dapo", "ppo=True, epsilon_high=0.28", {"ppo": True, "epsilon_high": 0.28}, {}, grid=dual),
            self._policy("gspo", "ppo=True, importance_sampling_level='sequence', epsilon 3e-4/4e-4", gspo, {},
                         seq_adv=True, names=["gspo", "gspo_token"]),
            self._policy("gspo_token", "ppo=True, importance_sampling_level='sequence', epsilon 3e-4/4e-4, "
                         "per-token advantages", gspo, {}, seq_adv=False, names=["gspo", "gspo_token"]),
        ]
