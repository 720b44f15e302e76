"""verl's ``verl.trainer.ppo.core_algos``: policy losses by loss_mode, agg_loss modes, kl_penalty estimators, the
advantage estimators it registers (grpo and gae here; grpo_vectorized, rloo, rloo_vectorized, gpg and
reinforce_plus_plus through the ``advantage`` kind of ``harness.conform.kinds``) and the value loss, called as verl's
actor and trainer call them."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from spec.registry import PARTS

from harness.conform import kinds
from harness.conform.cases import ADV_READS, Check, advantage_batch, batch_of, gdpo_batch, rollout_batch
from harness.conform.targets import reference as ref
from harness.conform.targets.reference import t64

INSTALL = ("pip install --no-deps verl==0.9.1 && pip install tensordict==0.10.0 omegaconf==2.3.1 "
           "hydra-core==1.3.8 codetiming==1.4.0 ray==2.60.0")
#: verl's loss_agg_mode -> the reference's aggregation mode of the same meaning (token-sum has none).
VERL_AGG = {"token-mean": "token_mean", "seq-mean-token-sum": "seq_mean_token_sum",
            "seq-mean-token-mean": "seq_mean_token_mean", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
            "token-sum": None}
#: verl's registered outcome estimators checked as a callable of the advantage kind: adv_estimator -> the kind's
#: estimator (reinforce_plus_plus reads config.gamma).
ESTIMATORS = {"grpo_vectorized": "grpo", "rloo": "rloo", "rloo_vectorized": "rloo", "gpg": "gpg",
              "reinforce_plus_plus": "reinforce_pp"}
ESTIMATOR_NOTES = {
    "grpo_vectorized": "group_mean_std casts the rewards to float32 whatever their dtype (verl/utils/groupwise.py) "
                       "and gives a lone response mean 0 and std 1: its advantage is R / (1 + 1e-6) in float32.",
    "gpg": "verl scales R - mean by alpha = B / (number of non-zero rewards in the batch); GPG (2504.02546 Sec. 2) "
           "counts the responses of groups whose rewards vary. A lone response keeps its reward (mean 0)."}
#: How verl's trainer passes an estimator its inputs, as the advantage kind's binding names them.
ESTIMATOR_BINDING = {"rewards": "token_level_rewards", "group_index": "index", "mask": "response_mask"}
KL_NAMES = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3", "k3+": "k3",
            "abs": None}


def actor_config(**kw):
    """A verl ActorConfig as the FSDP actor builds it, with the loss settings ``kw``."""
    from verl.workers.config.actor import ActorConfig
    return ActorConfig(**{"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1, **kw})


class Target:
    name = "verl"

    def __init__(self):
        from harness.conform.targets import require
        self.ca = require("verl.trainer.ppo.core_algos", INSTALL)
        verl = require("verl", INSTALL)
        self.versions = {"verl": verl.__version__, "torch": torch.__version__.split("+")[0]}
        self.how = ("Policy losses are called through `get_policy_loss_fn(loss_mode)` with an `ActorConfig` as "
                    "verl's actor passes it (one data-parallel rank, empty `global_batch_info`); the gradient is "
                    "d loss / d log_prob by autograd, float64. Its clamps, named in the findings: log r to [-20, 20] "
                    "(`core_algos.py:1338` in vanilla), log s at 10 (`:1590` in gspo), ref - logp to [-20, 20] and "
                    "k3 to [-10, 10] (`:2242-2245` in kl_penalty).")

    # ---- callers ---------------------------------------------------------------------------------------------
    def policy_run(self, loss_mode, agg_mode, rollout_is=None, policy_loss=None, **cfg):
        """verl's loss ``loss_mode``; ``rollout_is`` (kwargs of compute_rollout_correction_weights) weights it by
        the rollout correction of old_logp against the batch's rollout_logp; ``policy_loss`` sets
        PolicyLossConfig fields (Clip-Cov, KL-Cov)."""
        if policy_loss is not None:
            from verl.workers.config.actor import PolicyLossConfig
            cfg["policy_loss"] = PolicyLossConfig(loss_mode=loss_mode, **policy_loss)
        config = actor_config(loss_agg_mode=agg_mode, **cfg)
        fn = self.ca.get_policy_loss_fn(loss_mode)

        def run(b):
            logp = t64(b.logp, grad=True)
            kw = {}
            if rollout_is is not None:
                from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
                kw["rollout_is_weights"], _ = compute_rollout_correction_weights(
                    t64(b.old_logp - b.extra["rollout_logp"]), t64(b.mask), **rollout_is)
            loss, _ = fn(t64(b.old_logp), logp, t64(b.adv), t64(b.mask), agg_mode, config, **kw)
            loss.backward()
            grad = logp.grad if logp.grad is not None else torch.zeros_like(logp)
            return float(loss.detach()), grad.numpy(), b
        return run

    def agg_run(self, mode):
        def run(b):
            mat = t64(b.logp, grad=True)
            loss = self.ca.agg_loss(loss_mat=mat, loss_mask=t64(b.mask), loss_agg_mode=mode)
            loss.backward()
            return float(loss.detach()), mat.grad.numpy(), b
        return run

    def kl_run(self, kind):
        def run(b):
            logp = t64(b.logp, grad=True)
            values = self.ca.kl_penalty(logp, t64(b.ref_logp), kind) * t64(b.mask)
            values.sum().backward()
            return values.detach().numpy(), logp.grad.numpy(), b
        return run

    def grpo_adv_run(self, norm):
        def run(b):
            rewards = np.zeros(b.mask.shape)
            rewards[:, 0] = b.rewards  # one outcome reward per response; the estimator sums over tokens
            index = np.array([f"p{r // b.group_size}" for r in range(len(b.mask))], dtype=object)
            adv, _ = self.ca.compute_grpo_outcome_advantage(t64(rewards), t64(b.mask), index,
                                                            norm_adv_by_std_in_grpo=norm)
            return adv.numpy(), None, b
        return run

    def gae_run(self, part, gamma, lam):
        def run(b):
            adv, ret = self.ca.compute_gae_advantage_return(t64(b.adv), t64(b.ref_logp), t64(b.mask), gamma, lam)
            return (adv if part == "advantages" else ret).numpy() * b.mask, None, b
        return run

    def estimator_run(self, name):
        """``get_adv_estimator_fn(name)`` as verl's trainer calls it: each response's reward at its last response
        token of token_level_rewards, the group ids as a NumPy array of uid strings, an AlgoConfig; in the dtype
        the advantage kind asks for."""
        from verl.trainer.config import AlgoConfig
        fn = self.ca.get_adv_estimator_fn(name)
        config = AlgoConfig(gamma=PARTS["reinforce_pp"]["gamma"])

        def run(b, dtype):
            used = kinds.rounded(b, "advantage", dtype)
            on = used.mask > 0
            last = on & (np.cumsum(on[:, ::-1], 1)[:, ::-1] == 1)
            rewards = np.where(last, kinds.rewards_of(used)[:, None], 0.0)
            cast = lambda x: t64(x).to(getattr(torch, dtype))  # noqa: E731
            index = np.array([f"p{g}" for g in kinds.groups_of(used)], dtype=object)
            adv, _ = fn(token_level_rewards=cast(rewards), response_mask=cast(used.mask), index=index, config=config)
            return np.where(on, adv.double().numpy(), 0.0), None, used
        return run

    def gdpo_run(self, weights):
        """``compute_gdpo_outcome_advantage`` as verl's trainer calls it: two reward keys in non_tensor_batch (each
        response's reward at its last response token), prompts and an attention mask in batch, the group ids as
        uid strings, an AlgoConfig naming the keys and ``weights``."""
        from verl.trainer.config import AlgoConfig
        config = AlgoConfig(gdpo_reward_keys=["r1", "r2"], gdpo_reward_weights=list(weights))

        def run(b):
            rewards = ref.gdpo_rewards(b)
            prompts = torch.zeros((len(b.mask), 2), dtype=torch.long)
            batch = {"prompts": prompts, "attention_mask": torch.cat([torch.ones_like(prompts),
                                                                      torch.as_tensor(b.mask, dtype=torch.long)], 1)}
            index = np.array([f"p{r // b.group_size}" for r in range(len(b.mask))], dtype=object)
            adv, _ = self.ca.compute_gdpo_outcome_advantage(
                t64(np.zeros(b.mask.shape)), t64(b.mask), index, config=config, batch=batch,
                non_tensor_batch={"r1": rewards[:, 0], "r2": rewards[:, 1]})
            return adv.double().numpy() * b.mask, None, b
        return run

    def value_run(self, clip, mode):
        def run(b):
            v = t64(b.logp, grad=True)
            loss, _ = self.ca.compute_value_loss(v, t64(b.ref_logp), t64(b.old_logp), t64(b.mask), clip, mode)
            loss.backward()
            return float(loss.detach()), v.grad.numpy(), b
        return run

    # ---- checks ----------------------------------------------------------------------------------------------
    def rejection_run(self, rollout_rs, threshold, **cfg):
        """vanilla on the response mask that ``compute_rollout_rejection_mask`` leaves (old_logp against the
        batch's rollout_logp), as verl's trainer replaces the batch's response_mask before the actor's loss."""
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask
        loss = self.policy_run("vanilla", "token-mean", **cfg)

        def run(b):
            kept, _ = compute_rollout_rejection_mask(t64(b.old_logp - b.extra["rollout_logp"]), t64(b.mask),
                                                     rollout_rs=rollout_rs, rollout_rs_threshold=threshold)
            value, grad, _ = loss(replace(b, mask=kept.numpy()))
            return value, grad, b
        return run

    def checks(self) -> list[Check]:
        return (self.policy_checks() + self.beyond_seed_checks() + self.mode_2026_checks() + self.agg_checks()
                + self.kl_checks() + self.advantage_checks() + self.estimator_checks())

    def mode_2026_checks(self) -> list[Check]:
        """DPPO-Binary-TV and -KL (loss modes dppo_tv, dppo_kl) and rejection sampling of whole rows
        (``rollout_rs`` seq_sum_k1, seq_mean_k1: the reference's seq_rs and geo_rs)."""
        out = []
        for name, delta in (("dppo_tv", 0.15), ("dppo_kl", 0.05)):
            for c, why in ((None, "clip_ratio_c 3 (ActorConfig's default)"), (1e9, "clip_ratio_c=1e9 (no truncation)")):
                out.append(self._policy(name, name, f"clip_ratio_low = clip_ratio_high = {delta:g} (the authors' "
                                        f"recipe), {why}, token-mean",
                                        self.policy_run(name, "token-mean", clip_ratio_low=delta, clip_ratio_high=delta,
                                                        **({} if c is None else {"clip_ratio_c": c})),
                                        {}, {"agg": ref.TOKEN_AGG},
                                        note="verl's DPPO truncates the ratio in its weight at clip_ratio_c "
                                             "(`torch.clamp(ratio, max=clip_ratio_c)`), which ActorConfig sets to 3 "
                                             "for the dual clip; its thresholds are clip_ratio_low and "
                                             "clip_ratio_high (0.2 each by default: clip_ratio alone leaves them)."))
        for rs, threshold, correction, (low, high) in (
                ("seq_sum_k1", "0.5_2.0", "seq_rs", (0.5, 2.0)), ("seq_sum_k1", "0.5_5.0", "seq_rs", (0.5, 5.0)),
                ("seq_mean_k1", "0.8_1.25", "geo_rs", (0.8, 1.25))):
            hp = {"beta": 0.0, "agg": "token_mean", "rollout_correction": correction, "mis_low": low, "mis_high": high}
            grid = {"agg": ref.TOKEN_AGG, "rollout_correction": [correction, None],
                    "mis_low": sorted({low, 1 / high}), "mis_high": sorted({high, 1 / low})}
            out.append(self._policy("grpo", "vanilla", f"rollout_rs={rs!r}, rollout_rs_threshold={threshold!r}, "
                                    "clip_ratio_c=1e9, token-mean (the response mask replaced, as the trainer does)",
                                    self.rejection_run(rs, threshold, clip_ratio_c=1e9), hp, grid, cases=rollout_batch,
                                    note="verl's k1 statistic is -log rho = log(pi_rollout / pi_old): its lower_upper "
                                         "band bounds the inverse of the reference's weight rho."))
        return out

    def estimator_checks(self) -> list[Check]:
        """Each registered estimator of ESTIMATORS against the advantage kind's reference, cases and named
        variants, in float64, float32 and bfloat16 as a user callable of that kind is checked."""
        out = []
        for name, estimator in ESTIMATORS.items():
            adapter = {"kind": "advantage", "estimator": estimator}
            for check in kinds.checks("advantage", f"get_adv_estimator_fn({name!r})", adapter, ESTIMATOR_BINDING,
                                      self.estimator_run(name)):
                check.knob = f"adv_estimator={name}, {check.knob}"
                check.note = " ".join(filter(None, (ESTIMATOR_NOTES.get(name, ""), check.note)))
                out.append(check)
        return out

    def beyond_seed_checks(self) -> list[Check]:
        """CISPO, GPG, GMPO (geo_mean), Clip-Cov, KL-Cov and the rollout corrections (TIS, IcePop)."""
        agg = {"agg": ref.TOKEN_AGG}
        no_dual = {"clip_ratio_c": 1e9}
        out = [
            self._policy("cispo", "cispo", "clip_ratio_low 1.0, clip_ratio_high 4.0, token-mean",
                         self.policy_run("cispo", "token-mean", clip_ratio_low=1.0, clip_ratio_high=4.0), {},
                         {**agg, "cap_mode": ["relative", "absolute"]}),
            self._policy("gpg", "gpg", "token-mean", self.policy_run("gpg", "token-mean"), {}, agg),
            self._policy("gmpo", "geo_mean", "clip_ratio 0.4 (log space), loss_agg_mode ignored",
                         self.policy_run("geo_mean", "token-mean", clip_ratio_low=0.4, clip_ratio_high=0.4), {}, agg,
                         seq_adv=True, rows_counted=True,
                         note="verl's geo_mean takes torch.mean over every row, fully masked ones included."),
            self._policy("clip_cov", "clip_cov", "clip_cov_ratio=1.0 (every candidate chosen: verl draws them "
                         "with torch.randperm), window (1, 5)",
                         self.policy_run("clip_cov", "token-mean", policy_loss={"clip_cov_ratio": 1.0}),
                         {"clip_cov_ratio": 1.0}, agg,
                         note="verl multiplies the chosen tokens' loss by 0 (value and gradient); Cui et al. "
                         "detach them (the value stays, the gradient goes)."),
            self._policy("kl_cov", "kl_cov", "kl_cov_ratio=0.2, ppo_kl_coef=1.0",
                         self.policy_run("kl_cov", "token-mean", policy_loss={"kl_cov_ratio": 0.2,
                                                                              "ppo_kl_coef": 1.0}),
                         {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0}, agg),
        ]
        for label, rollout_is, hp in (
                ("rollout_is='token', threshold 2.0 (TIS)", {"rollout_is": "token", "rollout_is_threshold": 2.0},
                 {"rollout_correction": "tis", "tis_cap": 2.0}),
                ("rollout_is='token', threshold '0.5_5.0' (IcePop)",
                 {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}, {"rollout_correction": "mis"}),
                ("rollout_is='sequence', threshold '0.5_5.0' (sequence IcePop)",
                 {"rollout_is": "sequence", "rollout_is_threshold": "0.5_5.0"}, {"rollout_correction": "seq_mis"})):
            out.append(self._policy("grpo", "vanilla", f"{label}, clip_ratio_c=1e9, token-mean",
                                    self.policy_run("vanilla", "token-mean", rollout_is, **no_dual),
                                    {"beta": 0.0, "agg": "token_mean", **hp},
                                    {"agg": ref.TOKEN_AGG, "rollout_correction": [None, "tis", "mis", "seq_mis"]},
                                    cases=rollout_batch))
        return out

    def _policy(self, name, call, knob, run, ref_hp, grid, seq_adv=None, names=None, note="", cases=None,
                rows_counted=False):
        conv = ref.policy(name, **ref_hp)
        cands = ref.policy_grid(names or [name], ref_hp, grid, rows_counted=rows_counted, exclude=(name, ref_hp))
        return Check(name, f"get_policy_loss_fn({call!r})", knob, run, conv, cands,
                     cases or (lambda s, f: batch_of(s, f, seq_adv=seq_adv)),
                     exact=ref.exact_policy(name, **ref_hp), note=note)

    def policy_checks(self) -> list[Check]:
        dual = {"agg": ref.TOKEN_AGG, "dual_clip": [None, 3.0]}
        out = [
            self._policy("ppo", "vanilla", "verl defaults (clip_ratio 0.2, clip_ratio_c 3, token-mean)",
                         self.policy_run("vanilla", "token-mean"), {}, dual),
            self._policy("ppo", "vanilla", "clip_ratio_c=10 (dual clip)",
                         self.policy_run("vanilla", "token-mean", clip_ratio_c=10.0), {"dual_clip": 10.0},
                         {"agg": ref.TOKEN_AGG, "dual_clip": [None, 10.0]}),
            self._policy("grpo", "vanilla", "verl defaults (token-mean, clip_ratio_c 3); KL loss checked apart",
                         self.policy_run("vanilla", "token-mean"), {"beta": 0.0}, dual),
            self._policy("dapo", "vanilla", "DAPO recipe: clip_ratio_low 0.2, clip_ratio_high 0.28, token-mean",
                         self.policy_run("vanilla", "token-mean", clip_ratio_low=0.2, clip_ratio_high=0.28), {},
                         dual),
            self._policy("dr_grpo", "vanilla", "seq-mean-token-sum-norm (loss_scale_factor unset: L = padded width)",
                         self.policy_run("vanilla", "seq-mean-token-sum-norm"), {}, dual),
            self._policy("gspo", "gspo", "clip 3e-4/4e-4, verl's default loss_agg_mode token-mean",
                         self.policy_run("gspo", "token-mean", clip_ratio_low=3e-4, clip_ratio_high=4e-4), {},
                         {"agg": ref.TOKEN_AGG}, seq_adv=True, names=["gspo", "gspo_token"]),
            self._policy("gspo", "gspo", "clip 3e-4/4e-4, loss_agg_mode=seq-mean-token-mean",
                         self.policy_run("gspo", "seq-mean-token-mean", clip_ratio_low=3e-4, clip_ratio_high=4e-4),
                         {}, {"agg": ref.TOKEN_AGG}, seq_adv=True, names=["gspo", "gspo_token"],
                         note="verl clamps the log of the sequence ratio at 10 (`torch.clamp(..., max=10.0)`)."),
            self._policy("gspo_token", "gspo", "token advantages, loss_agg_mode=seq-mean-token-mean",
                         self.policy_run("gspo", "seq-mean-token-mean", clip_ratio_low=3e-4, clip_ratio_high=4e-4),
                         {}, {"agg": ref.TOKEN_AGG}, seq_adv=False, names=["gspo_token"]),
            self._policy("sapo", "sapo", "loss_agg_mode=seq-mean-token-mean (tau_pos 1, tau_neg 1.05)",
                         self.policy_run("sapo", "seq-mean-token-mean"), {}, {"agg": ref.TOKEN_AGG}),
        ]
        for mode, agg in VERL_AGG.items():
            if agg is None:
                continue
            out.append(self._policy("grpo", "vanilla", f"loss_agg_mode={mode}, clip_ratio_c=1e9 (dual clip off)",
                                    self.policy_run("vanilla", mode, clip_ratio_c=1e9), {"beta": 0.0, "agg": agg},
                                    {"agg": ref.TOKEN_AGG}))
            if mode != "seq-mean-token-mean":
                out.append(self._policy("sapo", "sapo", f"loss_agg_mode={mode}", self.policy_run("sapo", mode),
                                        {"agg": agg}, {"agg": ref.TOKEN_AGG}))
        return out

    def agg_checks(self) -> list[Check]:
        out = []
        for mode, agg in VERL_AGG.items():
            conv = None if agg is None else ref.aggregate(agg)
            cands = [c for c in ref.all_aggregations() if conv is None or c.label != conv.label]
            out.append(Check("aggregation", "agg_loss", f"loss_agg_mode={mode}", self.agg_run(mode), conv, cands,
                             families=("typical",), reads="logp as the loss matrix, mask"))
        return out

    def kl_checks(self) -> list[Check]:
        cands = [ref.kl(k) for k in ("k1", "k2", "k3")]
        out = []
        for name, kind in KL_NAMES.items():
            conv = None if kind is None else ref.kl(kind)
            out.append(Check("kl", "kl_penalty", f"kl_penalty={name!r}", self.kl_run(name), conv,
                             [c for c in cands if conv is None or c.label != conv.label],
                             families=("typical", "far_ref"), reads="logp, ref_logp, mask"))
        return out

    def advantage_checks(self) -> list[Check]:
        adv_cands = [ref.group_advantage("grpo", unbiased=u) for u in (True, False)] + [ref.group_advantage("dr_grpo")]
        out = [Check("grpo_advantage", "compute_grpo_outcome_advantage", "norm_adv_by_std_in_grpo=True",
                     self.grpo_adv_run(True), ref.group_advantage("grpo"), adv_cands[1:], advantage_batch,
                     families=("typical", "lone"), reads=ADV_READS),
               Check("dr_grpo_advantage", "compute_grpo_outcome_advantage", "norm_adv_by_std_in_grpo=False",
                     self.grpo_adv_run(False), ref.group_advantage("dr_grpo"), adv_cands[:2], advantage_batch,
                     families=("typical", "lone"), reads=ADV_READS)]
        weights = (1.0, 0.5)  # equal weights cancel two binary rewards' group advantages in a group of two, to
        # the eps terms' residue, which the batch standardisation then scales up: no convention is held there
        out.append(Check("gdpo_advantage", "compute_gdpo_outcome_advantage", f"two reward keys, "
                         f"gdpo_reward_weights={list(weights)}", self.gdpo_run(weights),
                         ref.gdpo_advantage(weights), [ref.gdpo_advantage(weights, whiten=True)], gdpo_batch,
                         families=("typical",), reads=ADV_READS + "; extra reward_2[:, 0] as the second reward",
                         dtype="float32",
                         note="verl standardises the weighted sum with masked_whiten over the batch's tokens "
                              "(`verl_F.masked_whiten`); the rewards pass through float32."))
        for gamma, lam in ((1.0, 0.95), (0.9, 0.8)):
            for part in ("advantages", "returns"):
                cands = [ref.gae(part, gamma, lam, whiten=True)] if part == "advantages" else []
                out.append(Check("gae", "compute_gae_advantage_return", f"{part}, gamma={gamma:g}, lam={lam:g}",
                                 self.gae_run(part, gamma, lam), ref.gae(part, gamma, lam), cands,
                                 families=("typical",), reads="adv as token rewards, ref_logp as values, mask"))
        for clip in (0.2, 0.5):
            cands = [ref.value_loss(c, a) for c in (0.2, 0.5) for a in ("token_mean", "seq_mean_token_mean")
                     if (c, a) != (0.2, "token_mean")]
            out.append(Check("value_loss", "compute_value_loss", f"cliprange_value={clip:g}, token-mean",
                             self.value_run(clip, "token-mean"), ref.value_loss(0.2), cands, families=("typical",),
                             note="The reference clips the value at d = 0.2; verl's critic default is 0.5.",
                             reads="logp as values, old_logp as old values, ref_logp as returns, mask"))
        return out

