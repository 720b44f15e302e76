"""The real-model evidence runs (configs/evidence/<algo>.yaml x seeds), resumable: a finished run is skipped (its
committed copy is enough, so a new clone goes on where the last left off), a partial one resumes from its
checkpoint. One rollout engine serves every run of a lane (vLLM's start-up costs more than a step); each finished
run's config.json and metrics.jsonl (never weights) are copied into
``copy_root/<algo>/seed<k>/`` and committed there.

    python -m harness.runs.evidence --lane 0 --lanes 2   (reports/real/run_evidence.sh starts the lanes)
"""
from __future__ import annotations

import argparse
import gc
import shutil
import subprocess
import time
from pathlib import Path

from spec.records import read_jsonl

from harness.reports.evidence import ALGOS, VARIANTS

SEEDS = (0, 1, 2, 3, 4)


def jobs(algos=ALGOS + VARIANTS, seeds=SEEDS, lane: int = 0, lanes: int = 1) -> list[tuple[str, int]]:
    """(algo, seed) pairs seed-major (every algorithm's first seed before any second seed), every lanes-th."""
    if not 0 <= lane < lanes:
        raise ValueError(f"lane: expected 0 <= lane < lanes ({lanes}), got {lane}")
    return [(a, s) for s in seeds for a in algos][lane::lanes]


def finished(run_dir: Path, steps: int) -> bool:
    """The run's metrics.jsonl holds every step up to ``steps``."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    return len(rows) >= steps and rows[-1].get("step") == steps


def publish(run_dir: Path, dest: Path, commit: bool) -> None:
    """Copy config.json and metrics.jsonl of a finished run to ``dest`` and commit that folder (retried: another
    lane may hold the index lock)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "metrics.jsonl"):
        shutil.copy2(Path(run_dir) / name, dest / name)
    if not commit:
        return
    for attempt in range(5):
        add = subprocess.run(["git", "add", str(dest)], capture_output=True)
        done = add.returncode == 0 and subprocess.run(
            ["git", "commit", "-q", "-m", f"Evidence run {dest.parent.name} {dest.name}", "--", str(dest)],
            capture_output=True).returncode == 0
        if done:
            return
        time.sleep(2 + attempt)
    print(f"publish: could not commit {dest}; the files are copied", flush=True)


def run_lane(config_dir, out_root, copy_root, lane: int = 0, lanes: int = 1, algos=ALGOS + VARIANTS,
             seeds=SEEDS, commit: bool = True, steps: int | None = None, overrides=()) -> None:
    """Train this lane's (name, seed) runs (configs/evidence/<name>.yaml) one after another, sharing one rollout
    engine. ``steps``: train to that many steps instead of the configs' ``run.steps``; a finished shorter run
    resumes from its last checkpoint and continues (the schedule does not depend on the run's length, and
    ``run.steps`` is free to change on resume), as if it had been started at that length. ``overrides``:
    ``section.field=value`` settings applied to every config (``cliplab train --set``)."""
    from gpu.config import load_config
    from gpu.train import Trainer
    engine = None
    for algo, seed in jobs(algos, seeds, lane, lanes):
        run_dir, dest = Path(out_root) / algo / f"seed{seed}", Path(copy_root) / algo / f"seed{seed}"
        sets = [*overrides, f"run.seed={seed}", f"run.out_dir={run_dir}"] + (
            [] if steps is None else [f"run.steps={steps}"])
        cfg = load_config(Path(config_dir) / f"{algo}.yaml", sets)
        if finished(dest, cfg.run.steps):  # its committed copy is whole: a new clone does not train it again
            continue
        if not finished(run_dir, cfg.run.steps):
            t0 = time.perf_counter()
            trainer = Trainer(cfg, engine=engine if cfg.rollout.engine == "vllm" else None)
            engine = trainer.engine if cfg.rollout.engine == "vllm" else engine
            trainer.fit()
            del trainer
            gc.collect()
            print(f"{algo} seed{seed}: {time.perf_counter() - t0:.0f} s", flush=True)
        publish(run_dir, dest, commit)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="configs/evidence")
    p.add_argument("--out", default="runs/evidence")
    p.add_argument("--copy-to", default="reports/real/evidence")
    p.add_argument("--lane", type=int, default=0)
    p.add_argument("--lanes", type=int, default=1)
    p.add_argument("--algos", nargs="+", default=list(ALGOS + VARIANTS), help="configs/evidence/<name>.yaml names")
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--no-commit", action="store_true")
    p.add_argument("--steps", type=int, help="train to this many steps (extends finished shorter runs); default: "
                                              "each config's run.steps")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="a setting applied to every config, as `cliplab train --set` takes it (repeatable)")
    a = p.parse_args(argv)
    run_lane(a.configs, a.out, a.copy_to, a.lane, a.lanes, a.algos, a.seeds, not a.no_commit, a.steps,
             a.overrides)


if __name__ == "__main__":
    main()
