"""The simulator's sweep on a local Ray instance writes the same runs, byte for byte, and the same summary as the
process backend; resuming on Ray skips done runs."""
import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from harness.runs.ray import run_sweep_ray  # noqa: E402
from harness.runs.sim import run_sweep_on  # noqa: E402

SWEEP = dict(env="bandit", algos=["grpo", "dcpo"], seeds=2, steps=15, grid={"lr": [0.05, 0.1]})


def _files(out: Path) -> dict:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted((out / "runs").rglob("*")) if p.is_file()}


def test_ray_backend_matches_the_process_backend_and_resumes(tmp_path):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # one local instance for both checks
    try:
        proc = run_sweep_on("process", out=str(tmp_path / "proc"), workers=2, progress=False, **SWEEP)
        on_ray = run_sweep_on("ray", out=str(tmp_path / "ray"), progress=False, **SWEEP)
        assert on_ray == proc
        assert _files(tmp_path / "ray") == _files(tmp_path / "proc")
        assert len(_files(tmp_path / "ray")) == 3 * 2 * 2 * 2  # config, metrics, done for 8 runs
        assert json.loads((tmp_path / "ray" / "summary.json").read_text()) == proc

        out = tmp_path / "ray"  # resume: a run whose done.json is gone is rerun, the others are kept
        done = sorted(out.glob("runs/*/done.json"))
        kept, dropped = done[0], done[1]
        kept_time = kept.stat().st_mtime_ns
        dropped.unlink()
        summary = run_sweep_ray(out=str(out), progress=False, **SWEEP)
        assert kept.stat().st_mtime_ns == kept_time and dropped.exists()
        assert summary == proc and _files(out) == _files(tmp_path / "proc")
    finally:
        ray.shutdown()


def test_unknown_backend_and_misplaced_address_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown backend 'slurm'; expected one of process, ray"):
        run_sweep_on("slurm", out=str(tmp_path), **SWEEP)
    with pytest.raises(ValueError, match="only the ray backend connects"):
        run_sweep_on("process", out=str(tmp_path), address="auto", **SWEEP)
