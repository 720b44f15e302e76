"""Shared helpers for the gpu tests: a dense toy reward so a random tiny model gets mixed rewards, and configs."""
from __future__ import annotations


def digit_reward(text: str, gold: str) -> float:
    """Share of the completion's characters that are digits (varies between samples of a random model)."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


class EvenVerifier:
    """Judges an answer right when it is an even integer: a random model then gets groups with 0 < #correct < G,
    which DAPO's dynamic sampling needs (Eq. 11 filters on correctness)."""

    timeouts = 0

    def many(self, preds, golds):
        return [p is not None and p.strip().lstrip("-").isdigit() and int(p) % 2 == 0 for p in preds]


def tiny_config(out_dir, algo_name: str, engine: str = "hf", steps: int = 2, **sections) -> dict:
    """A raw config for a fast run on the tiny random model."""
    raw = {"run": {"out_dir": str(out_dir), "steps": steps, "save_every": steps, "resume": False, "progress": False},
           "model": {"name": "tiny"},
           "rollout": {"engine": engine, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 10},
           "algo": {"name": algo_name, "reward": "gpu_helpers:digit_reward"},
           "train": {"lr": 1e-3}}
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    return raw


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_path():
    """The cached tiny random Qwen2 model folder (built once per machine)."""
    from gpu.models import tiny_model
    return tiny_model()


def fake_tier_run(config: str, sets: list) -> None:
    """Stands in for a tier run in gpu.bench_h200.run_all's tests: ``config`` is the run folder; ``sets`` are
    [steps, seconds to sleep after them, exit code]. Writes one metrics.jsonl row per step, as gpu/train.py does."""
    import json
    import sys
    import time
    from pathlib import Path
    steps, sleep, code = sets
    Path(config).mkdir(parents=True, exist_ok=True)
    with open(Path(config) / "metrics.jsonl", "a") as f:
        for k in range(steps):
            f.write(json.dumps({"step": k + 1, "step_time_s": 1.0 + k, "rollout_s": 0.5, "gen_tokens_per_s": 100.0,
                                "accuracy": k / 10}) + "\n")
    time.sleep(sleep)
    sys.exit(code)
