"""Sweeps: algorithms x grid x seeds across processes, per-step metrics streamed to disk, resumable, summarised.

Layout (shared with the real-model harness, which the report also reads)::

    DIR/sweep.json                    env, steps and base settings, and every command (algos, seeds, grid) that
                                      wrote into DIR
    DIR/runs/<run>/config.json        algo, seed, label, env, params (the --set values), base (the settings every
                                      run of DIR shares, such as a fit's: in no label) and the full settings
    DIR/runs/<run>/metrics.jsonl      one JSON object per step (complete runs only)
    DIR/runs/<run>/done.json          the run's summary; written last, so a run is done iff it exists
    DIR/summary.json                  per label, the mean over seeds of every summary metric (every done run in DIR)

A run writes its steps to ``metrics.jsonl.part`` as it goes; on completion the part file is renamed and
``done.json`` is written atomically (temp file, then ``os.replace``). A resumed sweep skips done runs and restarts
unfinished ones from scratch, so no run is lost or counted twice. A label's seeds, over all their environment draws,
run together as one stacked trainer (``sim.loop.run_stack``), each still into its own run folder.

A rerun in the same folder with other algorithms, grid values or seeds adds its runs: sweep.json keeps the history of
commands and summary.json covers every done run. One live sweep owns a folder at a time (``DIR/sweep.lock``, see
:func:`owned`); each job runs in a worker process of its own that dies with the sweep's process, so a resumed sweep
never races the leftovers of a killed one, and a worker that dies (``kill -9``, the out-of-memory killer) ends the
sweep with an error naming its runs.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from spec.records import naming, open_lock, read_json, remove_folder, safe_name, take_lock, writable_folder, write_json

from .config import (Seeds, check_algo_keys, check_env, check_keys, env_draw, grid_points, parse_seeds, resolve,
                     split_sets)
from .loop import run_stack
from .metrics import DEFINITIONS, SUMMARY_DEFINITIONS, SUMMARY_KEYS, summarise_run

LOCK = "sweep.lock"
#: At most this many runs a sweep (100,000 take about a second to plan; 14 algorithms x 1024 seeds are 14,336).
MAX_RUNS = 100_000
PR_SET_PDEATHSIG = 1  # linux/prctl.h
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h (glibc)


@contextlib.contextmanager
def owned(out, wait: float = 10.0):
    """Own the sweep folder ``out`` for the block: an exclusive ``flock`` on ``out/sweep.lock``, which holds the
    owner's pid. The kernel drops the lock when the last process holding it ends, so a killed sweep leaves no stale
    lock; forked workers share it, so a killed sweep's leftover workers keep the folder until they are gone. A live
    owner is refused at once, naming its pid; the leftovers of a dead one (dying with it) are waited for up to
    ``wait`` seconds."""
    out = writable_folder(out, "out")
    fd = open_lock(out / LOCK, "out", "the sweep's lock")
    try:
        deadline = time.monotonic() + wait
        while (owner := take_lock(fd)) is not None:
            live = owner.isdigit() and _alive(int(owner))
            if live or time.monotonic() > deadline:
                raise ValueError(f"out: {out} is in use by the sweep with pid {owner or '?'}"
                                 + ("" if live else " (ended; its worker processes are still running)")
                                 + "; wait for it to finish, or use another --out")
            time.sleep(0.05)
        yield out
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def keep_heap() -> None:
    """glibc: serve arrays up to 64 MiB from the heap and keep freed memory for the next ones, instead of mapping
    fresh zeroed pages for every large temporary (a feature_lm evaluation's [1288, 128] softmax takes 3.5 times
    longer in page faults). A process-wide setting, made by the sweep's process and inherited by its workers; the
    process keeps its peak memory until it ends. Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, 64 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 512 << 20)
    except (OSError, AttributeError):
        pass


def _die_with_parent(parent: int) -> None:
    """In a worker process: on Linux it gets SIGKILL when the sweep's process dies, so no orphan keeps writing into
    the folder; a worker whose parent is already gone exits."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def label_of(algo: str, params: dict) -> str:
    """``grpo`` or ``grpo[eps_high=0.28]``: the algorithm and its grid point."""
    if not params:
        return algo
    return algo + "[" + ",".join(f"{k}={params[k]}" for k in sorted(params)) + "]"


def run_id(algo: str, params: dict, seed: int) -> str:
    """A file-system-safe, unique name of one run."""
    return f"{safe_name(label_of(algo, params))}__seed{seed}"


def plan(env: str, algos: list[str], seeds, steps: int, grid: dict, base: dict | None = None) -> list[dict]:
    """Every run of the sweep, each checked (so a bad setting fails before any process starts). ``seeds``: a
    count, a ``--seeds`` text or ``Seeds`` (``sim.config.parse_seeds``); ``grid`` keys ``algo.key`` apply to that
    algorithm only; ``base``: settings under the grid that every run shares (a ``--match`` fit's), named in no label
    (a grid value of the same key wins). Each run records its seed's set (discovery or replication) and environment
    draw."""
    check_env(env)
    base = dict(base or {})
    check_keys(env, algos, base)
    if not algos:
        raise ValueError("algos: expected at least one algorithm")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive integer, got {steps!r}")
    sets = parse_seeds(seeds)
    shared, own = split_sets(grid, algos)
    check_keys(env, algos, shared)
    _check_size(algos, sets, grid, shared, own)
    for key, values in grid.items():
        again = _repeated(values)
        if again:
            raise ValueError(f"set: {key} lists the value {again[0]!r} twice; give each value once")
    tasks, ids = [], set()
    for algo in algos:
        check_algo_keys(env, algo, own.get(algo, {}))
        for params in grid_points({**shared, **own.get(algo, {})}):
            cfg = resolve(env, algo, {**base, **params})
            if run_id(algo, params, 0) in ids:
                raise ValueError(f"set: two grid points of {algo} have the same folder name "
                                 f"{safe_name(label_of(algo, params))!r}; give values that differ in letters or digits")
            for seed in sets.all:
                draw = env_draw(cfg, seed)
                tasks.append({"env": env, "algo": algo, "seed": seed, "set": sets.role(seed), "steps": steps,
                              "params": params, "label": label_of(algo, params), "id": run_id(algo, params, seed),
                              "base": base, "settings": {**cfg, "env_seed": draw}})
                ids.add(tasks[-1]["id"])
    return tasks


def _check_size(algos: list[str], sets: Seeds, grid: dict, shared: dict, own: dict) -> None:
    """At most MAX_RUNS runs a sweep, counted before any grid point is made: a bigger ``--set`` grid is a
    ValueError naming its keys and their numbers of values."""
    runs = sum(math.prod(len(v) for v in {**shared, **own.get(algo, {})}.values()) for algo in algos) * len(sets.all)
    if runs > MAX_RUNS:
        keys = " x ".join(f"{k} ({len(v)} values)" for k, v in grid.items()) or "no --set grid"
        raise ValueError(f"set: the grid {keys} makes {runs:,} runs with {len(algos)} algorithm(s) and "
                         f"{len(sets.all)} seeds; expected at most {MAX_RUNS:,} runs a sweep: give fewer values, or "
                         f"split the grid over several sweeps")


def _repeated(values: list) -> list:
    """[the first value equal to an earlier one (1 == 1.0)], or []; by hash where values have one."""
    hashed, unhashable = set(), []
    for v in values:
        try:
            if v in hashed:
                return [v]
            hashed.add(v)
        except TypeError:  # a JSON list or object
            if v in unhashable:
                return [v]
            unhashable.append(v)
    return []


def jobs(todo: list[dict], workers: int = 1) -> list[list[dict]]:
    """The tasks to run, grouped by label: a label's seeds, whatever their environment draws, run as one stacked
    trainer. The costliest start first (more seeds; then dynamic sampling, which generates several rounds a step).
    With fewer labels than ``workers``, each label's seeds are shared evenly among the workers; with more, the last
    label's seeds are, so that the workers end together."""
    groups: dict[str, list[dict]] = {}
    for t in todo:
        groups.setdefault(t["label"], []).append(t)
    out = sorted(groups.values(), key=lambda job: (len(job), job[0]["settings"]["dynamic_sampling"]), reverse=True)
    if workers <= 1 or not out:
        return out
    if len(out) < workers:
        parts = -(-workers // len(out))
        return [part for job in out for part in _shares(job, parts)]
    return out[:-1] + _shares(out[-1], workers) if len(out) > workers else out


def _shares(job: list[dict], parts: int) -> list[list[dict]]:
    """``job``'s tasks in ``parts`` consecutive shares as even as can be (no empty one)."""
    cuts = [i * len(job) // parts for i in range(parts + 1)]
    return [job[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def run_tasks(tasks: list[dict], out: str) -> list[dict]:
    """Run tasks of one label (one task, or several seeds stacked) into ``out/runs/<id>/``; returns their
    summaries."""
    folders = [Path(out) / "runs" / t["id"] for t in tasks]
    if all((f / "done.json").exists() for f in folders):
        return [read_json(f / "done.json") for f in folders]
    for folder in folders:
        if folder.exists():
            remove_folder(folder, "out")
        folder.mkdir(parents=True)
    with naming(Path(out) / "runs"), contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(f / "metrics.jsonl.part", "w")) for f in folders]

        def on_step(i, rec):
            files[i].write(json.dumps(rec) + "\n")
            files[i].flush()
        first = tasks[0]
        records = run_stack(first["env"], first["algo"], [t["seed"] for t in tasks], first["steps"],
                            {**first["base"], **first["params"]}, on_step, [t["settings"]["env_seed"] for t in tasks])
        for f in files:
            os.fsync(f.fileno())
    summaries = []
    for task, folder, recs in zip(tasks, folders, records):
        write_json(folder / "config.json", {k: task[k] for k in ("env", "algo", "seed", "set", "steps", "params",
                                                                 "base", "label", "settings")})
        os.replace(folder / "metrics.jsonl.part", folder / "metrics.jsonl")
        summary = {"label": task["label"], "algo": task["algo"], "seed": task["seed"], **summarise_run(recs)}
        write_json(folder / "done.json", summary)
        summaries.append(summary)
    return summaries


def _worker(job: list[dict], out: str, answer, parent: int) -> None:
    """A worker process: run one job and answer None, or the exception it raised. Ctrl-C is the sweep's process's to
    handle (it stops the workers)."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_tasks(job, out)
        answer.send(None)
    except Exception as exc:  # noqa: BLE001 (raised again by the sweep's process)
        answer.send(exc)


def run_jobs(grouped: list[list[dict]], out: str, workers: int, on_done) -> None:
    """Run each job in a forked worker process of its own, ``workers`` at a time, calling ``on_done(job)`` as each
    ends. A job's exception is raised here; a worker that dies without answering (``kill -9``, the out-of-memory
    killer) is a ValueError naming its runs. Either way, and on Ctrl-C, the other workers are stopped first (their
    runs restart on resume): no worker outlives the call."""
    ctx = mp.get_context("fork")
    waiting, running = list(grouped), {}
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                job = waiting.pop(0)
                receive, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker, args=(job, out, send, os.getpid()), daemon=True)
                with _interrupts_held():
                    proc.start()
                    running[receive] = (proc, job)
                send.close()  # the worker holds the only sending end: its death reads as EOF
            for receive in mp.connection.wait(list(running)):
                proc, job = running.pop(receive)
                with receive:
                    try:
                        error = receive.recv()
                    except EOFError:  # it died before answering
                        proc.join()
                        error = ValueError(_died(proc.exitcode, job))
                proc.join()
                if error is not None:
                    raise error
                on_done(job)
    finally:
        for receive, (proc, _) in running.items():
            proc.kill()
            proc.join()
            receive.close()


@contextlib.contextmanager
def _interrupts_held():
    """Hold a Ctrl-C until the block ends: Python drops the KeyboardInterrupt of one whose handler runs inside its
    fork hooks (any thread, tqdm's monitor included, may take the signal while the main thread forks)."""
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, None)


def _died(code: int, job: list[dict]) -> str:
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return (f"workers: the worker process running {', '.join(t['id'] for t in job)} {how}; the sweep stopped, its "
            f"done runs are kept: rerun the same command to resume")


def prepare(env: str, algos: list[str], seeds, steps: int, grid: dict | None, out: str, base: dict | None = None):
    """Plan a sweep, check that ``out`` holds the same sweep if anything, and list the runs not yet done:
    returns (tasks, out path, tasks to run)."""
    grid, base = grid or {}, dict(base or {})
    tasks = plan(env, algos, seeds, steps, grid, base)
    out_path = writable_folder(out, "out")
    writable_folder(out_path / "runs", "out")
    _check_resumable(out_path, env, steps, base)
    history = commands(out_path / "sweep.json") if (out_path / "sweep.json").exists() else []
    _check_seed_sets(out_path, history, parse_seeds(seeds))
    command = {"algos": list(algos), "seeds": parse_seeds(seeds).text(), "grid": grid}
    write_json(out_path / "sweep.json", {"env": env, "steps": steps, **({"base": base} if base else {}),
                                         "commands": history + ([command] if command not in history else [])})
    todo = [t for t in tasks if not (out_path / "runs" / t["id"] / "done.json").exists()]
    return tasks, out_path, todo


def run_sweep(env: str, algos: list[str], seeds, steps: int, grid: dict | None = None, out: str = "runs/sim",
              workers: int = 2, progress: bool = True, on_run=None, base: dict | None = None) -> dict:
    """Run (or resume) a sweep into ``out`` and return its summary (also written to ``out/summary.json``).
    ``on_run(folder)``, if given, is called in the sweep's process with each run's folder as the run is done;
    ``base``: settings every run shares, in no label (``plan``)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive integer, got {workers!r}")
    planned = plan(env, algos, seeds, steps, grid or {}, base)  # bad settings fail before the folder is touched
    check_memory(jobs([t for t in planned if not (Path(out) / "runs" / t["id"] / "done.json").exists()], workers),
                 workers)
    keep_heap()
    with owned(out):
        tasks, out_path, todo = prepare(env, algos, seeds, steps, grid, out, base)
        grouped = jobs(todo, workers)

        def done(job):
            bar.update(len(job))
            for task in job if on_run else ():
                on_run(out_path / "runs" / task["id"])
        with tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"sim {env}", unit="run",
                  disable=not progress) as bar:  # closed (its line ended) before an error is printed
            if workers == 1 or len(grouped) <= 1:
                for job in grouped:
                    run_tasks(job, str(out_path))
                    done(job)
            else:
                run_jobs(grouped, str(out_path), workers, done)
        summary = summarise(out_path, tasks)
        write_json(out_path / "summary.json", summary)
    return summary


def job_bytes(job: list[dict]) -> tuple[int, list[str]]:
    """A lower bound of the memory a job (a label's seeds, stacked) takes, and the settings it grows with: the four
    [responses, max_len] 8-byte arrays of one step's rollouts (states, tokens, mask, old log-probs: every
    environment samples them; dynamic sampling draws ds_oversample x batch_prompts prompts a round), and for
    feature_lm each environment draw's [n_prompts, answer_len, vocab] table of acceptable tokens. Measured peaks are
    4 to 12 times this (two steps of GRPO, DAPO, DPO and PPO on the three environments, 1 to 4 seeds stacked,
    64,000 to 512,000 responses a step), so a sweep it refuses cannot run."""
    st = job[0]["settings"]
    prompts = math.ceil(st["batch_prompts"] * (st["ds_oversample"] if st["dynamic_sampling"] else 1))
    names = ["batch_prompts", "group_size"] + (["ds_oversample"] if st["dynamic_sampling"] else []) + \
        (["max_len"] if st["max_len"] > 1 else [])
    total = 32 * prompts * st["group_size"] * st["max_len"] * len(job)
    if job[0]["env"] == "feature_lm":
        total += 8 * st["n_prompts"] * st["answer_len"] * st["vocab"] * len({t["settings"]["env_seed"] for t in job})
        names += ["n_prompts", "answer_len", "vocab"]
    return total, names


def available_bytes() -> int | None:
    """The memory this process may still take: MemAvailable (Linux), capped by its cgroup's limit; None where
    unknown."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
        limit, used = (Path("/sys/fs/cgroup") / f for f in ("memory.max", "memory.current"))
        if limit.exists() and limit.read_text().strip().isdigit():
            found.append(int(limit.read_text()) - int(used.read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_memory(grouped: list[list[dict]], workers: int) -> None:
    """Refuse, before anything runs, a sweep whose ``workers`` largest jobs running at once need more memory than
    the machine has (``job_bytes``, a lower bound), naming the settings and both amounts."""
    sizes = sorted(((*job_bytes(job), job) for job in grouped), key=lambda x: x[0], reverse=True)[:workers]
    need, have = sum(size for size, _, _ in sizes), available_bytes()
    if not sizes or have is None or need <= have:
        return
    _, names, job = sizes[0]
    st = job[0]["settings"]
    settings = ", ".join(f"{k}={st[k]}" for k in names)
    raise ValueError(f"settings: {settings} need at least {_size(need)} ({len(sizes)} job(s) at once, the largest "
                     f"{job[0]['label']} with {len(job)} seed(s)); this machine has {_size(have)} available: lower "
                     f"them, or run fewer --workers")


def _size(n: int) -> str:
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def _check_resumable(out: Path, env: str, steps: int, base: dict) -> None:
    """A sweep folder holds one env, one number of steps and one set of base settings (they are in no run's name)."""
    old = out / "sweep.json"
    if old.exists():
        prev = read_json(old)
        if prev.get("env") != env or prev.get("steps") != steps:
            raise ValueError(f"out: {out} holds a sweep with env={prev.get('env')!r}, steps={prev.get('steps')}; "
                             f"expected env={env!r}, steps={steps} to resume it (use another --out)")
        if prev.get("base", {}) != base:
            raise ValueError(f"out: {out} holds a sweep at base settings {prev.get('base', {})}; expected {base} "
                             f"to resume it (use another --out)")


def _check_seed_sets(out: Path, history: list[dict], seeds: Seeds) -> None:
    """A seed keeps its set (discovery or replication) in a sweep folder: the report decides each claim on one set
    and re-checks it on the other, over every run in the folder, so a rerun that moves a seed to the other set is
    refused, naming both commands' ``--seeds``."""
    for old in history:
        if old.get("seeds") is None:
            continue
        before = parse_seeds(old["seeds"])
        moved = next((s for s in seeds.all if s in before.all and before.role(s) != seeds.role(s)), None)
        if moved is not None:
            raise ValueError(f"seeds: {out} holds a sweep with --seeds {before.text()} (discovery:replication); "
                             f"--seeds {seeds.text()} moves seed {moved} from the {before.role(moved)} to the "
                             f"{seeds.role(moved)} set; keep each seed's set, or use another --out")


def commands(sweep_json: Path) -> list[dict]:
    """The commands (algos, seeds, grid) that wrote into a sweep folder, oldest first, from its sweep.json (one
    written before the history was kept holds one command); a ValueError naming the file when they are malformed."""
    sweep = read_json(sweep_json)
    history = sweep.get("commands", [{k: sweep.get(k) for k in ("algos", "seeds", "grid")}])
    if not (isinstance(history, list) and history and all(
            isinstance(c, dict) and isinstance(c.get("algos"), list) and all(isinstance(a, str) for a in c["algos"])
            and isinstance(c.get("grid"), dict) and all(isinstance(v, list) for v in c["grid"].values())
            for c in history)):
        raise ValueError(f"{sweep_json}: commands: expected a list of {{algos: [names], seeds, grid: {{key: "
                         f"[values]}}}}")
    return history


def summarise(out: Path, tasks: list[dict]) -> dict:
    """Per label, the mean over seeds of each run's summary metrics, over every done run in ``out``: this command's
    ``tasks`` and the runs of the earlier commands in the folder. Labels in the order of ``tasks``, then the
    others by name."""
    first = {}
    for i, t in enumerate(tasks):
        first.setdefault(t["label"], i)
    by_label: dict[str, list[dict]] = {}
    for path in sorted((Path(out) / "runs").glob("*/done.json")):
        done = read_json(path)
        if not isinstance(done.get("label"), str):
            raise ValueError(f"{path}: label: expected the run's label, got {done.get('label')!r}")
        by_label.setdefault(done["label"], []).append(done)
    for runs in by_label.values():
        runs.sort(key=lambda r: r["seed"] if isinstance(r.get("seed"), int) else -1)
    table = {}
    for label in sorted(by_label, key=lambda lbl: (first.get(lbl, len(first)), lbl)):
        runs = by_label[label]
        row = {"seeds": len(runs)}
        for key in SUMMARY_KEYS:
            vals = [r[key] for r in runs if r.get(key) is not None]
            row[key] = float(np.mean(vals)) if vals else None
            row[key + "_std"] = float(np.std(vals)) if len(vals) > 1 else None
        table[label] = row
    return {"env": tasks[0]["env"], "steps": tasks[0]["steps"], "algorithms": table,
            "definitions": {"summary": SUMMARY_DEFINITIONS, "per_step": DEFINITIONS}}
