"""TRL's GRPOTrainer with cliplab's policy loss (gpu.policy_loss) for any cliplab algorithm::

    trainer = CliplabGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                                 algorithm="dcpo", hparams={"agg": "seq_mean_token_sum"})

Generation, rewards and TRL's advantages are TRL's; the loss is cliplab's. G is ``num_generations`` (each
micro-batch must hold whole groups for the group aggregations); Dr.GRPO's L is ``max_completion_length``; a KL
term is added only when ``hparams`` sets ``beta`` (cliplab's k-estimators, inside the token sum). Logged per step:
``clip_ratio/region_mean`` (cliplab's clip_frac), ``entropy``, ``cliplab/rur`` and ``kl``.

Across processes (DDP averages gradients) each process's loss is weighted by its share of the aggregation's units
(tokens, non-empty rows or groups), so the gradient equals one process's on the global batch; micro-batches of
one step under gradient accumulation are still weighted equally."""
from __future__ import annotations

import torch
from trl import GRPOTrainer

from spec.contract import resolve_hparams
from spec.registry import GROUP_AGG_MODES, get_algorithm

from ..aggregation import agg_units
from ..losses import policy_loss


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
        self.cliplab_algorithm, self.cliplab_hparams = algorithm, hp

    def _compute_loss(self, model, inputs):
        ids = (inputs["prompt_ids"], inputs["completion_ids"])
        masks = (inputs["prompt_mask"], inputs["completion_mask"])
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, torch.cat(ids, dim=1), torch.cat(masks, dim=1), ids[1].size(1), compute_entropy=True)
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs[
            "tool_mask"]
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        agg = self.cliplab_hparams.get("agg", get_algorithm(self.cliplab_algorithm).defaults["agg"])
        group_size = self.num_generations if agg in GROUP_AGG_MODES else None
        if group_size is not None and len(mask) % group_size:
            raise ValueError(f"per_device_train_batch_size: the group aggregation needs whole groups of "
                             f"{group_size} completions per micro-batch, got {len(mask)}")
        loss, stats = policy_loss(self.cliplab_algorithm, logps, old, inputs["advantages"], mask.to(logps.dtype),
                                  group_size=group_size, ref_logp=inputs.get("ref_per_token_logps"),
                                  **self.cliplab_hparams)
        loss = loss * self._process_share(mask.to(logps.dtype), agg, group_size)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["clip_ratio/region_mean"].append(stats["clip_frac"])
        self._metrics[mode]["entropy"].append(float((entropies.detach() * mask).sum() / mask.sum().clamp(min=1)))
        rows = mask.sum(1) > 0  # RUR: share of (non-empty) completions with a non-zero advantage (DCPO Table 2)
        self._metrics[mode]["cliplab/rur"].append(float((inputs["advantages"][rows] != 0).float().mean())
                                                  if rows.any() else 0.0)
        if "kl_mean" in stats:
            self._metrics[mode]["kl"].append(stats["kl_mean"])
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

    def _process_share(self, mask, agg, group_size):
        """P * u_p / sum_q u_q: DDP's mean over P processes of these weighted losses is the mean over all units."""
        procs = self.accelerator.num_processes
        if procs == 1:
            return 1.0
        units = agg_units(mask, agg, group_size)
        total = self.accelerator.reduce(units.detach().clone(), reduction="sum")
        return procs * units / total.clamp(min=1.0)
