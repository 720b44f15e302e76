"""With run.tensorboard, the training loop writes its per-step metrics as scalars, tagged by section (train/, clip/,
entropy/, rollout/), that TensorBoard's own event reader reads back equal to metrics.jsonl; a resumed run's events
replace what a killed attempt wrote after its checkpoint."""
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
    assert {"rollout/reward", "train/loss", "entropy/entropy", "train/tokens_per_s", "clip/tcr",
            "rollout/rur"} <= set(acc.Tags()["scalars"])
    assert all(t.split("/")[0] in ("train", "clip", "entropy", "rollout") for t in acc.Tags()["scalars"])
    for key, tag in (("reward", "rollout/reward"), ("loss", "train/loss"), ("entropy", "entropy/entropy"),
                     ("grad_norm", "train/grad_norm")):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [m["step"] for m in rows] == [1, 2]
        assert [e.value for e in events] == pytest.approx([m[key] for m in rows], rel=1e-6)


def test_tensorboard_off_by_default_and_missing_package_named(tmp_path, tiny_path, monkeypatch):
    out = Trainer(from_dict(tiny_config(tmp_path / "off", "grpo", steps=1))).fit()
    assert not (out / "tb").exists()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match="run.tensorboard"):
        from_dict(tiny_config(tmp_path / "x", "grpo", run={"tensorboard": True}))


def test_a_resumed_run_replaces_the_steps_a_killed_attempt_logged_after_its_checkpoint(tmp_path, tiny_path):
    raw = tiny_config(tmp_path / "tb", "grpo", steps=4, run={"tensorboard": True, "resume": True, "save_every": 2})
    killed = Trainer(from_dict(raw))
    for _ in range(3):  # checkpoint at step 2, then step 3 logged, then killed
        killed.train_step()
    killed.loggers.tb.flush()
    killed._unlock()  # the kernel drops a killed process's lock on its run folder
    out = Trainer(from_dict(raw)).fit()  # resumes at step 2: steps 3 and 4 again
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    events = acc.Scalars("train/loss")
    assert [e.step for e in events] == [m["step"] for m in rows] == [1, 2, 3, 4]
    assert [e.value for e in events] == pytest.approx([m["loss"] for m in rows], rel=1e-6)
