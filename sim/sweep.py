"""Sweeps: algorithms x grid x seeds across processes, per-step metrics streamed to disk, resumable, summarised.

Layout (shared with the real-model harness, which the report also reads)::

    DIR/sweep.json                    the sweep's settings
    DIR/runs/<run>/config.json        algo, seed, label, env, params (the --set values) and the full settings
    DIR/runs/<run>/metrics.jsonl      one JSON object per step (complete runs only)
    DIR/runs/<run>/done.json          the run's summary; written last, so a run is done iff it exists
    DIR/summary.json                  per label, the mean over seeds of every summary metric

A run writes its steps to ``metrics.jsonl.part`` as it goes; on completion the part file is renamed and
``done.json`` is written atomically (temp file, then ``os.replace``). A resumed sweep skips done runs and restarts
unfinished ones from scratch, so no run is lost or counted twice.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .config import check_env, grid_points, resolve
from .loop import run
from .metrics import DEFINITIONS, SUMMARY_DEFINITIONS, SUMMARY_KEYS, summarise_run


def write_json(path: Path, obj) -> None:
    """Write JSON atomically: a temp file in the same folder, then os.replace."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def label_of(algo: str, params: dict) -> str:
    """``grpo`` or ``grpo[eps_high=0.28]``: the algorithm and its grid point."""
    if not params:
        return algo
    return algo + "[" + ",".join(f"{k}={params[k]}" for k in sorted(params)) + "]"


def run_id(algo: str, params: dict, seed: int) -> str:
    """A file-system-safe, unique name of one run."""
    safe = "".join(c if c.isalnum() or c in "._-=" else "_" for c in label_of(algo, params))
    return f"{safe}__seed{seed}"


def plan(env: str, algos: list[str], seeds: int, steps: int, grid: dict) -> list[dict]:
    """Every run of the sweep, each checked (so a bad setting fails before any process starts)."""
    check_env(env)
    if not algos:
        raise ValueError("algos: expected at least one algorithm")
    for name, value in (("seeds", seeds), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    tasks = []
    for algo in algos:
        for params in grid_points(grid):
            cfg = resolve(env, algo, params)
            for seed in range(seeds):
                tasks.append({"env": env, "algo": algo, "seed": seed, "steps": steps, "params": params,
                              "label": label_of(algo, params), "id": run_id(algo, params, seed), "settings": cfg})
    return tasks


def run_task(task: dict, out: str) -> dict:
    """Run one task into ``out/runs/<id>/``; returns its summary."""
    folder = Path(out) / "runs" / task["id"]
    if (folder / "done.json").exists():
        return json.loads((folder / "done.json").read_text())
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    part = folder / "metrics.jsonl.part"
    with open(part, "w") as f:
        def on_step(rec):
            f.write(json.dumps(rec) + "\n")
            f.flush()
        records = run(task["env"], task["algo"], task["seed"], task["steps"], task["params"], on_step)
        os.fsync(f.fileno())
    write_json(folder / "config.json", {k: task[k] for k in ("env", "algo", "seed", "steps", "params", "label",
                                                             "settings")})
    os.replace(part, folder / "metrics.jsonl")
    summary = {"label": task["label"], "algo": task["algo"], "seed": task["seed"], **summarise_run(records)}
    write_json(folder / "done.json", summary)
    return summary


def _worker(args):
    task, out = args
    return run_task(task, out)


def prepare(env: str, algos: list[str], seeds: int, steps: int, grid: dict | None, out: str):
    """Plan a sweep, check that ``out`` holds the same sweep if anything, and list the runs not yet done:
    returns (tasks, out path, tasks to run)."""
    grid = grid or {}
    tasks = plan(env, algos, seeds, steps, grid)
    out_path = Path(out)
    (out_path / "runs").mkdir(parents=True, exist_ok=True)
    _check_resumable(out_path, env, steps)
    write_json(out_path / "sweep.json", {"env": env, "steps": steps, "seeds": seeds, "algos": list(algos),
                                         "grid": grid})
    todo = [t for t in tasks if not (out_path / "runs" / t["id"] / "done.json").exists()]
    return tasks, out_path, todo


def run_sweep(env: str, algos: list[str], seeds: int, steps: int, grid: dict | None = None, out: str = "runs/sim",
              workers: int = 2, progress: bool = True) -> dict:
    """Run (or resume) a sweep into ``out`` and return its summary (also written to ``out/summary.json``)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive integer, got {workers!r}")
    tasks, out_path, todo = prepare(env, algos, seeds, steps, grid, out)
    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"sim {env}", unit="run",
               disable=not progress)
    if workers == 1 or len(todo) <= 1:
        for t in todo:
            run_task(t, str(out_path))
            bar.update()
    else:
        with mp.get_context("fork").Pool(min(workers, len(todo))) as pool:
            for _ in pool.imap_unordered(_worker, [(t, str(out_path)) for t in todo]):
                bar.update()
    bar.close()
    summary = summarise(out_path, tasks)
    write_json(out_path / "summary.json", summary)
    return summary


def _check_resumable(out: Path, env: str, steps: int) -> None:
    old = out / "sweep.json"
    if old.exists():
        prev = json.loads(old.read_text())
        if prev.get("env") != env or prev.get("steps") != steps:
            raise ValueError(f"out: {out} holds a sweep with env={prev.get('env')!r}, steps={prev.get('steps')}; "
                             f"expected env={env!r}, steps={steps} to resume it (use another --out)")


def summarise(out: Path, tasks: list[dict]) -> dict:
    """Per label, the mean over seeds of each run's summary metrics."""
    by_label: dict[str, list[dict]] = {}
    for t in tasks:
        done = json.loads((Path(out) / "runs" / t["id"] / "done.json").read_text())
        by_label.setdefault(t["label"], []).append(done)
    table = {}
    for label, runs in by_label.items():
        row = {"seeds": len(runs)}
        for key in SUMMARY_KEYS:
            vals = [r[key] for r in runs if r.get(key) is not None]
            row[key] = float(np.mean(vals)) if vals else None
            row[key + "_std"] = float(np.std(vals)) if len(vals) > 1 else None
        table[label] = row
    return {"env": tasks[0]["env"], "steps": tasks[0]["steps"], "algorithms": table,
            "definitions": {"summary": SUMMARY_DEFINITIONS, "per_step": DEFINITIONS}}
