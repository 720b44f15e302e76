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
