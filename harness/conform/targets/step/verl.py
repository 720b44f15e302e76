"""verl 0.9.1's actor update for one optimisation step, driven through verl's own code. 0.9.1 has no
``workers/actor/dp_actor.py``; its actor trains through the engine workers, as read in the installed source:

- ``trainer/ppo/ray_trainer.py::RayPPOTrainer._update_actor`` pads nothing away from the response width
  (``workers/utils/padding.py::left_right_2_no_padding`` keeps ``max_response_len`` = the batch's padded width) and
  sets ``global_batch_size = ppo_mini_batch_size * rollout.n``: every row of the mini-batch, masked or not;
- ``workers/engine_workers.py::TrainingWorker.train_mini_batch`` gives each data-parallel rank
  ``mini_batch_size // dp`` rows;
- ``workers/engine/fsdp/transformer_impl.py::FSDPEngine.forward_backward_batch`` all-reduces
  ``batch_num_tokens = sum(loss_mask)`` over the ranks, sets ``dp_size``, splits the rank's rows with
  ``workers/engine/utils.py::prepare_micro_batches`` and calls ``loss.backward()`` per micro-batch (gradients sum);
  FSDP then averages the ranks' gradients;
- ``workers/utils/losses.py::ppo_loss`` passes dp_size, batch_num_tokens, global_batch_size and
  ``loss_scale_factor`` to the policy loss, whose ``trainer/ppo/core_algos.py::agg_loss`` divides by them.

Here ``prepare_micro_batches`` (fixed micro-batch size) and ``ppo_loss`` are verl's; the rank split, the token
all-reduce, the backward per micro-batch and the ranks' mean are simulated as the engine does them."""
from __future__ import annotations

import numpy as np
import torch

from harness.conform.cases import STEP_WIDTH, StepCheck
from harness.conform.targets import reference as ref
from harness.conform.targets.reference import t64
from harness.conform.targets.verl import INSTALL, actor_config

NO_DUAL = {"clip_ratio_c": 1e9}  # verl's dual clip (c = 3) off: the paper's losses have none
ROWS_NOTE = ("The trainer passes global_batch_size = ppo_mini_batch_size x rollout.n, every row of the mini-batch, so "
             "fully masked rows count in the mean over sequences: factor = rows with tokens / rows (6/8 in "
             "masked_rows). One loss call without the trainer's counts (the loss-level report) counts only rows "
             "with tokens and agrees. Such rows occur in verl itself: `trainer/ppo/padding_utils.py::"
             "upsample_batch_to_divisible_size` appends rows with an all-zero response_mask to make the batch "
             "divisible by the data-parallel size (as read; not driven here).")
TOKENS_NOTE = "batch_num_tokens is the all-reduced token count and dp_size undoes FSDP's mean: exact at every split."


def _micro_batch_input(b, rows):
    """The TensorDict a rank holds after left_right_2_no_padding: a 1-token prompt, the response padded to the
    batch's width, attention over prompt and response, and the loss fields."""
    from tensordict import TensorDict
    lens = (b.mask[rows] > 0).sum(1)  # contiguous response masks: the response length is the mask's sum
    attention = np.concatenate([np.ones((len(rows), 1)), np.arange(b.max_len)[None, :] < lens[:, None]], 1)
    return TensorDict({"prompts": torch.ones(len(rows), 1, dtype=torch.long),
                       "responses": torch.ones(len(rows), b.max_len, dtype=torch.long),
                       "attention_mask": torch.as_tensor(attention, dtype=torch.long),
                       "response_mask": t64(b.mask[rows]), "old_log_probs": t64(b.old_logp[rows]),
                       "advantages": t64(b.adv[rows]), "row": torch.as_tensor(rows)}, batch_size=[len(rows)])


def _packed_log_probs(leaf, micro_batch):
    """The model output as the engine hands it to ppo_loss: per row, prompt then response positions, each token's
    log-prob at the position before it (no_padding_2_padding shifts it back)."""
    lens = micro_batch["attention_mask"][:, 1:].sum(1).tolist()
    return torch.cat([torch.cat([leaf[i, :n], leaf.new_zeros(1)]) for i, n in zip(micro_batch["row"].tolist(), lens)])


class StepTarget:
    name = "verl"

    def __init__(self):
        from harness.conform.targets import require
        verl = require("verl", INSTALL)
        self.losses = require("verl.workers.utils.losses", INSTALL)
        self.engine_utils = require("verl.workers.engine.utils", INSTALL)
        self.tu = require("verl.utils.tensordict_utils", INSTALL)
        self.versions = {"verl": verl.__version__, "torch": torch.__version__.split("+")[0]}
        self.how = ("One mini-batch = the whole batch (ppo_mini_batch_size * rollout.n rows). Per rank, verl's "
                    "`prepare_micro_batches` (use_dynamic_bsz=False, micro_batch_size_per_gpu = the micro-batch "
                    "size) splits the rank's rows and verl's `workers/utils/losses.py::ppo_loss` computes each "
                    "micro-batch's loss with the dp_size, all-reduced batch_num_tokens and global_batch_size that "
                    "`FSDPEngine.forward_backward_batch` and `RayPPOTrainer._update_actor` set; the losses' "
                    "gradients are summed per rank (backward per micro-batch) and averaged over ranks (FSDP). "
                    "float64, gradient w.r.t. the per-token log-probs. Not driven: use_dynamic_bsz=True "
                    "(token-balanced micro-batches, which needs a process group), the KL-loss and entropy terms.")

    def run(self, **cfg):
        config = actor_config(**cfg)

        def step(b, micro, ranks):
            leaf = t64(b.logp, grad=True)
            n_rows = len(b.mask)
            if n_rows % ranks:
                raise ValueError(f"ranks: {ranks} does not divide the mini-batch's {n_rows} rows")
            for rows in np.split(np.arange(n_rows), ranks):
                td = _micro_batch_input(b, rows)
                self.tu.assign_non_tensor(td, dp_size=ranks, batch_num_tokens=float(b.mask.sum()),
                                          global_batch_size=n_rows, use_dynamic_bsz=False,
                                          micro_batch_size_per_gpu=micro or len(rows))
                micro_batches, _ = self.engine_utils.prepare_micro_batches(td)
                for mb in micro_batches:
                    loss, _ = self.losses.ppo_loss(config, {"log_probs": _packed_log_probs(leaf, mb)}, mb)
                    (loss / ranks).backward()  # FSDP's all-reduce averages the ranks' gradients
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            return grad.numpy(), b
        return step

    def step_checks(self) -> list[StepCheck]:
        out = []
        for mode, agg, extra, hp in (
                ("token-mean", "token_mean", {}, {}),
                ("seq-mean-token-mean", "seq_mean_token_mean", {}, {}),
                ("seq-mean-token-sum", "seq_mean_token_sum", {}, {}),
                ("seq-mean-token-sum-norm", "seq_mean_token_sum_norm", {}, {"max_len": STEP_WIDTH}),
                ("seq-mean-token-sum-norm", "seq_mean_token_sum_norm", {"loss_scale_factor": 8}, {"max_len": 8})):
            knob = f"loss_agg_mode={mode}" + "".join(f", {k}={v}" for k, v in extra.items())
            out.append(self._check("grpo", "vanilla", knob, {"loss_agg_mode": mode, **extra, **NO_DUAL},
                                   {"beta": 0.0, "agg": agg, **hp}, TOKENS_NOTE if mode == "token-mean" else ROWS_NOTE))
        out += [
            self._check("dapo", "vanilla", "clip_ratio_high=0.28, loss_agg_mode=token-mean",
                        {"loss_agg_mode": "token-mean", "clip_ratio_high": 0.28, **NO_DUAL}, {"agg": "token_mean"},
                        TOKENS_NOTE),
            self._check("dr_grpo", "vanilla", "loss_agg_mode=seq-mean-token-sum-norm (loss_scale_factor unset)",
                        {"loss_agg_mode": "seq-mean-token-sum-norm", **NO_DUAL}, {"max_len": STEP_WIDTH}, ROWS_NOTE),
            self._check("gspo", "gspo", "clip 3e-4/4e-4 (gspo aggregates with seq-mean-token-mean itself)",
                        {"loss_agg_mode": "seq-mean-token-mean", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
                        {}, ROWS_NOTE),
        ]
        return out

    def _check(self, name, loss_mode, knob, cfg, ref_hp, note):
        from verl.workers.config.actor import PolicyLossConfig
        call = (f"ppo_loss per micro-batch (loss_mode {loss_mode!r}) with dp_size, batch_num_tokens, "
                "global_batch_size = mini-batch rows")
        return StepCheck(name, call, knob, self.run(policy_loss=PolicyLossConfig(loss_mode=loss_mode), **cfg),
                         ref.policy(name, **ref_hp), note=note)
