"""W&B logging of `cliplab train` (run.wandb) and `cliplab sim --wandb`, offline: each run's transaction log is read
back with wandb's own reader (`wandb leet inspect`, decoded into wandb's Record protobufs), and holds the run's
config and every per-step metric of metrics.jsonl under its section tag."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_helpers import tiny_config, tiny_path  # noqa: F401  (fixture)
from harness.cli import app
from spec.tracking import tag

pytest.importorskip("wandb")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, every folder it writes outside a run (cache, config, data) under tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    for name in ("CACHE", "CONFIG", "DATA", "ARTIFACT"):
        monkeypatch.setenv(f"WANDB_{name}_DIR", str(tmp_path / "wandb-home" / name.lower()))


def read_offline_run(folder: Path) -> dict:
    """The one offline run under ``folder/wandb``, as wandb's reader decodes its records: run (project, name,
    group, job type, config) and history {step: {key: value}}."""
    from google.protobuf import text_format
    from wandb.proto import wandb_internal_pb2
    (log,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    text = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", str(log)], capture_output=True,
                          text=True, check=True, timeout=120).stdout
    records = [text_format.Parse(chunk, wandb_internal_pb2.Record())
               for chunk in re.split(r"^# record \d+: \w+\n", text, flags=re.M)[1:]]
    run = next(r.run for r in records if r.HasField("run"))
    history = {r.history.step.num: {"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                    for i in r.history.item if not (i.key or i.nested_key[0]).startswith("_")}
               for r in records if r.HasField("history")}
    return {"project": run.project, "name": run.display_name, "group": run.run_group, "job_type": run.job_type,
            "config": {u.key: json.loads(u.value_json) for u in run.config.update}, "history": history}


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(run: dict, rows: list[dict]):
    """Every number of every metrics.jsonl row, and nothing else, at its step under its section tag."""
    assert sorted(run["history"]) == [r["step"] for r in rows]
    for row in rows:
        expected = {tag(k): v for k, v in row.items()
                    if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert run["history"][row["step"]] == pytest.approx(expected, rel=1e-12)


def test_training_logs_to_wandb_offline(tmp_path, tiny_path, offline):
    from gpu.config import from_dict
    from gpu.train import Trainer
    out = Trainer(from_dict(tiny_config(tmp_path / "grpo-tiny", "grpo", run={"wandb": "cliplab-test"}))).fit()
    run = read_offline_run(out)
    assert (run["project"], run["name"], run["group"], run["job_type"]) == ("cliplab-test", "grpo-tiny",
                                                                            "grpo-tiny", "train")
    assert run["config"]["algo"]["name"] == "grpo" and run["config"]["resumed_at_step"] == 0
    assert_same_metrics(run, metrics(out))
    keys = set(run["history"][1])
    assert {"rollout/reward", "train/loss", "entropy/entropy", "clip/tcr"} <= keys
    assert {k.split("/")[0] for k in keys} == {"train", "clip", "entropy", "rollout"}


def test_sim_logs_each_run_to_wandb_once(tmp_path, offline):
    out = tmp_path / "sweep"
    args = ["sim", "--env", "bandit", "--algos", "grpo,dapo", "--seeds", "2", "--steps", "4", "--workers", "2",
            "--out", str(out), "--wandb", "cliplab-sim"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    folders = sorted((out / "runs").iterdir())
    assert len(folders) == 4
    for folder in folders:
        run = read_offline_run(folder)
        label = json.loads((folder / "config.json").read_text())["label"]
        assert (run["project"], run["name"], run["group"], run["job_type"]) == ("cliplab-sim", folder.name,
                                                                                "sweep", label)
        assert run["config"]["algo"] == label and run["config"]["steps"] == 4
        assert_same_metrics(run, metrics(folder))
    assert CliRunner().invoke(app, args).exit_code == 0  # resumed: every run done, none logged again
    assert all(len(list(f.glob("wandb/offline-run-*"))) == 1 for f in folders)


def test_wandb_that_cannot_start_is_a_one_line_error(tmp_path, offline):
    """A bad WANDB_MODE (W&B reads it once per process: a fresh one) fails as one line naming --wandb."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "sim", "--env", "bandit", "--algos", "grpo", "--seeds",
                           "1", "--steps", "2", "--workers", "1", "--out", str(tmp_path / "s"), "--wandb", "p"],
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "sometimes"},
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: wandb: W&B did not start (") and "WANDB_MODE=offline" in lines[0]
    res = CliRunner().invoke(app, ["sim", "--env", "bandit", "--algos", "grpo", "--out", str(tmp_path / "e"),
                                   "--wandb", " "])
    assert res.exit_code == 2 and res.output.strip() == ("error: wandb: expected a W&B project name, got an empty "
                                                         "string")
    assert not (tmp_path / "e").exists()  # refused before the sweep


def test_run_wandb_needs_a_project_and_the_package(tmp_path, monkeypatch):
    import importlib.util

    from gpu.config import from_dict
    with pytest.raises(ValueError, match="^run.wandb: expected a non-empty string"):
        from_dict(tiny_config(tmp_path / "x", "grpo", run={"wandb": ""}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError, match=r"^run.wandb: the wandb package is not installed \(pip install "):
        from_dict(tiny_config(tmp_path / "x", "grpo", run={"wandb": "p"}))
