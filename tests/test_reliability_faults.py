"""Faults: a sweep killed at random (its main process alone, or its whole process group) resumes at the first try to
the same bytes; a sweep folder has one live owner; half-written files and bad paths give errors naming them."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ("toy_lm", ["grpo", "dpo"], 2, 20)  # env, algos, seeds, steps: a stacked job (grpo's two seeds) and two
# single runs (DPO), half a second on two workers


def _start(out: Path, steps: int = SWEEP[3], seeds: int = SWEEP[2]) -> subprocess.Popen:
    """The sweep in a child process leading its own process group (as a shell job would)."""
    env, algos = SWEEP[0], SWEEP[1]
    code = (f"from sim.sweep import run_sweep; run_sweep({env!r}, {algos!r}, {seeds}, {steps}, out={str(out)!r}, "
            "workers=2, progress=False)")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)


def _live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are still running (zombies do not count)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _wait_until(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_twenty_random_kills_resume_at_the_first_try_with_the_same_summary(tmp_path):
    env, algos, seeds, steps = SWEEP
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    run_sweep(env, algos, seeds, steps, out=str(ref), workers=2, progress=False)
    total = time.monotonic() - t0
    rng = random.Random(12)
    failures, mid_run = [], 0
    for trial in range(20):
        out, whole_group = tmp_path / f"kill{trial}", trial % 2 == 1
        proc = _start(out)
        try:
            assert _wait_until(lambda: (out / "sweep.json").exists(), 60), "the sweep did not start"
            time.sleep(rng.uniform(0, total))  # a random moment of the sweep
            os.killpg(proc.pid, signal.SIGKILL) if whole_group else os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            mid_run += not (out / "summary.json").exists()
            try:
                run_sweep(env, algos, seeds, steps, out=str(out), workers=2, progress=False)
            except Exception as exc:  # noqa: BLE001 (any failure of the first resume is what this counts)
                failures.append(f"trial {trial}: resume raised {type(exc).__name__}: {exc}")
                continue
            if (out / "summary.json").read_bytes() != (ref / "summary.json").read_bytes():
                failures.append(f"trial {trial}: summary.json differs")
            left = [p.name for p in (out / "runs").rglob("*") if p.is_file()
                    and (p.name.endswith((".part", ".tmp")) or p.stat().st_size == 0)]
            if left:
                failures.append(f"trial {trial}: left {left}")
            if not _wait_until(lambda: not _live_members(proc.pid), 5):
                failures.append(f"trial {trial}: workers outlived their sweep: {_live_members(proc.pid)}")
        finally:
            for pid in _live_members(proc.pid):
                os.kill(pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not failures, f"{len(failures)} of 20 kills did not resume cleanly: {failures}"
    assert mid_run >= 12, f"only {mid_run} of 20 kills landed before the sweep finished"


def test_a_live_sweep_owns_its_folder_and_a_dead_ones_lock_is_stale(tmp_path):
    out = tmp_path / "sweep"
    proc = _start(out, steps=5000, seeds=1)
    try:
        lock = out / "sweep.lock"
        assert _wait_until(lambda: (out / "sweep.json").exists() and lock.read_text().strip() == str(proc.pid), 60)
        with pytest.raises(ValueError, match=rf"^out: .* in use by the sweep with pid {proc.pid}\b"):
            run_sweep(SWEEP[0], SWEEP[1], 1, 5000, out=str(out), workers=1, progress=False)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert lock.read_text().strip() == str(proc.pid)  # the dead owner's pid is still in the file: stale
    with pytest.raises(ValueError, match="^out:.*steps=5000"):  # the lock is taken; only the settings differ
        run_sweep(SWEEP[0], SWEEP[1], 1, 3, out=str(out), workers=1, progress=False)
    assert lock.read_text().strip() == str(os.getpid())


def test_a_sweep_folder_that_is_a_file_or_under_a_file_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(ValueError, match=f"^out: .*{out.name}"):
            run_sweep("bandit", ["grpo"], 1, 2, out=str(out), workers=1, progress=False)


def test_a_corrupt_sweep_json_is_named(tmp_path):
    run_sweep("bandit", ["grpo"], 1, 2, out=str(tmp_path), workers=1, progress=False)
    (tmp_path / "sweep.json").write_text('{"env": "ban')
    with pytest.raises(ValueError, match="sweep.json: not valid JSON"):
        run_sweep("bandit", ["grpo"], 1, 2, out=str(tmp_path), workers=1, progress=False)


def test_conform_reports_a_target_that_raises_after_its_first_call(tmp_path, monkeypatch):
    (tmp_path / "flaky_target.py").write_text(
        "calls = [0]\n\n\ndef loss(logp, old_logp, advantages, mask):\n    calls[0] += 1\n    if calls[0] > 1:\n"
        "        raise TypeError('flaky kaboom')\n    return (logp * mask).sum()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from harness.conform.engine import conform, verdict
    report = conform("flaky_target:loss", seeds=1)
    assert {e for r in report["rows"] for e in r["target_errors"]} == {"TypeError: flaky kaboom (at flaky_target.py:7)"}
    assert all("target raised on every case: TypeError: flaky kaboom" in verdict(r) for r in report["rows"])
