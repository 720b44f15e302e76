"""With run.tensorboard, the training loop writes its per-step metrics as scalars that TensorBoard's own event
reader reads back equal to metrics.jsonl."""
import importlib.util
import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gpu.config import from_dict
from gpu.train import Trainer
from gpu_helpers import tiny_config, tiny_path  # noqa: F401  (fixture)


def test_tensorboard_scalars_read_back(tmp_path, tiny_path):
    raw = tiny_config(tmp_path / "tb", "grpo", run={"tensorboard": True})
    out = Trainer(from_dict(raw)).fit()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    assert {"reward", "loss", "entropy", "tokens_per_s"} <= set(acc.Tags()["scalars"])
    for key in ("reward", "loss", "entropy", "grad_norm"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [m["step"] for m in rows] == [1, 2]
        assert [e.value for e in events] == pytest.approx([m[key] for m in rows], rel=1e-6)


def test_tensorboard_off_by_default_and_missing_package_named(tmp_path, tiny_path, monkeypatch):
    out = Trainer(from_dict(tiny_config(tmp_path / "off", "grpo", steps=1))).fit()
    assert not (out / "tb").exists()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match="run.tensorboard"):
        from_dict(tiny_config(tmp_path / "x", "grpo", run={"tensorboard": True}))
