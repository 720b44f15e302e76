"""`cliplab train --config FILE.yaml [--set section.field=value ...]`: validate the config and run (or resume) it."""
from __future__ import annotations

from pathlib import Path


def train_command(config_path, sets: list[str] | None = None, allow_config_change: bool = False) -> Path:
    """Load and validate the YAML config with its overrides, train, and return the run folder (metrics.jsonl).
    Resuming a run under a changed config needs ``allow_config_change`` (the change is recorded)."""
    from gpu.config import load_config
    from gpu.train import train
    cfg = load_config(config_path, list(sets or []))
    return train(cfg, allow_config_change=allow_config_change)


def demo_config(out_dir, steps: int) -> dict:
    """The demo's training config (a dict for ``gpu.config.from_dict``): its run in ``out_dir``/grpo."""
    return {"run": {"out_dir": str(Path(out_dir) / "grpo"), "steps": steps, "save_every": steps, "resume": False,
                    "threads": 1},
            "model": {"name": "smollm2", "train_top_layers": 4},
            "data": {"source": "arithmetic", "digits": 1, "terms": 2, "ops": "+", "system": "Answer briefly."},
            "rollout": {"engine": "hf", "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 16},
            "algo": {"name": "grpo", "hp": {"beta": 0.0}},
            "train": {"lr": 3e-5}}


def demo_train(out_dir, steps: int = 6) -> Path:
    """A short real-model run (SmolLM2-135M-Instruct, GRPO, synthetic addition; about 1-2 minutes on 2 CPU cores)
    with its metrics and a small report in ``out_dir``."""
    from gpu.config import from_dict
    from gpu.train import train
    from harness.reports.real import write_report
    out_dir = Path(out_dir)
    run = train(from_dict(demo_config(out_dir, steps)))
    write_report([run], out_dir / "README.md", title="cliplab demo: a short GRPO run on SmolLM2-135M-Instruct")
    return run
