"""The trainer's per-step metrics beside ``metrics.jsonl``: TensorBoard scalars (``run.tensorboard``, in OUT/tb) and a
Weights & Biases run (``run.wandb``, the project), both under the section tags of ``spec.tracking``."""
from __future__ import annotations

from pathlib import Path

from spec.tracking import WandbRun, scalars


class StepLoggers:
    """The loggers ``cfg.run`` asks for, opened for a run folder at ``step`` (0: a new run). On a resume TensorBoard
    drops what a killed attempt wrote after the checkpoint, and W&B starts a new run, ``<folder>@<step>``, in the
    group of the folder, so no step is shown twice."""

    def __init__(self, cfg, out: Path, step: int):
        self.tb = self.wandb = None
        if cfg.run.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(out / "tb"), purge_step=step + 1 if step else None)
        if cfg.run.wandb:
            self.wandb = WandbRun("run.wandb", cfg.run.wandb, out, name=out.name + (f"@{step}" if step else ""),
                                  group=out.name, config={**cfg.to_dict(), "resumed_at_step": step},
                                  job_type="train")

    def log(self, record: dict) -> None:
        """One step's metrics (a metric without a value this step, None, is left out)."""
        if self.tb:
            for key, value in scalars(record).items():
                self.tb.add_scalar(key, value, record["step"])
        if self.wandb:
            self.wandb.log(record)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.close()
