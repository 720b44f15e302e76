"""``cliplab report`` on a cluster's own logs: verl's file logger (JSONL of ``{"step", "data"}``), verl's console
logger (``step:N - key:value - ...`` lines), TRL's ``trainer_state.json`` (``log_history``), beside cliplab's own run
folders. Their metric names are mapped onto cliplab's; a metric a log lacks stays absent. The report is the real-model
report's summary and curves, the papers' claims (a claim whose metrics a log lacks is marked absent), and the
published numbers of each recipe run beside the measured ones.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from spec.records import read_json, read_text, safe_name, write_text

from .claims import CLAIMS
from .published import published
from .rundirs import Groups, fmt, load_runs, md, output_file, shell_line

#: verl metric -> cliplab metric. ``actor/kl_loss`` is the KL to the reference under verl's kl_loss_type (k3 for
#: low_var_kl); ``actor/cliplab_rur`` is logged by cliplab's verl losses; ``critic/score/mean`` the task score.
VERL = {"actor/pg_clipfrac": "clip_frac", "actor/entropy": "entropy", "critic/score/mean": "reward",
        "response_length/mean": "resp_len", "actor/kl_loss": "kl_ref", "actor/cliplab_rur": "rur",
        "response_length/clip_ratio": "truncated"}
#: verl's validation accuracy (``acc`` from cliplab's recipe rewards), mean over N samples per prompt.
VERL_VAL = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean@(?P<n>\d+)$")
#: TRL GRPOTrainer log_history key -> cliplab metric (``cliplab/rur`` is logged by CliplabGRPOTrainer).
TRL = {"clip_ratio/region_mean": "clip_frac", "entropy": "entropy", "reward": "reward",
       "completions/mean_length": "resp_len", "kl": "kl_ref", "cliplab/rur": "rur",
       "frac_reward_zero_std": "zero_grad_frac", "completions/clipped_ratio": "truncated"}
LOG_NAMES = ("verl.jsonl", "console.log", "trainer_state.json")
FORMATS = "verl's file-logger JSONL, verl's console log (step:N - key:value lines) or TRL's trainer_state.json"

#: The metrics (and algorithms whose runs must have them) each claim of ``harness.claims`` reads, by its name.
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
COLUMNS = (("reward", "first"), ("reward", "last"), ("accuracy", "final"), ("clip_frac", "mean"),
           ("rur", "mean"), ("entropy", "final"), ("resp_len", "mean"), ("kl_ref", "final"),
           ("zero_grad_frac", "mean"))


def warn(path, text: str) -> None:
    print(f"warning: {path}: {text}", file=sys.stderr)


# ---- readers: each returns (records with cliplab names, note) ---------------------------------------------------
def _lines(path: Path, errors: str = "strict") -> tuple[list[str], bool]:
    """The file's lines and whether the last one is complete (ends with a newline)."""
    text = read_text(path, errors)
    return text.split("\n")[:-1], text.endswith("\n") or not text


def _mapped(step: int, data: dict, names: dict) -> dict:
    rec = {"step": step}
    for key, value in data.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if key in names:
                rec[names[key]] = float(value)
            elif names is VERL and VERL_VAL.match(key):
                rec["accuracy"] = float(value)
    return rec


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
        records.append(_mapped(obj["step"], obj["data"], VERL))
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
    for line in lines:
        m = _CONSOLE_STEP.search(line)
        if not m:
            continue  # other console output
        data = {}
        for part in m.group("rest").split(" - "):
            key, sep, value = part.partition(":")
            number = _console_value(value) if sep else None
            if number is not None:
                data[key.strip()] = number
        records.append(_mapped(int(m.group("step")), data, VERL))
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
            raise ValueError(f"{path}: log_history[{i}]: expected an object, got {entry!r}")
        if "step" in entry and "train_runtime" not in entry:
            _check_int(path, f"log_history[{i}].step", entry["step"], required=True)
            records.append(_mapped(entry["step"], entry, TRL))
    done, planned = state.get("global_step"), state.get("max_steps")
    note = f"cut short at step {done} of {planned}" if done and planned and done < planned else ""
    return _merge(records), note


def _check_int(path: Path, field: str, value, required: bool = False) -> None:
    """A ValueError naming the file and the field unless ``value`` is an integer (or, when not ``required``, absent)."""
    if (value is not None or required) and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{path}: {field}: expected an integer, got {value!r}")


def _merge(records: list[dict]) -> list[dict]:
    """One record per step (a framework may log a step's metrics in several calls), in step order."""
    by_step: dict[int, dict] = {}
    for rec in records:
        by_step.setdefault(rec["step"], {}).update(rec)
    return [by_step[s] for s in sorted(by_step)]


READERS = {"verl.jsonl": read_verl_jsonl, "console.log": read_verl_console, "trainer_state.json": read_trl_state}


def read_log(path) -> tuple[list[dict], str, str]:
    """(records, framework, note) of one log file, its format told by its name or, failing that, its content."""
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
    return records, "trl" if reader is read_trl_state else "verl", note


# ---- run folders -----------------------------------------------------------------------------------------------
def _log_of(folder: Path) -> Path | None:
    """The log a run folder holds: verl's JSONL before its console, TRL's final state before its last checkpoint."""
    for name in LOG_NAMES:
        if (folder / name).exists():  # a FIFO or a folder under a log's name is refused by its reader
            return folder / name
    ckpts = sorted((p for p in folder.glob("checkpoint-*/trainer_state.json") if p.parent.name[11:].isdigit()),
                   key=lambda p: int(p.parent.name[11:]))
    return ckpts[-1] if ckpts else None


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


def handles(paths) -> bool:
    """Whether ``paths`` hold a cluster log (so that ``cliplab report`` uses this module)."""
    for p in map(Path, paths):
        if not p.is_dir():  # a log file, or a path that does not exist (reported as such)
            return True
        if _run_folders(p) or _named_verl_logs(p, []):
            return True
    return False


def load(paths) -> tuple[list[dict], list[str]]:
    """Runs (as ``harness.rundirs`` runs: label, algo, params, seed, records) from log files, folders of cluster
    runs and cliplab run folders; and one note per log that was cut short."""
    runs, notes = [], []
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"{p}: no such file or folder")
        if p.is_file():
            logs = [p]
        else:
            folders = _run_folders(p)
            logs = _named_verl_logs(p, folders)
            for f in folders:
                log = _log_of(f)
                if log is None:
                    raise ValueError(f"{f / 'run.json'}: no log beside it (expected one of {', '.join(LOG_NAMES)})")
                logs.append(log)
            if any(p.glob("**/metrics.jsonl")):  # cliplab's own run folders (cliplab train / sim)
                runs += [{**r, "framework": "cliplab"} for r in load_runs([p])]
        for log in logs:
            run = _run_of(log)
            if run["note"]:
                warn(log, run["note"] + (f"; reported up to step {run['records'][-1]['step']}"
                                         if run["records"] else "; no complete step"))
                notes.append(f"{log}: {run['note']}")
            runs.append(run)
    if not runs:
        raise ValueError(f"paths: no logs under {', '.join(map(str, paths))}; expected {FORMATS}")
    _unique_labels(runs)
    return runs, notes


def _run_of(log: Path) -> dict:
    records, framework, note = read_log(log)
    folder = log.parent.parent if log.parent.name.startswith("checkpoint-") else log.parent
    meta = _run_json(folder / "run.json") if (folder / "run.json").exists() else {}
    if meta.get("steps") and records and not note and records[-1]["step"] < meta["steps"]:
        note = f"cut short at step {records[-1]['step']} of {meta['steps']}"
    name = meta.get("run") or (folder.name if log.name in LOG_NAMES else log.stem)
    from spec.registry import ALGORITHMS
    algo = meta.get("algorithm") or (name if name in ALGORITHMS else None)
    return {"dir": str(folder), "label": name, "algo": algo, "params": meta.get("params") or {}, "seed": 0,
            "records": records, "framework": framework, "log": str(log), "note": note,
            "recipe": meta.get("recipe"), "run": meta.get("run")}


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
            raise ValueError(f"{path}: {field}: expected {what}, got {value!r}")
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
    return "absent" if v != v else fmt(v, pct=key in ("clip_frac", "rur", "zero_grad_frac", "accuracy"))


def claim_rows(groups: Groups) -> list[str]:
    rows = []
    for text, fn in CLAIMS:
        keys, algos = NEEDS[fn.__name__]
        used = [lbl for lbl in groups.labels() if groups.runs[lbl][0]["algo"] in algos]
        lacking = sorted({k for lbl in used for k in keys if not np.isfinite(groups.curve(lbl, k)).any()})
        if used and lacking:
            rows.append(f"| {text} | absent | **absent** | the logs of {md(', '.join(used))} have no "
                        f"{', '.join(lacking)} |")
            continue
        out = fn(groups)  # one (measured, verdict, why), or one row per regime
        for regime, meas, verdict, why in (out if isinstance(out, list) else [("", *out)]):
            rows.append(f"| {text} | {md(f'{regime}: {meas}' if regime else meas)} | **{verdict}** | {why} |")
    return rows


def write_report(paths, out_md=None) -> Path:
    """Write the comparison report of the runs in ``paths`` (logs, cluster run folders, cliplab run folders)."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    first = paths[0]
    out_md = output_file(out_md or (first if first.is_dir() else first.parent) / "report.md", inputs=paths)
    runs, notes = load(paths)
    groups = Groups(runs)
    png = out_md.with_name(safe_name(out_md.stem) + "_curves.png")
    from .real_report import PANELS
    from .report import plot_curves
    plot_curves(groups, groups.labels(), png, panels=PANELS, smooth=3)
    lines = ["# cliplab cluster report", "", "Produced by:", "", "```", shell_line("cliplab", "report", *paths,
                                                                                "--out", out_md), "```", "",
             "## Runs", "", "| label | framework | algorithm | params | steps | log | note |",
             "|---|---|---|---|---|---|---|"]
    for label in groups.labels():
        r = groups.runs[label][0]
        cells = (label, r["framework"], r["algo"], ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-",
                 len(r["records"]), r.get("log", r["dir"]), r.get("note") or "-")
        lines.append("| " + " | ".join(md(c) for c in cells) + " |")
    lines += ["", "## Comparison", "",
              "Measured from each framework's own metric names mapped onto cliplab's (verl: "
              + ", ".join(f"`{k}` -> {v}" for k, v in VERL.items()) + ", `val-core/<source>/acc/mean@N` -> accuracy; "
              "TRL: " + ", ".join(f"`{k}` -> {v}" for k, v in TRL.items()) + "). Over the steps that log a metric: "
              "first/last: the mean of the first/last 20% of them; final: the last value; mean: all. A metric the "
              "log does not have is **absent**, never estimated. published: the paper's number for this recipe "
              "run.", "",
              "| label | " + " | ".join(f"{k} ({p})" for k, p in COLUMNS) + " | published |",
              "|---" * (len(COLUMNS) + 2) + "|"]
    for label in groups.labels():
        r = groups.runs[label][0]
        cells = [_cell(_value(groups, label, k, p), k) for k, p in COLUMNS]
        pub = published(r.get("recipe"), r.get("run"))
        lines.append(f"| {md(label)} | " + " | ".join(cells) + " | "
                     + md("; ".join(f"{k} {_cell(v, k)} ({src})" for k, (v, src) in pub.items()) or "-") + " |")
    lines += ["", "## Claims", "", "| claim | measured | verdict | why |", "|---|---|---|---|", *claim_rows(groups)]
    if notes:
        lines += ["", "## Cut short", "", *[f"- {md(n)}; reported up to its last complete step" for n in notes]]
    lines += ["", "## Curves (3-step moving average)", "", f"![curves]({png.name})", ""]
    write_text(out_md, "\n".join(lines) + "\n")
    return out_md
