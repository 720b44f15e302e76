"""Unsloth's GRPO loss, ``unsloth_zoo.rl_replacements.grpo_compute_loss``, for each loss_type it implements and
importance_sampling_level, driven out of process (``.venv-targets/unsloth``, ``workers/unsloth.py``) on the
generated batches' per-token log-probs; the gradient is d loss / d per-token log-prob.

The worker's op ``loss``: kw = grpo_compute_loss's keywords plus ``beta`` (num_items_in_batch defaults to the
batch's token count); arrays logp, old_logp, ref_logp, mask (float64 [B, T]), adv ([B], one per response) and
optionally rollout_logp (the rollout engine's log-probs, passed as sampling_per_token_logps).
Reply {"loss": float, "grad": [B, T] d loss / d logp}."""
from __future__ import annotations

import numpy as np

from harness.conform.cases import Batch, Check, batch_of, rollout_batch
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import RemoteTarget, loss_and_grad

MAX_COMPLETION = 8  # max_completion_length passed to dr_grpo: Dr.GRPO's constant L
AGGS = ["token_mean", "group_token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm",
        "group_seq_sum_token_mean"]
KLS = ["k3", "k3_unbiased"]
BETA = 0.04  # DeepSeekMath's KL weight
GSPO = {"eps_low": 3e-4, "eps_high": 4e-4}
CISPO_NOTE = ("CISPO's epsilon_high is an absolute cap in TRL, Liger and Unsloth (the weight is at most "
              "epsilon_high) and a relative one (1 + eps) in MiniMax-M1's Eq. 5, verl and SkyRL.")
FAMILIES_NOTE = ("loss_type vespo is not driven: it takes the trainer's get_gamma_weights (TRL's), which this "
                 "environment does not install. Its clamps, named in the findings: ref - new to [-20, 20] and the KL "
                 "term to [-10, 10] (`rl_replacements.py:1138, 1144`).")
#: What Unsloth's GRPO trainer forwards with beta > 0 (rl_replacements.py: ``kwargs["use_bias_correction_kl"] =
#: getattr(trainer.args, "use_bias_correction_kl", False)``): TRL's GRPOConfig default, True.
TRAINER_KL = {"use_bias_correction_kl": True}
KL_NOTE = ("Unsloth clamps ref - new to [-20, 20] and each token's k3 term to [-10, 10] (TRL does not): where the "
           "clamp bites, the KL value is capped and its gradient is 0.")


def row_advantages(b: Batch) -> np.ndarray:
    """One advantage per response, as GRPO trainers pass them (the generated batch's first column)."""
    return b.adv[:, 0] if b.adv.size else np.zeros(len(b.adv))


def seq_batch(seed: int, family: str) -> Batch:
    """A generated batch with one advantage per response."""
    return batch_of(seed, family, seq_adv=True)


def rollout_seq_batch(seed: int, family: str) -> Batch:
    """A generated batch with one advantage per response and the rollout engine's log-probs (verl's cases)."""
    b = rollout_batch(seed, family)
    b.adv = np.repeat(row_advantages(b)[:, None], b.mask.shape[1], 1)
    return b


class Target(RemoteTarget):
    name = "unsloth"

    timeout_s = 180.0  # the first call waits for transformers and datasets
    how = ("Each loss is `grpo_compute_loss(ref, new, old, sampling_per_token_logps, input_ids, mask, beta, "
           "advantages, **kw)` as Unsloth's GRPO trainer calls it for one micro-batch (one advantage per "
           "response, num_items_in_batch the batch's token count, gradient accumulation 1; "
           "sampling_per_token_logps None except in the vLLM importance-sampling checks, which pass the "
           "rollout engine's log-probs), in float64 in its own virtualenv (unsloth_zoo imported past its "
           "package __init__); the gradient is d loss / d new by autograd. " + FAMILIES_NOTE)

    def run(self, kw: dict):
        def run(b: Batch):
            rollout = {"rollout_logp": b.extra["rollout_logp"]} if "rollout_logp" in b.extra else {}
            out = self.worker.call("loss", kw, logp=b.logp, old_logp=b.old_logp, ref_logp=b.ref_logp,
                                   adv=row_advantages(b), mask=b.mask, **rollout)
            value, grad = loss_and_grad(self.name, out, b.logp.shape)
            return value, grad, b
        return run

    def _check(self, name, knob, kw, ref_hp, grid, names=None, note=""):
        call = "grpo_compute_loss(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"
        return grpo_check(name, call, knob, self.run(kw), ref_hp, grid, names, note)

    def checks(self) -> list[Check]:
        return loss_type_checks(self._check, kl_note=KL_NOTE, trainer_kl=TRAINER_KL) + self.rollout_checks()

    def rollout_checks(self) -> list[Check]:
        """vLLM importance-sampling correction (use_vllm, vllm_importance_sampling_correction) by mode, on the bnpo
        loss (a token mean, which the reference shares: the sequence means' empty-row difference stays apart)."""
        on = {"loss_type": "bnpo", "beta": 0.0, "use_vllm": True, "vllm_importance_sampling_correction": True}
        grid = {"agg": AGGS, "rollout_correction": ["tis", "mis", "seq_mis"]}
        out = []
        for knob, kw, hp in (
                ("mode 'token_truncate', clip_max 2", {"vllm_importance_sampling_mode": "token_truncate",
                                                       "vllm_importance_sampling_clip_max": 2.0},
                 {"rollout_correction": "tis", "tis_cap": 2.0}),
                ("mode 'token_mask', clip 0.5 / 5", {"vllm_importance_sampling_mode": "token_mask",
                                                     "vllm_importance_sampling_clip_min": 0.5,
                                                     "vllm_importance_sampling_clip_max": 5.0},
                 {"rollout_correction": "mis"}),
                ("Unsloth's defaults: mode 'sequence_mask', clip_max 3, no clip_min", {},
                 {"rollout_correction": "seq_mis", "mis_low": 0.0, "mis_high": 3.0})):
            call = "grpo_compute_loss(" + ", ".join(f"{k}={v!r}" for k, v in {**on, **kw}.items()) + ")"
            out.append(grpo_check("grpo", call, "vLLM importance sampling, " + knob, self.run({**on, **kw}),
                                  {"beta": 0.0, "agg": "token_mean", **hp}, grid, cases=rollout_seq_batch,
                                  reads_more=", rollout_logp (the rollout engine's log-probs)"))
        return out


def grpo_check(name, call, knob, run, ref_hp, grid, names=None, note="", cases=None, tolerance=None,
               reads_more="") -> Check:
    """A check against registry algorithm ``name`` with ``ref_hp`` (Dr.GRPO's L = MAX_COMPLETION), candidates
    over ``grid`` (and with empty rows counted), on ``cases`` (default: one advantage per row)."""
    hp = {"max_len": MAX_COMPLETION, **ref_hp}
    cands = ref.policy_grid(names or [name], hp, grid, rows_counted=True, exclude=(name, hp))
    reads = ("logp, old_logp, adv[:, 0] (one advantage per response), mask" + (", ref_logp" if hp.get("beta") else "")
             + reads_more)
    return Check(name, call, knob, run, ref.policy(name, **hp), cands, cases or seq_batch,
                 exact=ref.exact_policy(name, **hp),
                 note=note, reads=reads, **({"tolerance": tolerance} if tolerance else {}))


def loss_type_checks(check, kl_note: str = "", bias_note: str = "", trainer_kl: dict | None = None) -> list[Check]:
    """The checks of a TRL-style GRPO loss (Unsloth's and Liger's take TRL's keyword names): each loss_type with
    beta 0 and 0.04 (with beta > 0 the KL estimators are candidates, and the engine's far_ref family moves the
    reference log-probs), the bias-corrected KL, delta, and GSPO as importance_sampling_level='sequence'.
    ``check(name, knob, kw, ref_hp, grid, names, note)``. ``trainer_kl``: the KL keywords a trainer forwards with
    beta > 0; the beta > 0 checks pass them, and one more check calls with the function's own default instead."""
    seq = {"epsilon_low": 3e-4, "epsilon_high": 4e-4, "importance_sampling_level": "sequence"}
    dr = {"loss_type": "dr_grpo", "max_completion_length": MAX_COMPLETION}
    out = []
    for beta in (0.0, BETA):
        b, knob = {"beta": beta}, f", beta={beta:g}"
        kw = {**b, **(trainer_kl or {})} if beta else b
        if beta and trainer_kl:
            knob += ", " + ", ".join(f"{k}={v!r}" for k, v in trainer_kl.items()) + " (as the trainer passes it)"
        kl = {"kl": KLS} if beta else {}
        note = {"note": kl_note} if beta else {}
        out += [
            check("grpo", "loss_type='grpo'" + knob, {"loss_type": "grpo", **kw}, b, {"agg": AGGS, **kl}, **note),
            check("grpo", "loss_type='bnpo' (read as grpo with token_mean)" + knob, {"loss_type": "bnpo", **kw},
                  {"agg": "token_mean", **b}, {"agg": AGGS, **kl}, **note),
            check("dr_grpo", f"loss_type='dr_grpo', max_completion_length={MAX_COMPLETION}" + knob, {**dr, **kw},
                  b, {"agg": AGGS, **kl}, **note),
            check("dapo", "loss_type='dapo', epsilon_high=0.28" + knob,
                  {"loss_type": "dapo", "epsilon_high": 0.28, **kw}, b, {"agg": AGGS, **kl}, **note),
            check("cispo", "loss_type='cispo', epsilon_high=4.0" + knob,
                  {"loss_type": "cispo", "epsilon_high": 4.0, **kw}, b,
                  {"agg": AGGS, "cap_mode": ["relative", "absolute"], **kl},
                  note=" ".join(filter(None, [CISPO_NOTE, note.get("note")]))),
            check("sapo", "loss_type='sapo' (temperatures 1.0 / 1.05)" + knob, {"loss_type": "sapo", **kw}, b,
                  {"agg": AGGS, **kl}, **note),
            check("gspo", "loss_type='grpo', importance_sampling_level='sequence', epsilon 3e-4/4e-4" + knob,
                  {"loss_type": "grpo", **seq, **kw}, {**GSPO, **b}, {"agg": AGGS, **kl},
                  names=["gspo", "gspo_token"], **note),
        ]
    if trainer_kl:
        direct = check("grpo", "loss_type='grpo', beta=0.04, use_bias_correction_kl unset: the function's own default "
                       "(False), which a direct caller gets; the trainer passes TRL's default (True)",
                       {"loss_type": "grpo", "beta": BETA}, {"beta": BETA}, {"agg": AGGS, "kl": KLS}, note=kl_note)
    else:
        direct = check("grpo", "loss_type='grpo', beta=0.04, use_bias_correction_kl=True",
                       {"loss_type": "grpo", "beta": BETA, "use_bias_correction_kl": True},
                       {"beta": BETA, "kl": "k3_unbiased"}, {"agg": AGGS, "kl": KLS},
                       note=" ".join(filter(None, [kl_note, bias_note])))
    return out + [
        direct,
        check("grpo", "loss_type='grpo', delta=1.5 (two-sided clip), beta=0",
              {"loss_type": "grpo", "delta": 1.5, "beta": 0.0}, {"delta": 1.5, "beta": 0.0},
              {"agg": AGGS, "delta": [1.5, None]}),
        check("gspo", "loss_type='dapo', importance_sampling_level='sequence', epsilon 3e-4/4e-4, beta=0",
              {"loss_type": "dapo", **seq, "beta": 0.0}, GSPO, {"agg": AGGS}, names=["gspo", "gspo_token"]),
        check("gspo", "loss_type='dr_grpo', importance_sampling_level='sequence', epsilon 3e-4/4e-4, beta=0",
              {**dr, **seq, "beta": 0.0}, GSPO, {"agg": AGGS}, names=["gspo", "gspo_token"]),
        check("luspo", "loss_type='luspo', importance_sampling_level='sequence', epsilon 2e-3/2.5e-3, beta=0",
              {"loss_type": "luspo", "epsilon_low": 2e-3, "epsilon_high": 2.5e-3,
               "importance_sampling_level": "sequence", "beta": 0.0}, {}, {"agg": AGGS}, names=["luspo", "gspo"]),
    ]
