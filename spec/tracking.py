"""Per-step metrics to Weights & Biases, shared by the trainer (``gpu.loggers``) and the simulator's sweeps
(``cliplab sim --wandb``): one W&B run per training run, its metrics tagged by section as W&B and TensorBoard group
them (``train/``, ``clip/``, ``entropy/``, ``rollout/``). W&B's own settings choose where a run goes:
``WANDB_MODE=offline`` writes it to disk only (``wandb sync`` uploads it later)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: Sections of the per-step metrics, by name prefix, first match wins; any other metric (loss, grad_norm, kl_ref,
#: tokens, timings, memory) is under train/.
SECTIONS = (("entropy", ("entropy", "cov_logp_adv", "cov_interval")),
            ("clip", ("clip_", "tcr", "upclip_", "freed_", "ratio_dev", "ppo_zeroed", "trunc_frac", "cov_frac",
                      "rc_")),
            ("rollout", ("reward", "accuracy", "pass@", "resp_len", "len_", "malformed", "truncated", "zero_grad",
                         "rur", "gen_", "generated", "trained", "rollout_", "verify_", "weight_sync")))


def tag(key: str) -> str:
    """``key`` under its section: ``clip/clip_frac``, ``entropy/entropy``, ``rollout/reward``, ``train/loss``."""
    section = next((name for name, prefixes in SECTIONS if key.startswith(prefixes)), "train")
    return f"{section}/{key}"


def scalars(record: dict) -> dict:
    """A metrics record's numbers by their tags (``step`` is the x axis; None, flags and text are left out)."""
    return {tag(k): v for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def check_wandb(setting: str) -> None:
    """A ValueError naming ``setting`` when the wandb package is not installed."""
    if importlib.util.find_spec("wandb") is None:
        raise ValueError(f"{setting}: the wandb package is not installed (pip install 'cliplab[wandb]')")


def wandb_ready(setting: str) -> None:
    """Check before a long job that W&B is installed and its settings (WANDB_MODE, ...) are valid; a ValueError
    naming ``setting`` if not."""
    check_wandb(setting)
    import wandb
    try:
        wandb.setup()
    except (wandb.Error, ValueError) as exc:
        raise _not_started(setting, exc) from None


def _not_started(setting: str, exc: Exception) -> ValueError:
    why = " ".join(str(exc).split())[:300] or type(exc).__name__
    return ValueError(f"{setting}: W&B did not start ({why}); log in with `wandb login` or set WANDB_MODE=offline")


class WandbRun:
    """One W&B run in ``project``: ``config`` at the start, then one ``log(record)`` per step. Its files go to
    ``folder/wandb`` (or ``$WANDB_DIR``). W&B failing to start (no login, a bad WANDB_MODE) is a ValueError naming
    ``setting``."""

    def __init__(self, setting: str, project: str, folder: Path, name: str, group: str, config: dict,
                 job_type: str):
        check_wandb(setting)
        import wandb
        try:
            self.run = wandb.init(project=project, name=name, group=group, job_type=job_type, config=config,
                                  dir=os.environ.get("WANDB_DIR", str(folder)), reinit="create_new")
        except (wandb.Error, ValueError) as exc:
            raise _not_started(setting, exc) from None

    def log(self, record: dict) -> None:
        self.run.log(scalars(record), step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()
