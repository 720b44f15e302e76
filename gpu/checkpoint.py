"""The run folder: checkpoints for exact resume (weights as safetensors; optimiser and RNG by torch.save, read with
weights_only=True; JSON state: step, data position, SAS history; and the config they were trained with), its lock,
its metrics, what a resume may change in the config, starting over, and the record of both in config_history.jsonl.

Each checkpoint file is written whole to ``checkpoint.tmp``, fsynced, and the folder fsynced; then the previous
checkpoint is renamed to ``checkpoint.old``, the new one to ``checkpoint``, the run folder fsynced after each rename,
and only then is the previous one deleted. After a kill or a power loss the folder holds one complete checkpoint."""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from spec.records import open_lock, read_json, read_jsonl, take_lock, write_text
from spec.schema import Rule, cut, show

CKPT = "checkpoint"
HISTORY = "config_history.jsonl"
LOCK = "train.lock"
TRASH = "discarded.tmp"  # a superseded checkpoint, renamed here in one step, then deleted
#: Fields a resume may change freely: they do not change what is trained or how (out_dir: a moved or copied run).
FREE_FIELDS = ("run.out_dir", "run.steps", "run.save_every", "run.progress", "run.resume", "run.threads",
               "model.cache_dir", "rollout.vllm_kv_cache_mb")


# -- the lock and durable writes ------------------------------------------------------------------------------
def own(run_dir: Path) -> int:
    """Take the run folder for this process: an exclusive ``flock`` on ``run_dir/train.lock`` (never through a
    symbolic link), which holds the owner's pid; returns its descriptor (closing it releases the folder). The
    kernel drops the lock when its process ends, so a killed run leaves no stale lock. A folder another run holds
    is refused, naming it."""
    fd = open_lock(Path(run_dir) / LOCK, "run.out_dir", "the run's lock")
    owner = take_lock(fd)
    if owner is not None:
        os.close(fd)
        raise ValueError(f"run.out_dir: {run_dir} is in use by another training run (pid {owner or '?'}); wait for "
                         "it to finish, or use another run.out_dir")
    return fd


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Sink:
    """A file for the writers of :func:`_write_file` that keeps the OSError of a failed write (torch.save reports
    it as a bare RuntimeError)."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def _write_file(path: Path, fill) -> None:
    """Create ``path`` with ``fill(file)``, then fsync it; a failed write is an OSError naming ``path``."""
    try:
        with open(path, "wb") as f:
            sink = _Sink(f)
            try:
                fill(sink)
            except RuntimeError:
                if sink.error is None:
                    raise
                raise sink.error from None
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None


@contextlib.contextmanager
def _writing(path: Path):
    """An OSError (EFBIG, ENOSPC, EACCES) in the block becomes a one-line ValueError naming ``path``."""
    try:
        yield
    except OSError as exc:
        raise ValueError(f"{exc.filename or path}: cannot write it ({exc.strerror or exc})") from None


def append_metrics(run_dir: Path, metrics: dict) -> None:
    """Append one step's record to ``run_dir/metrics.jsonl``, on disk before the step's checkpoint is."""
    path = Path(run_dir) / "metrics.jsonl"
    with _writing(path), open(path, "a") as f:
        f.write(json.dumps(metrics) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_config(run_dir: Path, config: dict) -> None:
    """``run_dir/config.json``: the run's config (with its resolved settings), atomically."""
    path = Path(run_dir) / "config.json"
    with _writing(path):
        write_text(path, json.dumps(config, indent=2))


# -- checkpoints --------------------------------------------------------------------------------------------------
def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(legacy=False)}


def _to_json(x):
    if isinstance(x, (tuple, list)):
        return [_to_json(v) for v in x]
    if isinstance(x, dict):
        return {k: _to_json(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.integer):
        return int(x)
    return x


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def save(run_dir: Path, step: int, modules: dict, optimisers: dict, state: dict, config: dict) -> Path:
    """Write ``run_dir/checkpoint`` (the weights of ``modules``, ``optimisers``, the RNGs, the JSON ``state`` and
    the ``config`` trained with) so that a kill or a power loss at any moment leaves the previous checkpoint or
    this one, complete. A write that fails (a full disk, ``ulimit -f``) is a ValueError naming the file; the
    previous checkpoint is kept."""
    run_dir = Path(run_dir)
    tmp, final, old = run_dir / f"{CKPT}.tmp", run_dir / CKPT, run_dir / f"{CKPT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    blob = {"optim": {k: o.state_dict() for k, o in optimisers.items()}, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    try:
        tmp.mkdir()
        for name, mod in modules.items():  # cloned: tied weights share storage, which safetensors refuses
            sd = {k: v.detach().contiguous().clone() for k, v in mod.state_dict().items()}
            _write_file(tmp / f"{name}.safetensors", lambda f, sd=sd: f.write(safetensors_bytes(sd)))
        _write_file(tmp / "optim.pt", lambda f: torch.save(blob, f))
        text = json.dumps({"step": step, **_to_json(state), "rng": _to_json(_rng_state())})
        _write_file(tmp / "state.json", lambda f: f.write(text.encode()))
        _write_file(tmp / "config.json", lambda f: f.write(json.dumps(config, indent=2).encode()))
        _fsync(tmp)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = "the previous checkpoint is kept" if find(run_dir) else "no checkpoint is written yet"
        raise ValueError(f"{exc.filename or tmp}: cannot write the checkpoint of step {step} "
                         f"({exc.strerror or exc}); {kept}") from None
    if final.exists():  # else a crash between the renames left the previous one as '.old': kept until replaced
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        _fsync(run_dir)
    os.replace(tmp, final)
    _fsync(run_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def tidy(run_dir: Path) -> None:
    """Delete what a killed run can leave in its folder: temporary files and folders (``*.tmp``: incomplete or
    superseded), and ``checkpoint.old`` once ``checkpoint`` is complete."""
    run_dir = Path(run_dir)
    for p in run_dir.glob("*.tmp"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    if find(run_dir) == run_dir / CKPT:
        shutil.rmtree(run_dir / f"{CKPT}.old", ignore_errors=True)


def find(run_dir: Path) -> Path | None:
    """The latest complete checkpoint folder (a crash between the two renames leaves it as '.old')."""
    for name in (CKPT, f"{CKPT}.old"):
        p = Path(run_dir) / name
        if (p / "state.json").exists():
            return p
    return None


def read_state(ckpt: Path) -> dict:
    """``ckpt/state.json``, its step and data position checked (a ValueError naming the file and the field)."""
    path = Path(ckpt) / "state.json"
    state = read_json(path)
    for name, rule in (("step", Rule(int, ge=1)), ("stream", Rule(dict)), ("sas", Rule(dict)), ("rng", Rule(dict))):
        rule.check(f"{path}: {name}", state.get(name))
    for name in ("seed", "epoch", "pos"):
        Rule(int, ge=0).check(f"{path}: stream.{name}", state["stream"].get(name))
    return state


@contextlib.contextmanager
def _restoring(path: Path, what: str):
    """A malformed or truncated ``what`` in ``path`` becomes a one-line ValueError naming both."""
    try:
        yield
    except (SafetensorError, OSError, RuntimeError, EOFError, pickle.UnpicklingError, KeyError, TypeError,
            IndexError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ValueError(f"{path}: cannot restore {what} from it ({type(exc).__name__}: {detail}); truncated or "
                         "from another model? set run.resume=false to start over") from None


def load(ckpt: Path, modules: dict, optimisers: dict) -> dict:
    """Restore weights, optimisers and RNG from ``ckpt``; returns the JSON state (with 'step'). A truncated or
    malformed file is a ValueError naming it."""
    ckpt = Path(ckpt)
    state = read_state(ckpt)
    for name, mod in modules.items():
        path = ckpt / f"{name}.safetensors"
        with _restoring(path, f"the {name} weights"):
            missing, unexpected = mod.load_state_dict(load_file(path), strict=False)
        if unexpected or [k for k in missing if k in dict(mod.named_parameters())]:
            raise ValueError(f"{path}: the {name} weights do not match the model (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
    path = ckpt / "optim.pt"
    with _restoring(path, "the optimiser and RNG state"):
        blob = torch.load(path, weights_only=True)
        for k, o in optimisers.items():
            o.load_state_dict(blob["optim"][k])
        torch.set_rng_state(blob["torch_rng"])
        if blob["cuda_rng"]:
            torch.cuda.set_rng_state_all(blob["cuda_rng"])
    rng = state.pop("rng")
    with _restoring(ckpt / "state.json", "the field 'rng'"):
        random.setstate(_tuples(rng["python"]))
        npst = rng["numpy"]
        npst["state"]["key"] = np.array(npst["state"]["key"], dtype=np.uint32)
        np.random.set_state(npst)
    return state


def trim_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after ``step`` (by a run killed after its last checkpoint), and a half-written
    last line (with a warning); the file is rewritten atomically. What remains must be steps 1..``step``, each
    once: a gap or a repeat (runs mixed in one folder, lines lost) is refused."""
    rows = read_jsonl(path) if path.exists() else []
    keep = [rec for rec in rows if not isinstance(rec.get("step"), int) or rec["step"] <= step]
    steps = [rec.get("step") for rec in keep]
    if steps != list(range(1, step + 1)):
        bad = next((i for i, s in enumerate(steps, 1) if s != i), len(steps) + 1)
        found = "the end of the file" if bad > len(steps) else f"step {show(steps[bad - 1])}"
        raise ValueError(f"{path}: expected steps 1 to {step} (the checkpoint's), each once; record {bad} should "
                         f"be step {bad}, found {found} (runs mixed, or lines lost); set run.resume=false to start "
                         "over, or use another run.out_dir")
    with _writing(path):
        write_text(path, "".join(json.dumps(rec) + "\n" for rec in keep))


# -- config changes, starting over, history -----------------------------------------------------------------------
def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def config_changes(old: dict, new: dict) -> dict:
    """``{field: [old value, new value]}`` for every dotted field whose value differs, leaving out FREE_FIELDS."""
    a, b = _flat(old), _flat(json.loads(json.dumps(new)))
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k not in FREE_FIELDS}


def resume_config_change(ckpt: Path, new: dict, allow: bool) -> dict | None:
    """Compare the config ``new`` with the one checkpoint ``ckpt`` was trained with: its own config.json, the record
    a resume follows. A difference, or a checkpoint without its config, is refused with the fields named unless
    ``allow``; then returns the record of the change for :func:`record` (None when nothing changed). The run
    folder's config.json (the same config, written for readers) edited to disagree with the checkpoint's is
    refused too, naming the field and both values: a resume would silently not follow it."""
    path = Path(ckpt) / "config.json"
    step = read_state(ckpt)["step"]
    how = (f"pass --allow-config-change to resume under the new one (recorded in its {HISTORY}), set "
           "run.resume=false to start over, or use another run.out_dir")
    if not path.exists():
        if not allow:
            raise ValueError(f"run.out_dir: {path} is missing, so the config that trained its {step} steps is "
                             f"unknown; {how}")
        return {"event": "config_change", "from_step": step, "changes": None, "previous": None}
    old = read_json(path)
    changes = config_changes(old, new)
    if changes and not allow:
        text = "; ".join(f"{k}: {show(a)} -> {show(b)}" for k, (a, b) in changes.items())
        raise ValueError(f"run.out_dir: {path.parent.parent} was trained to step {step} with another config "
                         f"({cut(text)}); {how}")
    if not allow:
        _check_folder_record(path.parent.parent / "config.json", old, path, step)
    return {"event": "config_change", "from_step": step, "changes": changes, "previous": old} if changes else None


def _check_folder_record(folder_record: Path, trained: dict, ckpt_record: Path, step: int) -> None:
    """Refuse a run folder's config.json that disagrees with ``trained`` (the checkpoint's config, in
    ``ckpt_record``), naming the first field that differs and both values. One that is missing or cannot be read
    holds no field to follow: the resume writes it again from the checkpoint's (with a warning when unreadable)."""
    if not folder_record.exists():
        return
    try:
        shown = read_json(folder_record)
    except ValueError as exc:
        warnings.warn(f"{exc}; it is written again from {ckpt_record}", stacklevel=2)
        return
    shown = {k: v for k, v in shown.items() if k != "resolved"}  # resolved: derived from the rest, for readers
    differ = config_changes(trained, shown)
    if differ:
        field, (was, now) = next(iter(differ.items()))
        more = f" (and {len(differ) - 1} more fields)" if len(differ) > 1 else ""
        raise ValueError(f"{folder_record}: {field} is {show(now)}{more}, but the checkpoint of step {step} was "
                         f"trained with {show(was)} ({ckpt_record}: the record a resume follows); to train on under "
                         f"another config, give it with --config and pass --allow-config-change; else restore "
                         f"{folder_record.name} (or delete it: it is written again from the checkpoint's)")


def record(run_dir: Path, entry: dict) -> None:
    """Add ``entry`` to the run's config_history.jsonl (rewritten whole, atomically: never a torn line), before
    config.json is overwritten, so that config.json and its history together tell which config trained which
    steps."""
    path = Path(run_dir) / HISTORY
    text = path.read_text() if path.exists() else ""
    with _writing(path):
        write_text(path, text + json.dumps(entry) + "\n")


def _earlier_run(run_dir: Path) -> dict | None:
    """What an earlier run left in ``run_dir`` (its config, checkpoint step, metric lines), or None if nothing.
    Read leniently: starting over must work whatever state the folder is in."""
    config, ckpt, metrics = run_dir / "config.json", find(run_dir), run_dir / "metrics.jsonl"
    lines = len(metrics.read_text(errors="replace").splitlines()) if metrics.exists() else 0
    if not (config.exists() or ckpt or lines):
        return None
    try:
        previous = read_json(config)
    except ValueError:
        previous = None
    try:
        step = read_state(ckpt)["step"] if ckpt else None
    except ValueError:
        step = None
    return {"event": "start_over", "previous_checkpoint_step": step, "previous_metric_lines": lines,
            "previous": previous}


def start_over(run_dir: Path) -> None:
    """Clear ``run_dir`` for a run from step 0: an earlier checkpoint is superseded by one rename each (an older
    '.old' first, so no older checkpoint ever becomes the one found), the folder fsynced, then deleted; an earlier
    run's config and progress are recorded in the history, and metrics.jsonl is emptied."""
    run_dir = Path(run_dir)
    earlier = _earlier_run(run_dir)
    trash = run_dir / TRASH
    superseded = [name for name in (f"{CKPT}.old", CKPT) if (run_dir / name).exists()]
    if superseded:
        trash.mkdir()
        for name in superseded:
            os.replace(run_dir / name, trash / name)
            _fsync(run_dir)
        shutil.rmtree(trash)
    if earlier:
        record(run_dir, earlier)
    with _writing(run_dir / "metrics.jsonl"):
        write_text(run_dir / "metrics.jsonl", "")
