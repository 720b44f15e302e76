"""OpenRLHF 0.11.2 (``openrlhf.models.loss``: PolicyLoss for ppo and gspo, dual clip, token- or sample-level
aggregation, clip-higher, the rollout importance-sampling correction; DPOLoss; ``openrlhf.models.utils``'s
compute_approx_kl), run in its own virtualenv
(``make target-openrlhf``) by ``workers/openrlhf.py``.

The worker's ops (arrays are float64 [B, T] unless said; ``mask`` is 0/1; replies are JSON numbers and lists):

- ``policy``: kw = PolicyLoss's constructor keywords; arrays logp, old_logp, adv, mask, optional rollout_logp.
  The whole batch is one micro-batch of one rank (dp_size 1, batch_num_tokens = its tokens, global_batch_size =
  its non-empty rows). Reply {"loss": float, "grad": [B, T] d loss / d logp}.
- ``policy_step`` (for the step-level engine): kw = {"module": PolicyLoss's constructor keywords,
  "micro_batch_size": int >= 1, "dp_size": int >= 1 (ranks simulated in one process)}; arrays as ``policy``; B must
  be a multiple of micro_batch_size * dp_size. Rank r holds rows [r * B / dp_size, (r + 1) * B / dp_size), cut into
  consecutive micro-batches; every micro-batch gets dp_size and the step's tokens and non-empty rows over all ranks
  divided by gas = B / (micro_batch_size * dp_size), as OpenRLHF's actor passes them. Reply {"loss": float, "grad":
  [B, T], "micro_losses": [dp_size][gas] floats}: grad is the sum over every micro-batch of d loss_mb / d logp /
  (gas * dp_size) (DeepSpeed's 1 / gas scaling, then the mean over ranks), loss the same sum of loss_mb. Only the
  policy loss (no KL loss, entropy or aux loss). The worker's docstring names the trainer lines it follows.
- ``dpo``: kw = DPOLoss's keywords (beta, label_smoothing, ipo); arrays logp, ref_logp, mask with an even B; rows
  2k and 2k + 1 are pair k's chosen and rejected responses, their sequence log-probs the sums over unmasked tokens.
  Reply {"loss": float, "grad": [B, T]}.
- ``kl``: kw = compute_approx_kl's kl_estimator and unbiased_gradient, and dtype; arrays logp, ref_logp, old_logp,
  mask. Reply {"value": [B, T] per-token values (0 off the mask), "grad": d sum(value) / d logp}.
"""
from __future__ import annotations

import numpy as np

from harness.conform.cases import Check, batch_of, rollout_batch
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import RemoteTarget, advantage_checks, kl_checks, loss_and_grad

#: The trainer's outcome estimators (algo.advantage.estimator) -> the advantage kind's estimator and its settings
#: (group_norm divides by std + 1e-9).
ADVANTAGE_ESTIMATORS = {"group_norm": ("grpo", {"eps": 1e-9}), "dr_grpo": ("dr_grpo", {}), "rloo": ("rloo", {}),
                        "reinforce": ("reinforce_pp", {})}
ADVANTAGE_BINDING = {"rewards": "rewards", "group_size": "n_samples_per_prompt", "mask": "action_mask"}
ADVANTAGE_NOTES = {
    "rloo": "With one response per prompt, OpenRLHF's leave-one-out baseline divides by n_samples_per_prompt - 1 "
            "= 0.",
    "reinforce": "OpenRLHF whitens the returns by the biased variance over the batch's tokens (divided by their "
                 "count) and a floor of 1e-8 on it; the reference divides by the unbiased std + 1e-8.",
    "group_norm": "The trainer clips the shaped rewards to reward.clip_range, (-10, 10) by default."}
AGG_AND_DUAL = {"agg": ref.TOKEN_AGG, "dual_clip": [None, 3.0]}
ROLLOUT_READ = "logp, old_logp, adv, mask and rollout_logp (the rollout engine's log-probs)"
PAIRS_READ = ("logp and ref_logp summed over each row's unmasked tokens as sequence log-probs; rows 2k (chosen) and "
              "2k + 1 (rejected) form pair k")


#: The PolicyLoss keywords this target passes, as openrlhf 0.11.2 names them.
POLICY_KEYWORDS = ("clip_eps_low", "clip_eps_high", "dual_clip", "token_level_loss", "policy_loss_type",
                   "is_correction_level", "is_correction_mode", "is_correction_threshold")
#: PolicyLoss's rollout importance-sampling keywords of openrlhf 0.11.0 -> the ones that replaced them in 0.11.2
#: (a flag and a type tis/icepop/seq-mask-tis became a level off/token/seq and a mode clip/mask).
RENAMED = {"enable_vllm_is_correction": "is_correction_level", "vllm_is_correction_type": "is_correction_mode",
           "vllm_is_truncated_threshold": "is_correction_threshold"}


def api_change(params, version: str) -> str | None:
    """None when the installed PolicyLoss (keyword parameters ``params``, openrlhf ``version``) takes every keyword
    of POLICY_KEYWORDS; else one line naming what changed, the renames RENAMED knows first."""
    missing = [k for k in POLICY_KEYWORDS if k not in params]
    if not missing:
        return None
    renames = [f"{old} -> {new}" for old, new in RENAMED.items() if new in missing and old in params]
    change = (f"its importance-sampling keywords have other names ({', '.join(renames)} from openrlhf 0.11.2 on)"
              if renames else f"it takes no {', '.join(missing)} (it takes {', '.join(params)})")
    return (f"target openrlhf: the installed openrlhf {version}'s PolicyLoss does not take the keywords this target "
            f"passes: {change}; build the environment the target expects with `make target-openrlhf` "
            "(harness/conform/targets/envs/openrlhf.lock)")


class Target(RemoteTarget):
    name = "openrlhf"

    def __init__(self, worker=None):
        super().__init__(worker)
        change = api_change(self.worker.call("signature")["PolicyLoss"], self.versions.get("openrlhf", "?"))
        if change:
            self.close()
            raise ValueError(change)

    how = ("`PolicyLoss(...)(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, dp_size, "
           "batch_num_tokens, global_batch_size)` on the whole batch as one micro-batch of one rank: "
           "dp_size=1 and the batch's own token count and non-empty rows (the actor's "
           "`get_loss_batch_info` without a process group), the mask as a bool tensor like the trainer's "
           "action_mask. `DPOLoss(beta, label_smoothing, ipo)` on sequence log-probs summed over unmasked "
           "tokens, as the DPO trainer sums them. Gradients d loss / d log_probs by autograd, float64, in "
           "a virtualenv of its own (openrlhf imported without its package `__init__`, which needs "
           "flash_attn). On a batch without tokens the loss is 0 / 0 = NaN (batch_num_tokens = 0), "
           "a finding of its own. Not checked: the binary_kl and tv gates of the rollout "
           "correction (the reference has none); the advantage estimators reinforce_baseline (REINFORCE++ after a "
           "group centring: the advantage kind checks the two apart), flash_reinforce (a batch-mean baseline) and "
           "gae (it needs a critic's values). Its clamp, named in the findings: log r to [-20, 20] in "
           "the ppo loss (`models/loss.py:187`).")

    # ---- callers ---------------------------------------------------------------------------------------------
    def _call(self, op, kw, b, **arrays):
        return (*loss_and_grad(self.name, self.worker.call(op, kw, mask=b.mask, **arrays), b.mask.shape), b)

    def policy_run(self, **module):
        def run(b):
            extra = {"rollout_logp": b.extra["rollout_logp"]} if "rollout_logp" in b.extra else {}
            return self._call("policy", module, b, logp=b.logp, old_logp=b.old_logp, adv=b.adv, **extra)
        return run

    def dpo_run(self, **module):
        return lambda b: self._call("dpo", module, b, logp=b.logp, ref_logp=b.ref_logp)

    # ---- checks ----------------------------------------------------------------------------------------------
    def checks(self) -> list[Check]:
        return (self.policy_checks() + self.rollout_checks() + self.dpo_checks() + self.kl_checks()
                + self.advantage_checks())

    def advantage_checks(self) -> list[Check]:
        """The trainer's outcome estimators against the advantage kind's reference (G contiguous responses per
        prompt, so no ragged groups), in float64, float32 and bfloat16."""
        return advantage_checks(self, "compute_advantages_and_returns (estimator {!r})",
                                "algo.advantage.estimator={}", ADVANTAGE_ESTIMATORS, ADVANTAGE_BINDING,
                                ADVANTAGE_NOTES)

    def kl_checks(self) -> list[Check]:
        """``compute_approx_kl`` for the actor's KL loss: k1, k2, k3, and k1 with unbiased_gradient."""
        clamp = ("OpenRLHF computes in float32 (`log_probs.float()`), clamps log r at -10 before k3's exp and "
                 "every estimator's value to [-10, 10] (`models/utils.py`).")
        return (kl_checks(self, "compute_approx_kl", {"k1": "k1", "k2": "k2", "k3": "k3"}, note=clamp)
                + kl_checks(self, "compute_approx_kl", {"k1": "k1"}, unbiased_gradient=True,
                            note=clamp + " unbiased_gradient=True keeps the value and takes the gradient "
                            "w * (logp - ref_logp), w = exp(logp - old_logp) capped at 10 and detached: k2's "
                            "gradient importance-weighted to the sampling policy."))

    def _policy(self, name, knob, module, ref_hp, grid, seq_adv=None, names=None, note=""):
        return Check(name, _call_text(module), knob, self.policy_run(**module), ref.policy(name, **ref_hp),
                     ref.policy_grid(names or [name], ref_hp, grid, rows_counted=True, exclude=(name, ref_hp)),
                     lambda s, f: batch_of(s, f, seq_adv=seq_adv), exact=ref.exact_policy(name, **ref_hp), note=note)

    def policy_checks(self) -> list[Check]:
        return [
            self._policy("ppo", "defaults (clip 0.2/0.2, token_level_loss=True)", {}, {}, AGG_AND_DUAL),
            self._policy("ppo", "dual_clip=3", {"dual_clip": 3.0}, {"dual_clip": 3.0}, AGG_AND_DUAL),
            self._policy("grpo", "token_level_loss=False (sample level)", {"token_level_loss": False},
                         {"beta": 0.0}, AGG_AND_DUAL),
            self._policy("dapo", "clip_eps_high=0.28 (DAPO clip-higher, token_level_loss=True)",
                         {"clip_eps_high": 0.28}, {}, {"agg": ref.TOKEN_AGG},
                         note="token_level_loss=True divides by every token of the batch; DAPO Eq. 8 averages each "
                         "group's tokens, then the groups."),
            self._policy("gspo", "policy_loss_type='gspo', clip 3e-4/4e-4",
                         {"policy_loss_type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}, {},
                         {"agg": ref.TOKEN_AGG}, seq_adv=True, names=["gspo", "gspo_token"]),
            self._policy("gspo_token", "policy_loss_type='gspo', clip 3e-4/4e-4, per-token advantages",
                         {"policy_loss_type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}, {},
                         {"agg": ref.TOKEN_AGG}, seq_adv=False, names=["gspo", "gspo_token"],
                         note="With an advantage per token, GSPO-token (Eq. 13) is the paper's form."),
        ]

    def rollout_checks(self) -> list[Check]:
        """The is_correction modes against the registry's rollout_correction where they mean the same; the
        candidates vary the correction only (the token mean is the ppo rows' finding)."""
        bases = [{}, {"rollout_correction": "mis"}, {"rollout_correction": "seq_mis"}, {"rollout_correction": "tis"},
                 {"rollout_correction": "tis", "tis_cap": 5.0}]
        cands = [ref.policy("ppo", **base) for base in bases]
        out = []
        for knob, module, hp, note in (
                ("token level, mask, ratio in [0.5, 5] (IcePop)",
                 {"is_correction_level": "token", "is_correction_mode": "mask"}, bases[1], ""),
                ("token level, clip, ratio in [0, 2] (TIS)",
                 {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": [0.0, 2.0]},
                 bases[3], ""),
                ("token level, clip, ratio in [0.5, 5] (the default band)",
                 {"is_correction_level": "token", "is_correction_mode": "clip"}, bases[4],
                 "The clip mode clamps the weight rho = pi_old / pi_rollout to [0.5, 5] on both sides, raising "
                 "weights below 0.5 to 0.5; truncated IS only caps it above (with the band [0, C] it agrees: the "
                 "row above)."),
                ("sequence level, mask, ratio in [0.5, 5]",
                 {"is_correction_level": "seq", "is_correction_mode": "mask"}, bases[2],
                 "OpenRLHF gates on the geometric mean of a sequence's token weights and weighs each kept token "
                 "by its own weight; sequence MIS gates on, and weighs every token by, their product.")):
            conv = ref.policy("ppo", **hp)
            out.append(Check("ppo", _call_text(module), f"is_correction: {knob}", self.policy_run(**module), conv,
                             [c for c in cands if c.label != conv.label], rollout_batch,
                             exact=ref.exact_policy("ppo", **hp), note=note, reads=ROLLOUT_READ))
        return out

    def dpo_checks(self) -> list[Check]:
        beta, eps = 0.1, 0.1
        return [
            Check("dpo", "DPOLoss(beta=0.1)", "sigmoid, label_smoothing=0", self.dpo_run(beta=beta), ref.dpo(beta),
                  [ref.dpo(beta, eps), ref.ipo(beta)], pair_batch, exact=ref.exact_dpo(beta), reads=PAIRS_READ),
            Check("dpo", "DPOLoss(beta=0.1, label_smoothing=0.1)", "sigmoid, label_smoothing=0.1 (cDPO)",
                  self.dpo_run(beta=beta, label_smoothing=eps), None, [ref.dpo(beta), ref.dpo(beta, eps)], pair_batch,
                  reads=PAIRS_READ, note="The reference has no label smoothing."),
            Check("dpo", "DPOLoss(beta=0.1, ipo=True)", "IPO", self.dpo_run(beta=beta, ipo=True), None,
                  [ref.dpo(beta), ref.ipo(beta)], pair_batch, reads=PAIRS_READ, note="The reference has no IPO."),
        ]


def _call_text(module: dict) -> str:
    return "PolicyLoss(" + ", ".join(f"{k}={v!r}" for k, v in module.items()) + ")"


def pair_batch(seed, family):
    """A generated batch cut to an even number of rows (at least two), read as preference pairs (groups of 2)."""
    b = batch_of(seed, family)
    rows = max(len(b.mask) - len(b.mask) % 2, 2)
    return b.take(rows=np.arange(rows) % len(b.mask), group_size=2)
