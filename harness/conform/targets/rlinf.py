"""RLinf 0.3.0 (``rlinf.algorithms``: the reasoning-task actor loss ``policy_loss`` -> ``compute_ppo_actor_loss``
with its loss_agg_func modes, the advantage estimators of ``calculate_adv_and_returns`` and ``kl_penalty``), called
as its FSDP actor worker calls them, in its own virtualenv (``make target-rlinf``) by ``workers/rlinf.py``."""
from __future__ import annotations

from harness.conform.cases import Check
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import RemoteTarget, advantage_checks, kl_checks

#: RLinf's loss_agg_func names -> the reference's aggregation mode of the same meaning.
AGG = {"token-mean": "token_mean", "seq-mean-token-mean": "seq_mean_token_mean",
       "seq-mean-token-sum": "seq_mean_token_sum"}
FAST_PATH = ("The actor passes fast_path_zero_loss_mask=True: when the first row of a micro-batch has no tokens, "
             "compute_ppo_actor_loss returns 0 whatever the other rows hold (`losses.py`, `loss_mask[0].sum() == "
             "0`).")
#: calculate_adv_and_returns's reasoning estimators (adv_type) -> the advantage kind's estimator and settings.
ESTIMATORS = {"grpo": ("grpo", {}), "reinpp": ("reinforce_pp", {})}
ESTIMATOR_BINDING = {"rewards": "rewards", "group_size": "group_size", "mask": "loss_mask"}
ESTIMATOR_NOTES = {
    "grpo": "RLinf reads groups as group_size contiguous rows (`rewards.reshape(-1, group_size)`).",
    "reinpp": "RLinf builds the token rewards in float32 (`torch.zeros_like(loss_mask).float()`; float64 rewards "
              "raise in its scatter) and whitens the returns by the biased variance over the batch's tokens with "
              "a floor of 1e-8; the reference divides by the unbiased std + 1e-8."}


class Target(RemoteTarget):
    name = "rlinf"

    how = ("`policy_loss(task_type='reasoning', loss_type='actor', loss_agg_func=get_loss_agg_func(mode), "
           "logprobs, old_logprobs, advantages, clip_ratio_c, clip_ratio_low, clip_ratio_high, loss_mask, "
           "fast_path_zero_loss_mask=True)` as the FSDP actor worker calls it (clip_ratio_c 3.0 by default), in "
           "float32 (the loss asserts float32 inputs), a boolean loss mask; `calculate_adv_and_returns("
           "task_type='reasoning', adv_type, rewards, loss_mask, group_size)` and the actor's KL loss "
           "`kl_penalty(ref_logprobs, logprobs, kl_penalty_type)`. Gradient d loss / d logprobs by autograd, in "
           "RLinf's own virtualenv (torch only; its package __init__ files and scheduler bypassed). Not checked: "
           "the embodied-task paths, the decoupled (proximal) loss, the critic losses, grpo_dynamic and "
           "reinpp's group baseline (use_reinpp_baseline: REINFORCE++ after a group centring).")

    def _policy(self, name, knob, kw, ref_hp, grid=None, seq_adv=None):
        call = "policy_loss(loss_type='actor', " + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"
        return ref.policy_check(name, call, knob, self.loss_run("policy", kw), ref_hp,
                                grid or {"agg": ref.TOKEN_AGG, "dual_clip": [None, 3.0]}, seq_adv=seq_adv,
                                note=FAST_PATH, dtype="float32")

    def checks(self) -> list[Check]:
        return self.policy_checks() + self.kl_checks() + self.advantage_checks()

    def policy_checks(self) -> list[Check]:
        out = [
            self._policy("ppo", "actor defaults (clip 0.2, clip_ratio_c 3, token-mean)", {"agg": "token-mean"},
                         {"dual_clip": 3.0}),
            self._policy("dapo", "clip_ratio_high=0.28, clip_ratio_c 3, token-mean",
                         {"agg": "token-mean", "clip_ratio_high": 0.28}, {"dual_clip": 3.0}),
        ]
        for mode, agg in AGG.items():
            out.append(self._policy("grpo", f"loss_agg_func={mode}, clip_ratio_c 3", {"agg": mode},
                                    {"beta": 0.0, "agg": agg, "dual_clip": 3.0}))
        return out

    def kl_checks(self) -> list[Check]:
        return kl_checks(self, "kl_penalty", {"k1": "k1", "k2": "k2", "k3": "k3"},
                         note="The actor's KL loss calls kl_penalty(ref_logprobs, logprobs, ...), the reverse of "
                         "its signature kl_penalty(logprob, ref_logprob, ...): k1 is ref_logp - logp and k3 "
                         "exp(logp - ref_logp) - (logp - ref_logp) - 1, estimators of KL(ref || pi).")

    def advantage_checks(self) -> list[Check]:
        return advantage_checks(self, "calculate_adv_and_returns(adv_type={!r})", "adv_type={}", ESTIMATORS,
                                ESTIMATOR_BINDING, ESTIMATOR_NOTES)
