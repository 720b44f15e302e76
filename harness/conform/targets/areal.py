"""AReaL's ``areal.utils.functional.functional`` (its own virtualenv, workers/areal.py): ``ppo_actor_loss_fn``
(PPO, DAPO clip-higher, dual clip, GSPO by ``importance_sampling_level="sequence"``), ``sapo_loss_fn``, the
DPO engine's ``dpo_pair_logratios`` + ``dpo_preference_loss`` and ``areal.utils.data.KLEstimator``."""
from __future__ import annotations

from harness.conform.cases import Check, batch_of
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import RemoteTarget, kl_checks

DPO_READS = "rows 2k / 2k+1 as pair k's chosen / rejected response: logp (policy), ref_logp (reference), mask"
DPO_ARRAYS = ("logp", "ref_logp", "mask")


class Target(RemoteTarget):
    name = "areal"

    how = ("`ppo_actor_loss_fn` and `sapo_loss_fn` on [B, T] tensors with a boolean loss_mask, the "
           "decoupled proximal policy off (proximal_logprobs = old_logprobs, rejection_sampling=None); "
           "DPO as AReaL's DPO engine combines `dpo_pair_logratios` (each row packed after one prompt "
           "token) and `dpo_preference_loss`, averaged over pairs. Gradient d loss / d log_prob by "
           "autograd, float64 (AReaL casts the DPO logits to float32: differences near 1e-7), in AReaL's "
           "own virtualenv (torch only; its package __init__ files bypassed).")

    def _policy(self, name, call, kw, knob, ref_hp, seq_adv=None, names=None, grid=None, note=""):
        op = "sapo" if call == "sapo_loss_fn" else "ppo"
        return ref.policy_check(name, call, knob, self.loss_run(op, kw), ref_hp, grid or {"agg": ref.TOKEN_AGG},
                                names, seq_adv, note=note)

    def checks(self) -> list[Check]:
        dual = {"agg": ref.TOKEN_AGG, "dual_clip": [None, 3.0]}
        ppo = "ppo_actor_loss_fn"
        out = [
            self._policy("ppo", ppo, {"eps_clip": 0.2}, "eps_clip=0.2", {}, grid=dual),
            self._policy("ppo", ppo, {"eps_clip": 0.2, "c_clip": 3.0}, "eps_clip=0.2, c_clip=3 (dual clip)",
                         {"dual_clip": 3.0}, grid=dual),
            self._policy("dapo", ppo, {"eps_clip": 0.2, "eps_clip_higher": 0.28}, "eps_clip=0.2, "
                         "eps_clip_higher=0.28 (clip-higher)", {}, grid=dual),
            self._policy("gspo", ppo, {"eps_clip": 3e-4, "eps_clip_higher": 4e-4,
                                       "importance_sampling_level": "sequence"},
                         "importance_sampling_level='sequence', eps_clip 3e-4, eps_clip_higher 4e-4", {},
                         seq_adv=True, names=["gspo", "gspo_token"]),
            self._policy("gspo_token", ppo, {"eps_clip": 3e-4, "eps_clip_higher": 4e-4,
                                             "importance_sampling_level": "sequence"},
                         "importance_sampling_level='sequence', eps_clip 3e-4, eps_clip_higher 4e-4, per-token "
                         "advantages", {}, seq_adv=False, names=["gspo", "gspo_token"],
                         note="With an advantage per token, GSPO-token (Eq. 13) is the paper's form."),
            self._policy("sapo", "sapo_loss_fn", {"tau_pos": 1.0, "tau_neg": 1.05}, "tau_pos 1, tau_neg 1.05", {}),
        ]
        for beta in (0.1, 0.5):
            out.append(Check("dpo", "dpo_pair_logratios + dpo_preference_loss", f"loss_type='sigmoid', beta={beta:g}",
                             self.loss_run("dpo", {"beta": beta}, DPO_ARRAYS), ref.dpo(beta),
                             [ref.dpo(b) for b in (0.1, 0.5) if b != beta], dpo_batch, reads=DPO_READS,
                             exact=ref.exact_dpo(beta)))
        return out + kl_checks(self, "KLEstimator", {"k1": "k1", "k2": "k2", "k3": "k3"}, gradient=False,
                               note="AReaL's PPO actor puts -kl_ctl * KLEstimator(old_logp, ref_logp) in the "
                               "rewards, without a gradient: the values are checked. It computes in float32 and "
                               "clamps every estimator's value to [-10, 10] (apply_clamp=True).")


def dpo_batch(seed, family):
    """A generated batch cut to an even number of rows, read as chosen/rejected pairs (group size 2)."""
    b = batch_of(seed, family)
    rows = len(b.mask) - len(b.mask) % 2 or 2
    return b.take(rows=[r % len(b.mask) for r in range(rows)], group_size=2)
