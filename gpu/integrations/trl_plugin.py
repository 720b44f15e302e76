"""TRL's GRPOTrainer with cliplab's policy loss (gpu.policy_loss) for any cliplab algorithm::

    trainer = CliplabGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                                 algorithm="dcpo", hparams={"agg": "seq_mean_token_sum"})

Generation and rewards are TRL's; the loss is cliplab's, and so is the advantage of an algorithm that trains with
DCPO's SAS (DCPO's): gpu.SmoothAdvantage over the generation batch of all processes, its per-prompt history keyed by
the prompt (its text, or its messages as JSON) and saved in each TRL checkpoint (``cliplab_sas.json``, restored on
resume); the others keep TRL's advantages. G is ``num_generations``; Dr.GRPO's L is ``max_completion_length``; a KL
term is added only when ``hparams`` sets ``beta`` (cliplab's k-estimators, inside the token sum). Logged per step:
``clip_ratio/region_mean`` (cliplab's clip_frac), ``entropy``, ``cliplab/rur`` and ``kl``.

Each micro-batch's loss is weighted by its share of the units the aggregation averages over (tokens, non-empty rows
or groups) in its whole optimiser step, all processes and accumulated micro-batches together, so the accumulated,
DDP-averaged gradient equals one process's on the whole step's batch. For the group aggregations TRL's shuffle of the
generation batch moves whole groups, so that each micro-batch holds whole groups."""
from __future__ import annotations

import contextlib
import json
import os

import torch
import trl.trainer.grpo_trainer as grpo_module
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from spec.contract import resolve_hparams
from spec.records import read_json, write_json
from spec.registry import GROUP_AGG_MODES, get_algorithm

from ..advantages import SmoothAdvantage
from ..aggregation import agg_units
from ..losses import policy_loss

#: The SAS history's file in each TRL checkpoint folder (checkpoint-N/).
SAS_STATE = "cliplab_sas.json"
WINDOW_UNITS = "cliplab_window_units"


def shuffle_whole_groups(seq_dict: dict, group_size: int) -> dict:
    """TRL's shuffle of a generation batch (trl.trainer.utils.shuffle_sequence_dict) by whole groups of
    ``group_size`` consecutive rows: a later split into micro-batches of whole groups keeps every group whole."""
    rows = len(next(v for v in seq_dict.values() if v is not None))
    order = (torch.randperm(rows // group_size)[:, None] * group_size + torch.arange(group_size)).reshape(-1)

    def take(v):
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        return v[order] if isinstance(v, torch.Tensor) else [v[i] for i in order]
    return {key: take(v) for key, v in seq_dict.items()}


def _prompt_key(prompt) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


class CliplabGRPOTrainer(GRPOTrainer):
    """A GRPOTrainer whose ``_compute_loss`` is cliplab's ``algorithm`` with ``hparams`` over its paper defaults."""

    def __init__(self, *args, algorithm: str = "grpo", hparams: dict | None = None, **kwargs):
        hp = {"beta": 0.0, **(hparams or {})}
        resolved = resolve_hparams(algorithm, {"max_len": 1, **hp})  # fail before any model is built
        super().__init__(*args, **kwargs)
        if resolved["agg"] == "seq_mean_token_sum_norm" and "max_len" not in hp:
            hp["max_len"] = self.args.max_completion_length
        if resolved["beta"] > 0 and self.ref_model is None and self.beta == 0.0:
            raise ValueError("hparams: beta > 0 needs reference log-probs; set GRPOConfig(beta=...) > 0 too, so "
                             "that TRL computes them")
        if self.args.steps_per_generation % self.args.gradient_accumulation_steps:
            raise ValueError(f"steps_per_generation: expected a multiple of gradient_accumulation_steps "
                             f"({self.args.gradient_accumulation_steps}), so that each optimiser step's batch is "
                             f"known when it is generated; got {self.args.steps_per_generation}")
        self.cliplab_algorithm, self.cliplab_hparams, self.cliplab_agg = algorithm, hp, resolved["agg"]
        self.cliplab_group_size = self.num_generations if self.cliplab_agg in GROUP_AGG_MODES else None
        if self.cliplab_group_size and self.args.per_device_train_batch_size % self.cliplab_group_size:
            raise ValueError(f"per_device_train_batch_size: the group aggregation {self.cliplab_agg} needs whole "
                             f"groups of {self.cliplab_group_size} completions per micro-batch, got "
                             f"{self.args.per_device_train_batch_size}")
        self.cliplab_sas = SmoothAdvantage() if get_algorithm(algorithm).advantage == "sas" else None
        self._cliplab_rewards = None

    # ---- advantages: DCPO's SAS ------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._cliplab_rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._cliplab_rewards

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.cliplab_sas is not None and self.model.training:
            advantages = self._sas_advantages([x["prompt"] for x in inputs])
            n, rank = len(inputs), self.accelerator.process_index
            output["advantages"] = advantages[rank * n:(rank + 1) * n].to(output["advantages"])
            logged = self._logs["advantages"]  # TRL logged its own advantages of the whole batch last
            for _ in advantages:
                logged.pop()
            logged.extend(advantages.tolist())
        return output

    def _sas_advantages(self, prompts: list):
        """DCPO's SAS (2509.02333 Eq. 9-12) of the generation batch of all processes, computed on every process
        alike (TRL's gathered rewards, G consecutive rows per prompt)."""
        per_func = self._cliplab_rewards
        if torch.isnan(per_func).all(1).any():
            raise ValueError("reward_funcs: SAS needs a reward for every completion; every function returned None "
                             "for some")
        rewards = (per_func * self.reward_weights.to(per_func.device)).nansum(1).double()
        keys = [_prompt_key(p) for p in gather_object(prompts)]
        g = self.num_generations
        if any(len(set(keys[i:i + g])) > 1 for i in range(0, len(keys), g)):
            raise ValueError(f"num_generations: expected {g} consecutive completions of one prompt per group")
        return self.cliplab_sas(keys[::g], rewards, g)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.cliplab_sas is not None and self.args.should_save:
            step = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            write_json(os.path.join(self._get_output_dir(trial=trial), step, SAS_STATE),
                       self.cliplab_sas.state_dict())

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self.cliplab_sas is not None and checkpoint is not None:
            path = os.path.join(checkpoint, SAS_STATE)
            if not os.path.exists(path):
                raise ValueError(f"{path}: missing; this checkpoint has no SAS history, so the run cannot continue "
                                 "it (resume from a checkpoint written by CliplabGRPOTrainer, or start anew)")
            self.cliplab_sas.load_state_dict(read_json(path))

    # ---- micro-batches: whole groups, weighted by their share of the optimiser step --------------------------
    def _prepare_inputs(self, generation_batch):
        before = self._buffered_inputs
        with self._shuffling_whole_groups():
            inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self._buffered_inputs is not before:  # a new generation batch, split
            self.weigh_windows(self._buffered_inputs)
        return inputs

    @contextlib.contextmanager
    def _shuffling_whole_groups(self):
        original = grpo_module.shuffle_sequence_dict
        if self.cliplab_group_size:
            grpo_module.shuffle_sequence_dict = lambda d: shuffle_whole_groups(d, self.cliplab_group_size)
        try:
            yield
        finally:
            grpo_module.shuffle_sequence_dict = original

    @staticmethod
    def _loss_mask(inputs):
        mask = inputs["completion_mask"]
        return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]

    def weigh_windows(self, micro_batches: list[dict]) -> None:
        """Give each micro-batch (in step order) the units of its optimiser step: its window of
        gradient_accumulation_steps micro-batches, summed over all processes."""
        units = torch.stack([agg_units(self._loss_mask(mb).float(), self.cliplab_agg, self.cliplab_group_size)
                             for mb in micro_batches])
        units = self.accelerator.reduce(units, reduction="sum")
        steps = self.args.gradient_accumulation_steps
        for mb, total in zip(micro_batches, units.reshape(-1, steps).sum(1).repeat_interleave(steps)):
            mb[WINDOW_UNITS] = total

    def _share(self, mask, inputs):
        """P * u / U, u this micro-batch's units and U its optimiser step's over all processes (a micro-batch that
        did not come through the step's buffer, as in evaluation, is its own step): DDP's mean over P processes of
        the accumulated weighted losses is the mean over all units."""
        units = agg_units(mask, self.cliplab_agg, self.cliplab_group_size)
        total = inputs.get(WINDOW_UNITS)
        if total is None:
            total = self.accelerator.reduce(units.detach().clone(), reduction="sum")
        return self.accelerator.num_processes * units / total.clamp(min=1.0)

    def _compute_loss(self, model, inputs):
        ids = (inputs["prompt_ids"], inputs["completion_ids"])
        masks = (inputs["prompt_mask"], inputs["completion_mask"])
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, torch.cat(ids, dim=1), torch.cat(masks, dim=1), ids[1].size(1), compute_entropy=True)
        mask = self._loss_mask(inputs).to(logps.dtype)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        group_size = self.cliplab_group_size
        if group_size is not None and len(mask) % group_size:
            raise ValueError(f"per_device_train_batch_size: the group aggregation needs whole groups of "
                             f"{group_size} completions per micro-batch, got {len(mask)}")
        loss, stats = policy_loss(self.cliplab_algorithm, logps, old, inputs["advantages"], mask,
                                  group_size=group_size, ref_logp=inputs.get("ref_per_token_logps"),
                                  **self.cliplab_hparams)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["clip_ratio/region_mean"].append(stats["clip_frac"])
        self._metrics[mode]["entropy"].append(float((entropies.detach() * mask).sum() / mask.sum().clamp(min=1)))
        rows = mask.sum(1) > 0  # RUR: share of (non-empty) completions with a non-zero advantage (DCPO Table 2)
        self._metrics[mode]["cliplab/rur"].append(float((inputs["advantages"][rows] != 0).float().mean())
                                                  if rows.any() else 0.0)
        if "kl_mean" in stats:
            self._metrics[mode]["kl"].append(stats["kl_mean"])
        return loss * self._share(mask, inputs)
