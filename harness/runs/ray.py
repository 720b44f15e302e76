"""Run the simulator's sweeps on a Ray cluster (``cliplab sim ... --backend ray``); local processes stay the default.

Each job (a label's seeds stacked, or a share of them, as ``sim.sweep.jobs`` groups them for the cluster's CPUs) is
``sim.sweep.run_tasks`` executed on a Ray worker into a worker-local folder; the worker returns the runs' files and
the driver writes them into ``OUT/runs/<run>/`` (``done.json`` last, atomically), so nodes need no shared file system
and the folder is byte-for-byte what the process backend writes. Resuming skips done runs as before."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tqdm import tqdm

from spec.records import remove_folder

RUN_FILES = ("config.json", "metrics.jsonl", "done.json")  # written in this order; done.json marks a finished run


def run_remote(tasks: list[dict]) -> dict:
    """On a worker: run one job's tasks into a temporary folder and return each run's files' bytes, by run id."""
    from sim.sweep import run_tasks
    with tempfile.TemporaryDirectory(prefix="cliplab-ray-") as tmp:
        run_tasks(tasks, tmp)
        return {t["id"]: {name: (Path(tmp) / "runs" / t["id"] / name).read_bytes() for name in RUN_FILES}
                for t in tasks}


def store(out: Path, task_id: str, files: dict) -> None:
    """On the driver: write a finished run's files, done.json last and atomically."""
    folder = Path(out) / "runs" / task_id
    if folder.exists():
        remove_folder(folder, "out")
    folder.mkdir(parents=True)
    for name in RUN_FILES:
        tmp = folder / (name + ".tmp")
        tmp.write_bytes(files[name])
        os.replace(tmp, folder / name)


def run_sweep_ray(env: str, algos: list[str], seeds, steps: int, grid: dict | None = None,
                  out: str = "runs/sim", address: str | None = None, num_cpus: int | None = None,
                  progress: bool = True, on_run=None, base: dict | None = None) -> dict:
    """``sim.sweep.run_sweep`` with the runs spread over Ray workers; returns (and writes) the same summary.
    Connects to ``address`` (a running cluster, e.g. ``auto``) or starts a local instance with ``num_cpus``."""
    from sim.sweep import jobs, owned, plan, prepare, summarise, write_json
    try:
        import ray
    except ImportError:
        raise ValueError("backend: 'ray' needs Ray; install it with: pip install ray==2.60.0") from None
    plan(env, algos, seeds, steps, grid or {}, base)  # bad settings fail before the folder is touched
    with owned(out):
        tasks, out_path, todo = prepare(env, algos, seeds, steps, grid, out, base)
        started = not ray.is_initialized()
        if started:
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                     log_to_driver=False)
        try:
            remote = ray.remote(num_cpus=1)(run_remote)
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))  # a job per CPU at least, as workers
            pending = [remote.remote(job) for job in jobs(todo, cpus)]
            bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"sim {env} (ray)", unit="run",
                       disable=not progress)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    for run_id, files in ray.get(ref).items():
                        store(out_path, run_id, files)
                        bar.update()
                        if on_run:
                            on_run(out_path / "runs" / run_id)
            bar.close()
        finally:
            if started:
                ray.shutdown()
        summary = summarise(out_path, tasks)
        write_json(out_path / "summary.json", summary)
        return summary
