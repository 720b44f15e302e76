"""SkyRL's ``skyrl.backends.skyrl_train.utils.ppo_utils`` (its own virtualenv, workers/skyrl.py): the policy losses
of ``PolicyLossRegistry`` under each loss reduction, the off-policy corrections, and the advantage estimators of
``AdvantageEstimatorRegistry``."""
from __future__ import annotations

import numpy as np

from harness.conform.cases import ADV_READS, Check, advantage_batch, rollout_batch
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import POLICY_ARRAYS, RemoteTarget, kl_checks

LONE = "SkyRL's grpo estimator gives a prompt with a single response mean 0 and std 1."
GAE_NOTE = ("SkyRL's GAE runs its recursion over every column, padding included (the last valid token bootstraps "
            "from the value at the next, padded, position), and whitens the advantages over the mask.")
ROLLOUT_READS = "logp, old_logp, adv, mask and rollout_logp (the engine's log-probs, old_logp + N(0, 0.5))"


class Target(RemoteTarget):
    name = "skyrl"

    how = ("Policy losses are `PolicyLossRegistry.get(policy_loss_type)(log_probs, old_log_probs, "
           "advantages, config, loss_mask, rollout_logprobs)` with an `AlgorithmConfig`, on advantages "
           "first scaled by `apply_loss_reduction_to_advantages_minibatch` as SkyRL's trainer does (one "
           "mini-batch; micro-batch = the batch; max_seq_len = the batch's padded width; prompt_mean's "
           "prompts = the batch's groups); the gradient is d loss / d log_prob by autograd, float64, "
           "in SkyRL's own virtualenv (Python 3.11, its package __init__ files bypassed, Ray absent). Its "
           "clamps, named in the findings: log r to [-20, 20], then exp in float32 (`safe_exp_delta`, "
           "`torch_utils.py:192`), and log s at 10 in gspo (`ppo_utils.py:709`).")

    # ---- callers ---------------------------------------------------------------------------------------------
    def policy_run(self, loss, reduction, rollout=False, **config):
        def kw(b):
            return {"loss": loss, "reduction": reduction, "config": config, "max_seq_len": b.max_len,
                    "prompt_size": b.group_size if reduction == "prompt_mean" else None}
        return self.loss_run("policy", kw, POLICY_ARRAYS + (("rollout_logp",) if rollout else ()))

    def advantage_run(self, estimator, part="advantages", **kw):
        """Outcome estimators read one reward per row at its last unmasked token; GAE reads adv * mask as token
        rewards and ref_logp as values."""
        def run(b):
            if estimator == "gae":
                arrays = {"rewards": b.adv * b.mask, "values": b.ref_logp}
            else:
                arrays = {"rewards": _last_token_rewards(b.rewards, b.mask)}
            out = self.worker.call("advantage", {"estimator": estimator, "group_size": b.group_size, **kw},
                                   mask=b.mask, **arrays)
            return np.asarray(out[part], dtype=float) * b.mask, None, b
        return run

    # ---- checks ----------------------------------------------------------------------------------------------
    def checks(self) -> list[Check]:
        return self.policy_checks() + self.rollout_checks() + self.advantage_checks() + self.kl_checks()

    def kl_checks(self) -> list[Check]:
        """``compute_approx_kl`` as the worker's KL loss calls it (with the loss mask): k1, k2, k3."""
        return kl_checks(self, "compute_approx_kl", {"k1": "k1", "k2": "k2", "k3": "k3"},
                         note="SkyRL clamps ref - logp to [-20, 20] and k3 to [-10, 10] (`ppo_utils.py:115-118`).")

    def _policy(self, name, call, knob, run, ref_hp, seq_adv=None, names=None, grid=None, note="", cases=None,
                reads=None, more=()):
        return ref.policy_check(name, f"PolicyLossRegistry.get({call!r})", knob, run, ref_hp,
                                grid or {"agg": ref.TOKEN_AGG}, names, seq_adv, more, cases, note=note,
                                **({"reads": reads} if reads else {}))

    def policy_checks(self) -> list[Check]:
        dual = {"agg": ref.TOKEN_AGG, "dual_clip": [None, 3.0]}
        gspo_clip = {"eps_clip_low": 3e-4, "eps_clip_high": 4e-4}
        return [
            self._policy("ppo", "regular", "SkyRL defaults (eps_clip 0.2, loss_reduction=token_mean)",
                         self.policy_run("regular", "token_mean"), {}, grid=dual),
            self._policy("ppo", "dual_clip", "clip_ratio_c=3 (default), token_mean",
                         self.policy_run("dual_clip", "token_mean"), {"dual_clip": 3.0}, grid=dual),
            self._policy("grpo", "regular", "loss_reduction=sequence_mean",
                         self.policy_run("regular", "sequence_mean"), {"beta": 0.0}),
            self._policy("dapo", "regular", "eps_clip_high=0.28, loss_reduction=token_mean (SkyRL's default)",
                         self.policy_run("regular", "token_mean", eps_clip_high=0.28), {}),
            self._policy("dapo", "regular", "eps_clip_high=0.28, loss_reduction=prompt_mean",
                         self.policy_run("regular", "prompt_mean", eps_clip_high=0.28), {}),
            self._policy("dr_grpo", "regular", "loss_reduction=seq_mean_token_sum_norm, max_seq_len = padded width",
                         self.policy_run("regular", "seq_mean_token_sum_norm"), {}),
            self._policy("gspo", "gspo", "clip 3e-4/4e-4, loss_reduction=sequence_mean",
                         self.policy_run("gspo", "sequence_mean", **gspo_clip), {}, seq_adv=True,
                         names=["gspo", "gspo_token"],
                         note="SkyRL clamps the log of the sequence ratio at 10 (`torch.clamp(..., max=10)`)."),
            self._policy("gspo_token", "gspo", "token advantages, clip 3e-4/4e-4, loss_reduction=sequence_mean",
                         self.policy_run("gspo", "sequence_mean", **gspo_clip), {}, seq_adv=False),
            self._policy("sapo", "sapo", "tau_pos 1, tau_neg 1.05, loss_reduction=sequence_mean",
                         self.policy_run("sapo", "sequence_mean"), {}),
            self._policy("sapo", "sapo", "loss_reduction=token_mean", self.policy_run("sapo", "token_mean"),
                         {"agg": "token_mean"}),
            self._policy("cispo", "cispo", "cispo_eps_clip_low 1, cispo_eps_clip_high 4 (defaults), token_mean",
                         self.policy_run("cispo", "token_mean"), {},
                         grid={"agg": ref.TOKEN_AGG, "cap_mode": ["relative", "absolute"]}),
            self._policy("clip_cov", "clip_cov", "clip_ratio=1.0 (every candidate chosen: SkyRL draws them with "
                         "torch.randperm), window (1, 5), token_mean",
                         self.policy_run("clip_cov", "token_mean", clip_cov={"clip_ratio": 1.0}),
                         {"clip_cov_ratio": 1.0}, more=ref.policy_grid(["ppo"], {}, {"agg": ref.TOKEN_AGG}),
                         note="SkyRL selects by the covariance of the advantages after the loss reduction has "
                         "scaled them, and multiplies the chosen tokens' loss by 0 (value and gradient)."),
            self._policy("kl_cov", "kl_cov", "kl_cov_frac=0.2, ppo_kl_coef=1.0, token_mean",
                         self.policy_run("kl_cov", "token_mean", kl_cov={"kl_cov_frac": 0.2, "ppo_kl_coef": 1.0}),
                         {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0},
                         note="SkyRL's loss reduction scales the advantages only, not the |log r| penalty."),
            *(self._policy(name, "dppo", f"dppo_type={kind!r}, delta_low = delta_high = {delta:g} (the authors' "
                           "recipe), token_mean",
                           self.policy_run("dppo", "token_mean",
                                           dppo={"dppo_type": kind, "delta_low": delta, "delta_high": delta}), {},
                           note="SkyRL's DPPO loss is the surrogate -M r A (its gradient the reference's "
                                "-sg(M r) A log pi)")
              for name, kind, delta in (("dppo_tv", "binary_tv", 0.15), ("dppo_kl", "binary_kl", 0.05))),
        ]

    def rollout_checks(self) -> list[Check]:
        out = []
        for label, correction, hp in (
                ("tis_ratio_type='token', token_tis_ratio_clip_high 2 (TIS)",
                 {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0},
                 {"rollout_correction": "tis", "tis_cap": 2.0}),
                ("token TIS capped at 5 with token_mask_is_threshold 0.5 / 5 (IcePop)",
                 {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 5.0,
                  "token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 5.0},
                 {"rollout_correction": "mis"}),
                ("sequence TIS capped at 5 with sequence_mask_metric='product' 0.5 / 5 (sequence IcePop)",
                 {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 5.0,
                  "sequence_mask_metric": "product", "product_mask_low": 0.5, "product_mask_high": 5.0},
                 {"rollout_correction": "seq_mis"})):
            out.append(self._policy("ppo", "regular", f"off_policy_correction: {label}, token_mean",
                                    self.policy_run("regular", "token_mean", rollout=True,
                                                    off_policy_correction=correction),
                                    hp, grid={"agg": ref.TOKEN_AGG,
                                              "rollout_correction": [None, "tis", "mis", "seq_mis"]},
                                    cases=rollout_batch, reads=ROLLOUT_READS))
        for label, correction, hp in (
                ("sequence_mask_metric='product', product_mask_low 0.5, product_mask_high 2 (defaults)",
                 {"sequence_mask_metric": "product"}, {"rollout_correction": "seq_rs", "mis_high": 2.0}),
                ("sequence_mask_metric='geometric', geo_mask_low 0.8, geo_mask_high 1.25",
                 {"sequence_mask_metric": "geometric", "geo_mask_low": 0.8, "geo_mask_high": 1.25},
                 {"rollout_correction": "geo_rs", "mis_low": 0.8, "mis_high": 1.25})):
            out.append(self._policy("ppo", "regular", f"off_policy_correction: {label} (rejection, no TIS), "
                                    "token_mean", self.policy_run("regular", "token_mean", rollout=True,
                                                                  off_policy_correction=correction),
                                    hp, grid={"agg": ref.TOKEN_AGG,
                                              "rollout_correction": [hp["rollout_correction"], None]},
                                    cases=rollout_batch, reads=ROLLOUT_READS))
        return out

    def advantage_checks(self) -> list[Check]:
        group = [ref.group_advantage("grpo", unbiased=u) for u in (True, False)] + [
            ref.group_advantage(k) for k in ("dr_grpo", "rloo")]
        out = []
        for algorithm, call, knob, run, conv in (
                ("grpo_advantage", "grpo", "grpo_norm_by_std=True", self.advantage_run("grpo"), group[0]),
                ("dr_grpo_advantage", "grpo", "grpo_norm_by_std=False",
                 self.advantage_run("grpo", grpo_norm_by_std=False), group[2]),
                ("rloo_advantage", "rloo", "defaults", self.advantage_run("rloo"), group[3])):
            out.append(Check(algorithm, f"AdvantageEstimatorRegistry.get({call!r})", knob, run, conv,
                             [c for c in group if c is not conv], advantage_batch, families=("typical", "lone"),
                             reads=ADV_READS, note=LONE if call == "grpo" else ""))
        for gamma in (1.0, 0.9):
            out.append(Check("reinforce_pp", "AdvantageEstimatorRegistry.get('reinforce++')", f"gamma={gamma:g}",
                             self.advantage_run("reinforce++", gamma=gamma), ref.reinforce_pp(gamma),
                             [ref.reinforce_pp(g) for g in (1.0, 0.9) if g != gamma], advantage_batch,
                             families=("typical",), reads=ADV_READS))
        for gamma, lam in ((1.0, 0.95), (0.9, 0.8)):
            for part in ("advantages", "returns"):
                cands = [ref.gae(part, gamma, lam, whiten=True)] if part == "advantages" else []
                out.append(Check("gae", "AdvantageEstimatorRegistry.get('gae')", f"{part}, gamma={gamma:g}, "
                                 f"lambd={lam:g}", self.advantage_run("gae", part, gamma=gamma, lambd=lam),
                                 ref.gae(part, gamma, lam), cands, families=("typical",), note=GAE_NOTE,
                                 reads="adv * mask as token rewards, ref_logp as values (padding included), mask"))
        return out


def _last_token_rewards(rewards, mask):
    """One outcome reward per row at the row's last unmasked token (column 0 on an empty row: the group
    estimators sum a row's token rewards, masked or not)."""
    out = np.zeros(mask.shape)
    for i, row in enumerate(mask):
        on = np.flatnonzero(row > 0)
        out[i, on[-1] if len(on) else 0] = rewards[i]
    return out
