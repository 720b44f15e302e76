"""TRL 1.16's GRPOTrainer for one optimisation step, driven through ``GRPOTrainer._compute_loss`` on the tiny
model of harness.conform.targets.trl, as the trainer splits and scales it (read in the installed source):

- ``trl/trainer/grpo_trainer.py::GRPOTrainer._prepare_inputs`` generates a local batch of
  ``per_device_train_batch_size * steps_per_generation`` rows per process and hands out one slice of
  ``per_device_train_batch_size`` rows per accumulation step;
- ``GRPOTrainer._generate_and_score_completions`` sets ``num_items_in_batch`` to the completion tokens of the
  whole generation batch, gathered over the processes;
- ``GRPOTrainer._compute_loss`` divides by ``current_gradient_accumulation_steps`` (grpo, bnpo, dr_grpo, sapo)
  or, for dapo and cispo, by ``num_items_in_batch / num_processes * gradient_accumulation_steps /
  steps_per_generation``;
- ``transformers/trainer.py::Trainer.training_step`` backpropagates that loss as it is (GRPOTrainer sets
  ``loss_is_scaled_for_ga = True``; the Accelerator is built with ``num_steps=1``); DDP averages the processes'
  gradients.

The rank split, the per-step slices and DDP's mean are simulated; the loss and its scaling are TRL's."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from harness.conform.cases import STEP_ROWS, Batch, NotApplicable, StepCheck, step_batch, tolerance_of
from harness.conform.targets import reference as ref
from harness.conform.targets.trl import MAX_COMPLETION, VOCAB, loss_and_grad, make_trainer, trainer_inputs, trl_versions


ROWS_NOTE = ("`mask.sum(-1).clamp(min=1.0)` keeps fully masked rows in each slice's mean over rows: factor = rows "
             "with tokens / rows (6/8 in masked_rows) at every split, as at loss level.")


class _Processes:
    """The trainer's Accelerator as one of ``n`` processes sees it (only ``num_processes`` differs)."""

    def __init__(self, accelerator, n: int):
        self._accelerator, self.num_processes = accelerator, n

    def __getattr__(self, name):
        return getattr(self._accelerator, name)


def with_ids(batch: Batch, seed: int) -> Batch:
    batch.extra["ids"] = np.random.default_rng(10_000 + seed).integers(0, VOCAB - 4, size=batch.mask.shape)
    return batch


class StepTarget:
    name = "trl"
    tolerance = tolerance_of("float32")  # TRL computes log-probs in float32 (as the loss-level target)

    def __init__(self):
        self.versions = trl_versions()
        self.how = ("Per process, the generation batch is a contiguous share of the rows; an optimisation step "
                    "uses its first `gradient_accumulation_steps` slices of `per_device_train_batch_size` rows (the "
                    "micro-batch size). Each slice is `GRPOTrainer._compute_loss` on the tiny Qwen2 model (float64 "
                    "weights, float32 log-probs) with `current_gradient_accumulation_steps`, "
                    "`args.steps_per_generation`, `accelerator.num_processes` and `num_items_in_batch` (the "
                    "generation batch's tokens over all processes) set as `train()` sets them; gradients are "
                    "summed over slices and averaged over processes. steps_per_generation = "
                    "gradient_accumulation_steps (TRL's default) unless the knob says otherwise.")

    def run(self, trainer, spg: Fraction = Fraction(1)):
        """``spg`` = steps_per_generation / gradient_accumulation_steps: 1 is TRL's default (one generation batch
        per optimisation step); 2, a generation batch spans two steps (the batch holds both, the step is the
        first); 1/2, a step takes two generation batches, each with its own num_items_in_batch."""
        cache: dict = {}

        def step(b: Batch, micro, ranks):
            n, span = len(b.mask), max(int(spg), 1)  # the batch holds `span` optimisation steps' rows
            if n % (ranks * span):
                raise ValueError(f"ranks: {ranks} processes do not divide the generation batch's {n} rows")
            shares = [local[: len(local) // span] for local in np.split(np.arange(n), ranks)]
            size = micro or len(shares[0])
            accumulation = len(shares[0]) // size
            if len(shares[0]) % size or (accumulation * spg).denominator != 1:
                raise NotApplicable(f"{len(shares[0])} rows per process do not make {1 / spg} generation batches "
                                    f"of micro-batches of {size}")
            per_generation = int(accumulation * spg) if spg < 1 else accumulation  # slices per generation batch
            slices = [np.split(rows, accumulation) for rows in shares]
            # num_items_in_batch: the tokens of the generation batch over all processes (with spg >= 1 the whole
            # batch; with spg < 1 generation g is slices g * per_generation ... of every process)
            items = [b.mask.sum()] if spg >= 1 else [
                sum(b.mask[np.concatenate(p[g * per_generation:(g + 1) * per_generation])].sum() for p in slices)
                for g in range(accumulation // per_generation)]
            grad, logps, old, refs = (np.zeros(b.mask.shape) for _ in range(4))
            accelerator = trainer.accelerator
            trainer.accelerator = _Processes(accelerator, ranks)
            trainer.current_gradient_accumulation_steps = accumulation
            trainer.args.steps_per_generation = int(accumulation * spg)
            try:
                for process in slices:
                    for k, mb in enumerate(process):
                        inputs = trainer_inputs(trainer, b.take(rows=mb), cache)
                        inputs["num_items_in_batch"] = torch.tensor(float(items[k // per_generation]))
                        _, lp, g = loss_and_grad(trainer, inputs)
                        grad[mb] += g.numpy() * b.mask[mb] / ranks  # DDP: the processes' mean
                        logps[mb], old[mb] = lp.numpy(), inputs["old_per_token_logps"].numpy()
                        refs[mb] = inputs["ref_per_token_logps"].numpy()
            finally:
                trainer.accelerator = accelerator
            used = np.concatenate(shares)
            return grad[used], Batch(logps[used], old[used], b.adv[used], b.mask[used], refs[used], b.group_size)
        return step

    def step_checks(self) -> list[StepCheck]:
        seq = {"loss_type": "grpo", "epsilon": 3e-4, "epsilon_high": 4e-4, "importance_sampling_level": "sequence"}
        dapo = {"loss_type": "dapo", "epsilon_high": 0.28}
        token = {"agg": "token_mean"}
        return [
            self._check("grpo", "loss_type='grpo'", {"loss_type": "grpo"}, {"beta": 0.0}, note=ROWS_NOTE),
            self._check("grpo", "loss_type='bnpo' (token mean per slice)", {"loss_type": "bnpo"},
                        {"beta": 0.0, "agg": "token_mean"},
                        note="Each slice's own token mean, divided by gradient_accumulation_steps, then DDP's mean: "
                        "token (i, t) of slice s weighs 1 / (P x GA x N_s) instead of 1 / N; equal only with one "
                        "slice on one process."),
            self._check("dr_grpo", f"loss_type='dr_grpo', max_completion_length={MAX_COMPLETION}",
                        {"loss_type": "dr_grpo"}, {"max_len": MAX_COMPLETION},
                        note="Each slice divides by its rows x max_completion_length, masked rows included: factor "
                        "= rows with tokens / rows (6/8 in masked_rows), as at loss level."),
            self._check("dapo", "loss_type='dapo', epsilon_high=0.28 (num_items_in_batch)", dapo, token,
                        note="num_items_in_batch / num_processes x GA / steps_per_generation is the step's token "
                        "count per process when steps_per_generation = GA: exact at every split."),
            self._check("dapo", "loss_type='dapo', epsilon_high=0.28, steps_per_generation = 2 x "
                        "gradient_accumulation_steps", dapo, token, spg=Fraction(2),
                        note="The generation batch (16 rows) spans two optimisation steps; the step shown is the "
                        "first. num_items_in_batch counts the generation batch's N_gen tokens and is halved: the "
                        "factor is 2 N_step / N_gen (1 on average over the two steps, not per step)."),
            self._check("dapo", "loss_type='dapo', epsilon_high=0.28, steps_per_generation = "
                        "gradient_accumulation_steps / 2", dapo, token, spg=Fraction(1, 2),
                        note="The step takes two generation batches (the first and second half of each process's "
                        "slices), each normalised by twice its own tokens N_g: the mean of two token means, "
                        "proportional only when N_1 = N_2. One accumulation step cannot hold two generation "
                        "batches (n/a)."),
            self._check("gspo", "importance_sampling_level='sequence', loss_type='grpo', epsilon 3e-4/4e-4", seq, {},
                        note=ROWS_NOTE),
        ]

    def _check(self, name, knob, config, ref_hp, spg=Fraction(1), note=""):
        trainer = make_trainer(**config)
        rows = STEP_ROWS * max(int(spg), 1)
        call = "GRPOTrainer._compute_loss(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ") per slice"
        return StepCheck(name, call, knob, self.run(trainer, spg), ref.policy(name, **ref_hp),
                         note=note, tolerance=self.tolerance,
                         batches=lambda s, f: with_ids(step_batch(s, f, rows=rows), s))
