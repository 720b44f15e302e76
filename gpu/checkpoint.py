"""Checkpoints for exact resume: weights (safetensors), optimiser and RNG (torch.save, read with weights_only=True),
and JSON state (step, data position, SAS history); what a resume may change in the config, and its record."""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from spec.records import read_json, read_jsonl, write_text

CKPT = "checkpoint"
HISTORY = "config_history.jsonl"
#: Fields a resume may change freely: they do not change what is trained or how.
FREE_FIELDS = ("run.steps", "run.save_every", "run.progress", "run.resume", "run.threads", "model.cache_dir",
               "rollout.vllm_kv_cache_mb")


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


def save(run_dir: Path, step: int, modules: dict, optimisers: dict, state: dict) -> Path:
    """Write ``run_dir/checkpoint`` atomically (a temporary folder, then a rename)."""
    run_dir = Path(run_dir)
    tmp = run_dir / f"{CKPT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, mod in modules.items():
        sd = {k: v.detach().contiguous().clone() for k, v in mod.state_dict().items()}
        save_file(sd, tmp / f"{name}.safetensors")
    torch.save({"optim": {k: o.state_dict() for k, o in optimisers.items()}, "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
               tmp / "optim.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **_to_json(state), "rng": _to_json(_rng_state())}))
    final = run_dir / CKPT
    old = run_dir / f"{CKPT}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def find(run_dir: Path) -> Path | None:
    """The latest complete checkpoint folder (a crash between the two renames leaves it as '.old')."""
    for name in (CKPT, f"{CKPT}.old"):
        p = Path(run_dir) / name
        if (p / "state.json").exists():
            return p
    return None


def load(ckpt: Path, modules: dict, optimisers: dict) -> dict:
    """Restore weights, optimisers and RNG from ``ckpt``; returns the JSON state (with 'step')."""
    for name, mod in modules.items():
        sd = load_file(ckpt / f"{name}.safetensors")
        missing, unexpected = mod.load_state_dict(sd, strict=False)
        if unexpected or [k for k in missing if k in dict(mod.named_parameters())]:
            raise ValueError(f"checkpoint: {name} does not match the model (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
    blob = torch.load(ckpt / "optim.pt", weights_only=True)
    for k, o in optimisers.items():
        o.load_state_dict(blob["optim"][k])
    torch.set_rng_state(blob["torch_rng"])
    if blob["cuda_rng"]:
        torch.cuda.set_rng_state_all(blob["cuda_rng"])
    state = read_json(ckpt / "state.json")
    rng = state.pop("rng")
    random.setstate(_tuples(rng["python"]))
    npst = rng["numpy"]
    npst["state"]["key"] = np.array(npst["state"]["key"], dtype=np.uint32)
    np.random.set_state(npst)
    return state


def trim_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after ``step`` (by a run killed after its last checkpoint), and a half-written
    last line (with a warning); the file is rewritten atomically."""
    if not path.exists():
        return
    keep = [rec for rec in read_jsonl(path) if rec.get("step", 0) <= step]
    write_text(path, "".join(json.dumps(rec) + "\n" for rec in keep))


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
    """Compare the config ``new`` with the one the run of checkpoint ``ckpt`` was trained with (its config.json).
    A difference is refused with the fields named unless ``allow``; then returns the record of the change for
    :func:`record_config_change` (None when nothing changed)."""
    path = Path(ckpt).parent / "config.json"
    if not path.exists():
        return None
    old = read_json(path)
    old.pop("resolved", None)
    changes = config_changes(old, new)
    if not changes:
        return None
    step = read_json(Path(ckpt) / "state.json")["step"]
    if not allow:
        text = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())
        raise ValueError(f"run.out_dir: {path.parent} was trained to step {step} with another config ({text}); "
                         "pass --allow-config-change to resume under the new one (recorded in its "
                         f"{HISTORY}), set run.resume=false to start over, or use another run.out_dir")
    return {"from_step": step, "changes": changes, "previous": old}


def record_config_change(run_dir: Path, change: dict) -> None:
    """Append ``change`` to the run's config_history.jsonl (before config.json is overwritten with the new
    config, so config.json and its history together always tell which config trained which steps)."""
    with open(Path(run_dir) / HISTORY, "a") as f:
        f.write(json.dumps(change) + "\n")
