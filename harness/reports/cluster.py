"""``cliplab report`` on a cluster's own logs: verl's file logger (JSONL of ``{"step", "data"}``), verl's console
logger (``step:N - key:value - ...`` lines), TRL's ``trainer_state.json`` (``log_history``), and the TensorBoard event
folders both write, beside cliplab's own run folders. Their metric names are mapped onto cliplab's; a metric a log
lacks stays absent. A run is named by its ``run.json``, its folder or ``--label NAME=PATH``, and its algorithm is
``run.json``'s, ``--algo NAME=ALGO``'s or its folder name when that is an algorithm. The report is the runs' summary
and curves, the papers' claims (a claim whose metrics a log lacks names the logged metric it needs), and the
published numbers of each recipe run beside the measured ones.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from spec.extras import require
from spec.records import naming, read_json, read_text, safe_name, write_text
from spec.schema import did_you_mean, show

from harness.reports.claim_record import Kind, RunSet, Verdict, finding
from harness.reports.claim_render import DETAILS_NAME, JSON_NAME, write_claims
from harness.reports.claims import CLAIMS
from harness.reports.published import published
from harness.reports.regime import card_lines, run_set_card
from harness.reports.rundirs import LOG_NAMES, Groups, fmt, load_runs, md, output_file, shell_line
from harness.reports.sim import repo_path

#: verl metric -> cliplab metric. ``actor/kl_loss`` is the KL to the reference under verl's kl_loss_type (k3 for
#: low_var_kl); ``actor/cliplab_rur`` is logged by cliplab's verl losses; ``critic/score/mean`` the task score.
VERL = {"actor/pg_clipfrac": "clip_frac", "actor/entropy": "entropy", "critic/score/mean": "reward",
        "response_length/mean": "resp_len", "actor/kl_loss": "kl_ref", "actor/cliplab_rur": "rur",
        "response_length/clip_ratio": "truncated"}
#: verl's validation metrics: per data source, the mean over the N samples of a prompt of the reward function's
#: ``acc`` (-> accuracy) or of its score (``reward`` -> val_reward), under val-core (the data source's headline
#: variable, acc if the reward function returns one) or val-aux (the other).
VERL_VAL = re.compile(r"^val-(?P<sec>core|aux)/(?P<source>[^/]+)/(?P<var>acc|reward)/mean@(?P<n>\d+)$")
VAL_METRICS = {"acc": "accuracy", "reward": "val_reward"}
#: TRL GRPOTrainer log_history key -> cliplab metric (``cliplab/rur`` is logged by CliplabGRPOTrainer); its
#: TensorBoard tags are these keys under ``train/``.
TRL = {"clip_ratio/region_mean": "clip_frac", "clip_ratio/high_mean": "clip_up_frac",
       "clip_ratio/low_mean": "clip_low_frac", "entropy": "entropy", "reward": "reward",
       "completions/mean_length": "resp_len", "kl": "kl_ref", "cliplab/rur": "rur",
       "frac_reward_zero_std": "zero_grad_frac", "completions/clipped_ratio": "truncated"}
TB_EVENTS = "events.out.tfevents.*"
FORMATS = ("verl's file-logger JSONL, verl's console log (step:N - key:value lines), TRL's trainer_state.json or a "
           "TensorBoard event folder of verl or TRL")

#: The metrics (and algorithms whose runs must have them) each claim of ``harness.reports.claims`` reads, by its name.
NEEDS = {"claim_dcpo_tcr": (("clip_frac",), ("dcpo", "grpo", "dapo")),
         "claim_dcpo_rur": (("rur",), ("dcpo", "grpo")),
         "claim_clip_higher": (("entropy", "clip_frac"), ("grpo", "dapo", "ppo", "dr_grpo")),
         "claim_gspo_clips": (("clip_frac",), ("gspo", "grpo")),
         "claim_drgrpo_length": (("len_wrong",), ("grpo", "dr_grpo")),
         "claim_sapo": (("accuracy_exact", "entropy"), ("sapo",)),
         "claim_dynamic_sampling": (("gen_per_trained", "zero_grad_frac"), ("dapo",)),
         "claim_dcpo_accuracy": (("accuracy",), ("dcpo", "gspo", "grpo", "dapo")),
         "claim_entropy_collapse": (("entropy", "pass@64"), ("grpo", "dapo")),
         "claim_entropy_law": (("entropy_change_pred", "entropy_change_rows", "cov_interval", "entropy_change"),
                               ("grpo", "dapo", "ppo")),
         "claim_random_reward": (("entropy",), ("grpo", "dapo")),
         "claim_dcpo_reward": (("accuracy_exact",), ("dcpo",)),
         "claim_cov_entropy": (("entropy", "accuracy_exact", "cov_frac"), ("clip_cov", "kl_cov")),
         "claim_cispo": (("accuracy_exact", "ppo_zeroed_frac", "trunc_frac"), ("cispo",)),
         "claim_rollout_correction": (("accuracy_exact", "rc_weight_mean", "rc_cut_frac"), ("grpo",))}
COLUMNS = (("reward", "first"), ("reward", "last"), ("accuracy", "final"), ("val_reward", "final"),
           ("clip_frac", "mean"), ("rur", "mean"), ("entropy", "final"), ("resp_len", "mean"), ("kl_ref", "final"),
           ("zero_grad_frac", "mean"))
PERCENT = ("clip_frac", "rur", "zero_grad_frac", "accuracy")
#: The curves drawn, where some run logs them; validation metrics (logged every few steps) as markers.
PANELS = ("accuracy", "val_reward", "reward", "entropy", "clip_frac", "rur", "kl_ref", "resp_len", "zero_grad_frac")


def warn(path, text: str) -> None:
    print(f"warning: {path}: {text}", file=sys.stderr)


# ---- readers: each returns (records with cliplab names, note) ---------------------------------------------------
def _lines(path: Path, errors: str = "strict") -> tuple[list[str], bool]:
    """The file's lines and whether the last one is complete (ends with a newline)."""
    text = read_text(path, errors)
    return text.split("\n")[:-1], text.endswith("\n") or not text


def _mapped(step: int, data: dict, names: dict, where: str) -> dict:
    """A step's numbers under cliplab's names; verl's validation metrics under their own keys until ``_validation``
    picks one per run. A metric read here whose value is not a number is a ValueError naming ``where`` (the file
    and its line or entry) and the key; null is a metric not logged at that step; other keys are not read."""
    rec = {"step": step}
    for key, value in data.items():
        name = names.get(key) or (key if names is VERL and VERL_VAL.match(key) else None)
        if name is None or value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{where}: {key}: expected a number, got {show(value)}")
        rec[name] = float(value)
    return rec


def _validation(records: list[dict]) -> list[str]:
    """Map a run's validation metrics onto accuracy and val_reward, one logged key each for the whole run (val-core
    before val-aux, then the first data source by name); returns the keys used."""
    logged = {k for rec in records for k in rec if VERL_VAL.match(k)}
    used = []
    for var, metric in VAL_METRICS.items():
        keys = sorted((m.group("sec") != "core", m.group("source"), k) for k in logged
                      if (m := VERL_VAL.match(k)).group("var") == var)
        if keys:
            used.append(keys[0][2])
            for rec in records:
                if keys[0][2] in rec:
                    rec[metric] = rec[keys[0][2]]
    for rec in records:
        for k in logged & rec.keys():
            del rec[k]
    return used


def read_verl_jsonl(path: Path) -> tuple[list[dict], str]:
    lines, complete = _lines(path)
    records, note = [], ""
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{path}: line {i + 1} is not JSON; expected {FORMATS}") from None
        if not (isinstance(obj, dict) and isinstance(obj.get("step"), int) and isinstance(obj.get("data"), dict)):
            raise ValueError(f"{path}: line {i + 1} is not a verl file-logger record {{step, data}}")
        records.append(_mapped(obj["step"], obj["data"], VERL, f"{path}: line {i + 1}"))
    if not complete:
        note = "cut short (its last line is incomplete)"
    return _merge(records), note


_CONSOLE_STEP = re.compile(r"(?:^|\s)step:(?P<step>\d+) - (?P<rest>.*)$")
_WRAPPED = re.compile(r"^[\w.]+\((?P<inner>[^()]*)\)$")  # np.float64(0.5), tensor(0.5): pprint of numpy/torch


def _console_value(text: str) -> float | None:
    text = text.strip()
    m = _WRAPPED.match(text)
    try:
        return float((m.group("inner") if m else text).split(",")[0])
    except ValueError:
        return None


def read_verl_console(path: Path) -> tuple[list[dict], str]:
    """Lines ``step:N - key:value - ...`` as verl's console logger prints them, anywhere in a line (Ray prefixes
    its workers' output with ``(TaskRunner pid=...)``; bytes that are not UTF-8 in other output are read as U+FFFD)."""
    lines, complete = _lines(path, errors="replace")
    records = []
    for i, line in enumerate(lines):
        m = _CONSOLE_STEP.search(line)
        if not m:
            continue  # other console output
        data = {}
        for part in m.group("rest").split(" - "):
            key, sep, value = part.partition(":")
            if sep and value.strip() != "None":  # Python's None printed: not logged at this step
                number = _console_value(value)
                data[key.strip()] = value.strip() if number is None else number
        records.append(_mapped(int(m.group("step")), data, VERL, f"{path}: line {i + 1}"))
    if not records:
        raise ValueError(f"{path}: no 'step:N - key:value' lines; expected {FORMATS}")
    return _merge(records), "" if complete else "cut short (its last line is incomplete)"


def read_trl_state(path: Path) -> tuple[list[dict], str]:
    try:
        state = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}); expected TRL's trainer_state.json") from None
    if not (isinstance(state, dict) and isinstance(state.get("log_history"), list)):
        raise ValueError(f"{path}: no log_history; expected TRL's trainer_state.json")
    for field in ("global_step", "max_steps"):
        _check_int(path, field, state.get(field))
    records = []
    for i, entry in enumerate(state["log_history"]):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: log_history[{i}]: expected an object, got {show(entry)}")
        if "step" in entry and "train_runtime" not in entry:
            _check_int(path, f"log_history[{i}].step", entry["step"], required=True)
            records.append(_mapped(entry["step"], entry, TRL, f"{path}: log_history[{i}]"))
    done, planned = state.get("global_step"), state.get("max_steps")
    note = f"cut short at step {done} of {planned}" if done and planned and done < planned else ""
    return _merge(records), note


def _check_int(path: Path, field: str, value, required: bool = False) -> None:
    """A ValueError naming the file and the field unless ``value`` is an integer (or, when not ``required``, absent)."""
    if (value is not None or required) and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{path}: {field}: expected an integer, got {show(value)}")


def _merge(records: list[dict]) -> list[dict]:
    """One record per step (a framework may log a step's metrics in several calls), in step order."""
    by_step: dict[int, dict] = {}
    for rec in records:
        by_step.setdefault(rec["step"], {}).update(rec)
    return [by_step[s] for s in sorted(by_step)]


def read_tensorboard(paths) -> tuple[list[dict], str, str]:
    """TensorBoard event folders (or files) of one run, read with TensorBoard's own EventAccumulator; several (a
    resumed run's) are merged in the order they were started, a later one's steps replacing an earlier one's.
    verl's tags are its metric names; TRL's are its log keys under ``train/``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    loaded = []
    for path in paths:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})  # 0: keep every point
        acc.Reload()
        tags = acc.Tags()["scalars"]
        if not tags:
            raise ValueError(f"{path}: a TensorBoard event folder with no scalars; expected {FORMATS}")
        loaded.append((min(e.wall_time for t in tags for e in acc.Scalars(t)), acc, tags))
    data: dict[int, dict] = {}
    trl = all(_trl_tags(tags) for _, _, tags in loaded)
    for _, acc, tags in sorted(loaded, key=lambda x: x[0]):
        for t in tags:
            key = t.removeprefix("train/") if trl else t
            for e in acc.Scalars(t):
                data.setdefault(e.step, {})[key] = e.value
    records = [_mapped(step, d, TRL if trl else VERL, f"{', '.join(map(str, paths))}: step {step}")
               for step, d in data.items()]
    return _merge(records), "trl" if trl else "verl", ""


def _trl_tags(tags) -> bool:
    """TRL writes every training log key under train/ (transformers' TensorBoardCallback); verl writes its own
    names (actor/, critic/, val-core/, ...)."""
    return any(t.startswith("train/") for t in tags) and not any(t in VERL or VERL_VAL.match(t) for t in tags)


READERS = {"verl.jsonl": read_verl_jsonl, "console.log": read_verl_console, "trainer_state.json": read_trl_state}


class Log(NamedTuple):
    records: list[dict]  # one per step, cliplab's metric names
    framework: str  # verl or trl
    note: str  # why the log is cut short, or ""
    validation: list[str]  # the validation keys read as accuracy and val_reward


def read_log(path) -> Log:
    """One log: a file, its format told by its name or, failing that, its content, or TensorBoard event folders
    (a list of them: one run's)."""
    if isinstance(path, (list, tuple)) or Path(path).is_dir() or Path(path).name.startswith("events.out.tfevents"):
        records, framework, note = read_tensorboard([path] if isinstance(path, (str, Path)) else path)
        return Log(records, framework, note, _validation(records))
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such log file")
    reader = READERS.get(path.name)
    if reader is None:
        head = read_text(path, errors="replace")[:2000].lstrip()
        if head.startswith('{"step"'):
            reader = read_verl_jsonl
        elif head.startswith("{") and '"log_history"' in head:
            reader = read_trl_state
        elif any(_CONSOLE_STEP.search(line) for line in head.splitlines()):
            reader = read_verl_console
        else:
            raise ValueError(f"{path}: unknown log format; expected {FORMATS}")
    records, note = reader(path)
    return Log(records, "trl" if reader is read_trl_state else "verl", note, _validation(records))


# ---- run folders -----------------------------------------------------------------------------------------------
def _tb_folders(root: Path) -> list[Path]:
    """Folders under ``root`` (itself included) holding TensorBoard event files, but not cliplab's own (OUT/tb
    beside metrics.jsonl: its run folder is read instead)."""
    found = {q.parent for q in root.glob(f"**/{TB_EVENTS}")}
    return sorted(d for d in found if not (d.name == "tb" and (d.parent / "metrics.jsonl").is_file()))


def _tb_run_folder(folder: Path) -> Path:
    """The run an event folder belongs to: TRL writes <output_dir>/runs/<date_host>/, verl its experiment's folder."""
    return folder.parent.parent if folder.parent.name == "runs" else folder


def _log_of(folder: Path):
    """The log a run folder holds: verl's JSONL before its console, TRL's final state before its last checkpoint,
    then the TensorBoard event folders under it."""
    for name in LOG_NAMES:
        if (folder / name).exists():  # a FIFO or a folder under a log's name is refused by its reader
            return folder / name
    ckpts = sorted((p for p in folder.glob("checkpoint-*/trainer_state.json") if p.parent.name[11:].isdigit()),
                   key=lambda p: int(p.parent.name[11:]))
    if ckpts:
        return ckpts[-1]
    return tuple(_tb_folders(folder)) or None


def _run_folders(root: Path) -> list[Path]:
    """Folders under ``root`` holding run.json or a log under its usual name (a checkpoint's state counts for the
    folder above it)."""
    found = set()
    for name in (*LOG_NAMES, "run.json"):
        for q in root.glob(f"**/{name}"):
            found.add(q.parent.parent if q.parent.name.startswith("checkpoint-") else q.parent)
    return sorted(found)


def _named_verl_logs(root: Path, folders: list[Path]) -> list[Path]:
    """verl file-logger files at verl's default place, <project>/<experiment>.jsonl, outside the run folders."""
    out = []
    for q in sorted(root.glob("**/*.jsonl")):
        if q.name not in ("metrics.jsonl", "verl.jsonl") and q.parent not in folders and q.is_file():  # no FIFO
            with q.open(errors="replace") as f:
                if f.read(16).replace(" ", "").startswith('{"step":'):
                    out.append(q)
    return out


def _logs_under(root: Path) -> list[tuple[Path, object]]:
    """(run folder, log) of every cluster run under ``root``: run folders by their logs or run.json, verl's
    <project>/<experiment>.jsonl files, and TensorBoard event folders outside those run folders (grouped by run)."""
    folders = _run_folders(root)
    found = [(q.parent, q) for q in _named_verl_logs(root, folders)]
    for f in folders:
        log = _log_of(f)
        if log is None:
            raise ValueError(f"{f / 'run.json'}: no log beside it (expected one of {', '.join(LOG_NAMES)} or a "
                             "TensorBoard event folder)")
        found.append((f, log))
    by_run: dict[Path, list[Path]] = {}
    for d in _tb_folders(root):
        if not any(f == d or f in d.parents for f in folders):
            by_run.setdefault(_tb_run_folder(d), []).append(d)
    return found + [(f, tuple(ds)) for f, ds in by_run.items()]


def handles(paths) -> bool:
    """Whether ``paths`` hold a cluster log (so that ``cliplab report`` uses this module)."""
    for p in map(Path, paths):
        if not p.is_dir():  # a log file, or a path that does not exist (reported as such)
            return True
        if _run_folders(p) or _named_verl_logs(p, []) or _tb_folders(p):
            return True
    return False


def load(paths, labels=(), algos=()) -> tuple[list[dict], list[str]]:
    """Runs (as ``harness.reports.rundirs`` runs: label, algo, params, seed, records) from log files, folders of cluster
    runs and cliplab run folders, named by ``labels`` (NAME=PATH) and ``algos`` (NAME=ALGO); and one note per log
    that was cut short."""
    runs, notes = [], []
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"{p}: no such file or folder")
        if p.is_file():
            found = [(_tb_run_folder(p.parent) if p.name.startswith("events.out.tfevents") else p.parent, p)]
        else:
            found = _logs_under(p)
            if any(p.glob("**/metrics.jsonl")):  # cliplab's own run folders (cliplab train / sim)
                runs += [{**r, "framework": "cliplab", "path": p} for r in load_runs([p])]
        for folder, log in found:
            run = {**_run_of(folder, log), "path": p}
            if run["note"]:
                warn(run["log"], run["note"] + (f"; reported up to step {run['records'][-1]['step']}"
                                                if run["records"] else "; no complete step"))
                notes.append(f"{run['log']}: {run['note']}")
            runs.append(run)
    if not runs:
        raise ValueError(f"paths: no logs under {', '.join(map(str, paths))}; expected {FORMATS}")
    _apart_from_simulator(runs)
    name_runs(runs, paths, labels, algos)
    _unique_labels(runs)
    for r in runs:
        if r["algo"] is None:
            warn(r["label"], f"no algorithm known, so no claim reads it; name it with --algo {r['label']}=ALGO "
                             "or in its run.json")
    return runs, notes


def _apart_from_simulator(runs: list[dict]) -> None:
    """A simulator sweep's runs (a toy environment's) and a cluster's logs are no one comparison: a ValueError
    naming the paths of each and the two commands that report them apart."""
    sim = sorted({str(r["path"]) for r in runs if r["framework"] == "cliplab" and r.get("env")})
    cluster = sorted({str(r["path"]) for r in runs if r["framework"] != "cliplab"})
    if sim and cluster:
        raise ValueError(f"paths: {', '.join(sim)} hold simulator runs (cliplab sim) and {', '.join(cluster)} "
                         f"cluster logs, which one table would compare as equals; report them apart: "
                         f"{shell_line('cliplab', 'report', *sim)} and {shell_line('cliplab', 'report', *cluster)}")


def _run_of(folder: Path, log) -> dict:
    records, framework, note, validation = read_log(log)
    meta = _run_json(folder / "run.json") if (folder / "run.json").exists() else {}
    if meta.get("steps") and records and not note and records[-1]["step"] < meta["steps"]:
        note = f"cut short at step {records[-1]['step']} of {meta['steps']}"
    is_file = isinstance(log, Path) and log.is_file() and not log.name.startswith("events.out.tfevents")
    name = meta.get("run") or (log.stem if is_file and log.name not in LOG_NAMES else folder.name)
    from spec.registry import ALGORITHMS
    algo = meta.get("algorithm") or (name if name in ALGORITHMS else None)
    shown = ", ".join(map(str, log)) if isinstance(log, tuple) else str(log)
    return {"dir": str(folder), "label": name, "algo": algo, "params": meta.get("params") or {}, "seed": 0,
            "records": records, "framework": framework, "log": shown, "note": note, "validation": validation,
            "recipe": meta.get("recipe"), "run": meta.get("run")}


def _pairs(entries, option: str, what: str, at_last: bool = False) -> list[tuple[str, str]]:
    """``NAME=VALUE`` entries of ``option`` as (name, value), split at the first '=' (at the last when ``at_last``:
    a VALUE without one); a ValueError naming ``option`` for a malformed one."""
    out = []
    for entry in entries:
        name, sep, value = entry.rpartition("=") if at_last else entry.partition("=")
        if not (sep and name.strip() and value.strip()):
            raise ValueError(f"{option}: expected NAME={what}, got {entry!r}")
        out.append((name.strip(), value.strip()))
    return out


def name_runs(runs: list[dict], paths, labels=(), algos=()) -> None:
    """Apply ``--label NAME=PATH`` (PATH one of ``paths``, holding one run) and ``--algo NAME=ALGO`` (NAME a label
    or one of ``paths``, ALGO in the registry): a ValueError listing the choices for an entry that names neither."""
    from spec.registry import ALGORITHMS
    given = {Path(p).resolve(): Path(p) for p in paths}
    seen = set()
    for name, path in _pairs(labels, "label", "PATH"):
        p = given.get(Path(path).resolve())
        if p is None:
            raise ValueError(f"label: {path} is not one of the given paths; expected one of "
                             f"{', '.join(map(str, paths))}")
        mine = [r for r in runs if r["path"] == p]
        if len(mine) != 1:
            raise ValueError(f"label: {path} holds {len(mine)} runs; give the folder or log of one run")
        if name in seen:
            raise ValueError(f"label: {name!r} is given twice")
        seen.add(name)
        mine[0]["label"] = name
    for name, algo in _pairs(algos, "algo", "ALGO", at_last=True):  # a folder's name may hold '=', no algorithm does
        if algo not in ALGORITHMS:
            raise ValueError(f"algo: unknown algorithm {algo!r}{did_you_mean(algo, ALGORITHMS)}; expected one of "
                             f"{', '.join(ALGORITHMS)}")
        p = given.get(Path(name).resolve())
        mine = [r for r in runs if r["label"] == name or r["path"] == p]
        if not mine:
            raise ValueError(f"algo: {name!r} names no run; expected a run's label or a given path: "
                             f"{', '.join([*sorted({r['label'] for r in runs}), *map(str, paths)])}")
        for r in mine:
            r["algo"] = algo


#: run.json (written by configs/recipes' launchers): each field's type and what it is
RUN_JSON = {"recipe": (str, "a recipe name"), "run": (str, "a run name"), "framework": (str, "a framework name"),
            "algorithm": (str, "an algorithm name"), "params": (dict, "an object of settings"),
            "steps": (int, "an integer")}


def _run_json(path: Path) -> dict:
    """A run folder's run.json; a ValueError naming the file and the field when one has the wrong type."""
    meta = read_json(path)
    for field, (kind, what) in RUN_JSON.items():
        value = meta.get(field)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ValueError(f"{path}: {field}: expected {what}, got {show(value)}")
    return meta


def _unique_labels(runs: list[dict]) -> None:
    seen: dict[str, int] = {}
    for r in runs:
        seen[r["label"]] = seen.get(r["label"], 0) + 1
    for r in runs:
        if seen[r["label"]] > 1:
            r["label"] = f"{r['label']} ({r.get('recipe') or r['framework']})"


# ---- the report ------------------------------------------------------------------------------------------------
def _value(groups: Groups, label: str, key: str, part: str) -> float:
    """``key`` over the steps that log it: the mean of the first or last 20% of them, their mean, or the last."""
    c = groups.curve(label, key)[0]
    c = c[np.isfinite(c)]
    if not c.size:
        return float("nan")
    n = max(1, c.size // 5)
    return float({"first": c[:n].mean(), "last": c[-n:].mean(), "final": c[-1], "mean": c.mean()}[part])


def _cell(v: float, key: str) -> str:
    """A measured value as the tables show it: a percentage, three significant digits, or a whole number with
    thousands separated (1,234 tokens, not 1.23e+03); absent when not logged."""
    if v != v:
        return "absent"
    return f"{v:,.0f}" if abs(v) >= 1000 and key not in PERCENT else fmt(v, pct=key in PERCENT)


def logged_as(metric: str) -> str:
    """Which logged metrics give cliplab's ``metric``, in words."""
    names = [f"verl `{k}`" for k, v in VERL.items() if v == metric]
    names += [f"verl `val-core/<data>/{var}/mean@N`" for var, v in VAL_METRICS.items() if v == metric]
    names += [f"TRL `{k}`" for k, v in TRL.items() if v == metric]
    return (f"{metric} ({' or '.join(names)})" if names
            else f"{metric} (a cliplab metric that neither verl nor TRL logs)")


def claim_rows(groups: Groups, records: list | None = None) -> list[str]:
    """One row per claim: measured on the runs of the algorithms it compares, or what the logs lack to measure it,
    named by the logged metrics that would give it; each claim's records appended to ``records``."""
    rows = []
    records = [] if records is None else records
    for claim, fn in CLAIMS:
        text, keys, algos = claim.text, *NEEDS[fn.__name__]
        used = [lbl for lbl in groups.labels() if groups.runs[lbl][0]["algo"] in algos]
        lacking = sorted({k for lbl in used for k in keys if not np.isfinite(groups.curve(lbl, k)).any()})
        if used and lacking:
            no = "; no ".join(map(logged_as, lacking))
            records.append(replace(finding("", Verdict(Kind.NOT_MEASURED, note="absent"),
                                           f"the logs of {', '.join(used)} have no {no}"), claim=claim))
            rows.append(f"| {text} | absent | **absent** | the logs of {md(', '.join(used))} have no {no} |")
            continue
        for rec in fn(groups):  # one record per regime
            records.append(replace(rec, claim=claim))
            regime, meas = rec.regime, rec.discovery.measured or "n/a"
            why = "; ".join(x for x in (rec.reason, rec.attribution) if x)
            if rec.kind is Kind.NOT_MEASURED:  # the claims' command is a simulator's: say what the logs would need
                why = (f"{rec.reason}, each logging " + "; ".join(map(logged_as, keys))
                       + " (a run's algorithm: its run.json, `--algo NAME=ALGO`, or a folder named like one)")
            rows.append(f"| {text} | {md(f'{regime}: {meas}' if regime else meas)} | **{rec.verdict_text()}** | "
                        f"{why} |")
    return rows


def _curve(run: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the steps of ``run`` that log ``key``."""
    pts = [(rec["step"], rec[key]) for rec in run["records"] if rec.get(key) is not None]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def plot_runs(groups: Groups, path: Path) -> list[str]:
    """The curves of PANELS that some run logs, one panel each, against the logged step: a metric logged at fewer
    than half of a run's steps (validation) as markers joined by lines, others as a 3-step moving average.
    Returns the panels drawn (none: no figure)."""
    require("reports", "plotting")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from matplotlib.ticker import MaxNLocator
    labels = groups.labels()
    panels = [k for k in PANELS if any(_curve(groups.runs[lbl][0], k)[0].size for lbl in labels)]
    if not panels:
        return []
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, key in zip(axes.flat, panels):
        for i, label in enumerate(labels):
            run = groups.runs[label][0]
            x, y = _curve(run, key)
            if not x.size:
                continue
            style = {"color": colors(i % 10), "label": label.replace("$", r"\$")}
            if x.size < 0.5 * len(run["records"]):
                ax.plot(x, y, marker="o", ms=4, lw=0.8, **style)
            else:
                ax.plot(x, pd.Series(y).rolling(3, min_periods=1).mean(), lw=1.3, **style)
        ax.set_title(key + (" (validation)" if key in VAL_METRICS.values() else ""), fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.remove()
    handles, names = axes.flat[0].get_legend_handles_labels()
    for ax in list(axes.flat)[1:len(panels)]:  # every run once, whichever panel draws it
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(names) - 1) // 4), 1, 1))
    with naming(path):  # a full disk names the plot's file
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return panels


def write_report(paths, out_md=None, labels=(), algos=()) -> Path:
    """Write the comparison report of the runs in ``paths`` (logs, cluster run folders, cliplab run folders), named
    by ``labels`` (NAME=PATH) and ``algos`` (NAME=ALGO)."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    first = paths[0]
    out_md = output_file(out_md or (first if first.is_dir() else first.parent) / "report.md", inputs=paths)
    runs, notes = load(paths, labels, algos)
    groups = Groups(runs)
    png = out_md.with_name(safe_name(out_md.stem) + "_curves.png")
    panels = plot_runs(groups, png)
    options = [x for entry in labels for x in ("--label", entry)] + [x for entry in algos for x in ("--algo", entry)]
    command = shell_line("cliplab", "report", *map(repo_path, paths), *options, "--out", repo_path(out_md))
    lines = ["# cliplab cluster report", "", "Produced by:", "", "```",
             command, "```", "",
             "## Runs", "", "| label | framework | algorithm | params | steps | log | validation | note |",
             "|---|---|---|---|---|---|---|---|"]
    for label in groups.labels():
        r = groups.runs[label][0]
        cells = (label, r["framework"], r["algo"] or "unknown (--algo)",
                 ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-", len(r["records"]),
                 r.get("log", r["dir"]), ", ".join(r.get("validation") or []) or "-", r.get("note") or "-")
        lines.append("| " + " | ".join(md(c) for c in cells) + " |")
    lines += ["", "## Comparison", "",
              "Measured from each framework's own metric names mapped onto cliplab's (verl: "
              + ", ".join(f"`{k}` -> {v}" for k, v in VERL.items()) + ", `val-core/<data>/acc/mean@N` -> accuracy, "
              "`val-core/<data>/reward/mean@N` -> val_reward (val-aux when that is where the log has it; the "
              "validation column names the key read); TRL: " + ", ".join(f"`{k}` -> {v}" for k, v in TRL.items())
              + ", in TensorBoard under `train/`). Over the steps that log a metric: first/last: the mean of the "
              "first/last 20% of them; final: the last value; mean: all. A metric the log does not have is "
              "**absent**, never estimated. published: the paper's number for this recipe run.", "",
              "| label | " + " | ".join(f"{k} ({p})" for k, p in COLUMNS) + " | published |",
              "|---" * (len(COLUMNS) + 2) + "|"]
    for label in groups.labels():
        r = groups.runs[label][0]
        cells = [_cell(_value(groups, label, k, p), k) for k, p in COLUMNS]
        pub = published(r.get("recipe"), r.get("run"))
        lines.append(f"| {md(label)} | " + " | ".join(cells) + " | "
                     + md("; ".join(f"{k} {_cell(v, k)} ({src})" for k, (v, src) in pub.items()) or "-") + " |")
    lines += ["", *card_lines(run_set_card(runs))]
    records: list = []
    lines += ["## Claims", "", f"The records, with their details: {JSON_NAME} and {DETAILS_NAME} beside this report.",
              "", "| claim | measured | verdict | why |", "|---|---|---|---|", *claim_rows(groups, records)]
    if notes:
        lines += ["", "## Cut short", "", *[f"- {md(n)}; reported up to its last complete step" for n in notes]]
    if panels:
        lines += ["", "## Curves", "", "Training metrics as a 3-step moving average; validation points as markers.",
                  "", f"![curves]({png.name})", ""]
    else:
        lines += ["", "## Curves", "", f"No run logs any of {', '.join(PANELS)}: nothing to draw.", ""]
    write_claims(out_md.parent, [RunSet("", tuple(records))], "cliplab cluster report", f"`{command}`")
    write_text(out_md, "\n".join(lines) + "\n")
    return out_md
