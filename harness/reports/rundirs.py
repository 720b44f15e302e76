"""Run folders as the report reads them: the simulator's sweeps and the real-model harness's runs, grouped by label.

Reads ``DIR/runs/<run>/``, ``DIR/<run>/`` or a run folder itself, each with ``config.json`` and ``metrics.jsonl``.
Also what every report writer shares: the output file's checks and the escaping of user-controlled text (folder
names, labels, settings) for markdown tables, headings and code fences.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import warnings
from pathlib import Path

import numpy as np

from sim.config import Seeds
from spec.records import FOLDER_KINDS, folder_kind, open_lock, read_json, read_jsonl, writable_folder
from spec.schema import show

#: Metric names of the real-model harness (gpu/train.py) mapped to the simulator's.
ALIASES = {"tcr": "clip_frac", "len_mean": "resp_len", "reward_mean": "reward", "accuracy_trained": "accuracy",
           "truncated_frac": "truncated", "ds_generated_per_trained": "gen_per_trained"}


def _run_folders(root: Path) -> list[Path]:
    """A run folder itself, DIR/runs/<run>/, or DIR/<run>/ (one or two levels down) holding metrics.jsonl."""
    if (root / "metrics.jsonl").exists():
        return [root]
    base = root / "runs" if (root / "runs").is_dir() else root
    found = sorted(p.parent for p in list(base.glob("*/metrics.jsonl")) + list(base.glob("*/*/metrics.jsonl")))
    return found


def _identity(cfg: dict, path: Path) -> tuple[str, dict, object]:
    """(algo, grid params, seed) of a simulator config or a real-model config (algo = {name, hp}); a ValueError
    naming the file and the field when one has the wrong type."""
    algo, params = cfg.get("algo"), cfg.get("params")
    if isinstance(algo, dict):
        algo, params = algo.get("name"), algo.get("hp")
        field = "algo.name"
    else:
        field = "algo"
    expected = {field: (algo, (str,), "an algorithm name"), "params": (params, (dict,), "an object of settings"),
                "seed": (cfg.get("seed"), (int,), "an integer"), "label": (cfg.get("label"), (str,), "a string"),
                "env": (cfg.get("env"), (str,), "an environment name"),
                "settings": (cfg.get("settings"), (dict,), "an object of settings")}
    for name, (value, types, what) in expected.items():
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise ValueError(f"{path}: {name}: expected {what}, got {show(value)}")
    return algo, dict(params or {}), cfg.get("seed")


def _numbers(records: list[dict], path: Path) -> list[dict]:
    """``records`` whose values are all numbers or null; a ValueError naming the file, the record and the field
    otherwise (a report would read a string as no value, or fail)."""
    for i, rec in enumerate(records):
        for key, value in rec.items():
            if value is not None and not isinstance(value, (int, float)):
                raise ValueError(f"{path}: record {i + 1} (step {rec.get('step', '?')}), {key}: expected a number "
                                 f"or null, got {show(value)}")
    return records


def check_dirs(dirs) -> list[Path]:
    """``dirs`` as paths, each an existing folder; a ValueError naming the first that is not."""
    dirs = [Path(d) for d in dirs]
    for d in dirs:
        if not d.is_dir():
            raise ValueError(f"dirs: {d} is {'a file' if d.exists() else 'missing'}; expected a runs folder")
    return dirs


#: The file names of cluster logs (verl's file logger and console log, TRL's trainer state) that the cluster
#: report reads.
LOG_NAMES = ("verl.jsonl", "console.log", "trainer_state.json")


def cliplab_folders(dirs) -> bool:
    """Whether each of ``dirs`` is the folder of a cliplab sweep or training run (its lock names it, see
    ``spec.records.FOLDER_KINDS``), so that the report reads its runs; a file under it named as another tool's
    log (terminal output saved as console.log) is not read as a cluster run, and is noted as left out."""
    dirs = [Path(d) for d in dirs]
    kinds = [folder_kind(d) if d.is_dir() else None for d in dirs]
    if not dirs or not all(k in ("sweep.lock", "train.lock") for k in kinds):
        return False
    for d, kind in zip(dirs, kinds):
        for log in sorted(p for name in LOG_NAMES for p in d.rglob(name)):
            warnings.warn(f"{log}: not a run of {FOLDER_KINDS[kind]}; left out of the report", stacklevel=2)
    return True


def output_file(path, name: str = "out", inputs=()) -> Path:
    """A markdown file to write (its folder created): a ValueError naming ``name`` when it is a folder, does not end
    in .md (so that no run file, log or plot is overwritten), is one of the ``inputs`` given to read, or its folder
    cannot be made or written. A folder that is none of the ``inputs`` (nor holds one of the files) becomes a report
    folder (``report.lock``, see ``spec.records.FOLDER_KINDS``): a sweep's or a training run's folder is refused
    there, naming its kind, unless the report is of that folder."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name}: {path} is a folder; expected a markdown file path")
    if path.suffix.lower() not in (".md", ".markdown"):
        raise ValueError(f"{name}: {path} is not a .md file; expected a markdown file path (a report never replaces "
                         f"another file)")
    if any(path.resolve() == Path(p).resolve() for p in inputs):
        raise ValueError(f"{name}: {path} is one of the files to report on; expected a new markdown file path")
    folder = writable_folder(path.parent, name).resolve()
    given = [Path(p).resolve() for p in inputs]
    if not any(folder == p or (folder == p.parent and p.is_file()) for p in given):
        os.close(open_lock(folder / "report.lock", name, "the report folder's lock"))
    return path


def load_runs(dirs) -> list[dict]:
    """Every run with config.json and metrics.jsonl found under ``dirs``. A run with no metrics yet is left out
    with a warning; so is a half-written last metrics line (see ``spec.records.read_jsonl``), and a run folder
    that holds the same run as one read before (a copy or a symbolic link: the same config and metrics). Runs of
    one label that differ are never pooled as more seeds: within one of ``dirs``, two of one seed are a ValueError
    naming both; across ``dirs``, a label whose folders share a seed or differ in settings is kept apart, one label
    a folder (see ``_apart``)."""
    runs, seen, setups = [], {}, []
    for root in check_dirs(dirs):
        for folder in _run_folders(root):
            cfg_path = folder / "config.json"
            if not cfg_path.exists():
                continue
            cfg = read_json(cfg_path)
            algo, params, seed = _identity(cfg, cfg_path)
            if algo is None:
                continue
            raw = _numbers(read_jsonl(folder / "metrics.jsonl"), folder / "metrics.jsonl")
            if not raw:
                warnings.warn(f"{folder / 'metrics.jsonl'}: no metrics; this run is left out of the report",
                              stacklevel=2)
                continue
            files = cfg_path.read_bytes() + b"\0" + (folder / "metrics.jsonl").read_bytes()
            identity = hashlib.sha256(files).hexdigest()
            if identity in seen:
                warnings.warn(f"{folder}: the same run as {seen[identity]} (same config.json and metrics.jsonl); "
                              "counted once", stacklevel=2)
                continue
            seen[identity] = folder
            records = [{**{ALIASES[k]: v for k, v in rec.items() if k in ALIASES}, **rec} for rec in raw]
            label = cfg.get("label") or (algo + ("[" + ",".join(f"{k}={params[k]}" for k in sorted(params)) + "]"
                                                 if params else ""))
            runs.append({"dir": str(root), "label": label, "algo": algo, "params": params, "seed": seed,
                         "records": records, "env": cfg.get("env"), "settings": cfg.get("settings"),
                         "set": cfg.get("set")})
            setups.append((folder, _setup(cfg)))
    return _apart(runs, setups)


def _setup(cfg: dict) -> str:
    """What a run was, but for its seed: a simulator run's env, steps and settings (its seed's environment draw left
    out); a cliplab train run's config but for its seed and its run section's folder and display (its steps
    kept)."""
    if isinstance(cfg.get("algo"), dict):
        rest = {k: v for k, v in cfg.items() if k not in ("seed", "run")}
        return json.dumps({**rest, "run": {"steps": (cfg.get("run") or {}).get("steps")}}, sort_keys=True)
    settings = {k: v for k, v in (cfg.get("settings") or {}).items() if k != "env_seed"}
    return json.dumps([cfg.get("env"), cfg.get("steps"), settings], sort_keys=True)


def _config_name(folder: Path) -> str:
    """The name of a run's config: its folder's, or its parent's in the <config>/seed<k>/ layout."""
    folder = Path(folder)
    return folder.parent.name if folder.name.startswith("seed") and folder.name[4:].isdigit() else folder.name


def _one_setting_a_label(runs: list[dict], setups: list[tuple[Path, str]]) -> None:
    """Within one folder of runs, a label whose cliplab train runs hold different settings (configs alike in
    their algorithm's hyper-parameters, unlike in their model, say) becomes one label per setting, named by each
    run's config (``label (config)``), with one warning: their seeds are not one setting's. (A simulator sweep's
    folder holds one setting a label: a run with other settings there is an error, ``_apart``.)"""
    groups: dict[tuple, dict[str, list[int]]] = {}
    for i, r in enumerate(runs):
        if r["env"] is not None:  # a simulator run
            continue
        groups.setdefault((r["dir"], r["label"]), {}).setdefault(setups[i][1], []).append(i)
    for (folder, label), kinds in groups.items():
        if len(kinds) < 2:
            continue
        names = {k: ", ".join(sorted({_config_name(setups[i][0]) for i in idx})) for k, idx in kinds.items()}
        warnings.warn(f"{label}: runs with other settings in {folder} ({'; '.join(names.values())}); kept apart, "
                      "one label a setting", stacklevel=4)
        for k, idx in kinds.items():
            for i in idx:
                runs[i]["label"] = f"{label} ({names[k]})"


def _apart(runs: list[dict], setups: list[tuple[Path, str]]) -> list[dict]:
    """Each label's runs in an environment pooled as its seeds, unless they differ: a seed twice within one folder
    of runs is a ValueError naming both run folders; a label found in several folders that share a seed or hold
    other settings (steps, say) is kept apart as ``label (folder)``, with one warning. (The reports never pool
    environments: a label in two is named by each.) Within one folder, runs of a label with other settings are
    kept apart first (``_one_setting_a_label``)."""
    _one_setting_a_label(runs, setups)
    by_label: dict[tuple, list[int]] = {}
    for i, r in enumerate(runs):
        by_label.setdefault((r["env"], r["label"]), []).append(i)
    for (_, label), idx in by_label.items():
        first: dict = {}
        for i in idx:
            r = runs[i]
            if r["seed"] is not None and (r["dir"], r["seed"]) in first:
                raise ValueError(f"{setups[i][0]}: {label} seed {r['seed']} again, with other config or metrics "
                                 f"than {setups[first[r['dir'], r['seed']]][0]}; expected one run a seed and label "
                                 "in a folder of runs")
            first[r["dir"], r["seed"]] = i
        folders = sorted({runs[i]["dir"] for i in idx})
        if len(folders) < 2:
            continue
        seeds = [runs[i]["seed"] for i in idx if runs[i]["seed"] is not None]
        shared = sorted({s for s in seeds if seeds.count(s) > 1})
        kinds = {setups[i][1] for i in idx}
        if not shared and len(kinds) == 1:
            continue  # more seeds of the same runs
        why = (f"seeds {Seeds(tuple(shared), ()).text()} in more than one" if shared else "other settings in each")
        warnings.warn(f"{label}: {why} of {', '.join(folders)}; kept apart, one label a folder", stacklevel=3)
        for i in idx:
            runs[i]["label"] = f"{label} ({runs[i]['dir']})"
    return runs


class Groups:
    """Runs grouped by label, compared over the steps its seeds all have (with a warning when their lengths
    differ); ``curve`` gives one metric as [seeds, steps] (NaN where missing)."""

    def __init__(self, runs: list[dict]):
        self.runs: dict[str, list[dict]] = {}
        for r in runs:
            self.runs.setdefault(r["label"], []).append(r)
        for label, rs in self.runs.items():
            lengths = sorted(len(r["records"]) for r in rs)
            if lengths[0] != lengths[-1]:
                warnings.warn(f"{label}: its seeds have {lengths[0]} to {lengths[-1]} steps; they are compared over "
                              f"the first {lengths[0]}", stacklevel=2)

    def labels(self):
        """Labels in registry order of their algorithm, then by name."""
        from spec.registry import ALGORITHMS
        order = {a: i for i, a in enumerate(ALGORITHMS)}
        return sorted(self.runs, key=lambda lbl: (order.get(self.runs[lbl][0]["algo"], len(order)), lbl))

    def curve(self, label: str, key: str) -> np.ndarray:
        """``key`` of ``label``'s runs as [seed (the run's place in the label), step], NaN where a record lacks it
        or holds null."""
        rs = self.runs[label]
        steps = min(len(r["records"]) for r in rs)
        return np.array([[rec.get(key) for rec in r["records"][:steps]] for r in rs], dtype=float)

    def per_seed(self, label: str, key: str, part: str = "all") -> np.ndarray:
        """Per-seed mean of ``key`` over all steps, the first or the last 10% of steps, or its last value."""
        c = self.curve(label, key)
        n = max(1, c.shape[1] // 10)
        sl = {"all": slice(None), "first": slice(0, n), "last": slice(-n, None), "final": slice(-1, None)}[part]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-missing metric is NaN, reported as n/a
            return np.nanmean(c[:, sl], axis=1)

    def find(self, algo: str, **params) -> str | None:
        """The label of ``algo`` whose grid values include ``params``; with no params, its plain label (or its
        only label)."""
        cands = [lbl for lbl in self.labels() if self.runs[lbl][0]["algo"] == algo
                 and all(same(self.runs[lbl][0]["params"].get(k), v) for k, v in params.items())]
        if params or not cands:
            return cands[0] if cands else None
        plain = [lbl for lbl in cands if not self.runs[lbl][0]["params"]]
        return plain[0] if plain else (cands[0] if len(cands) == 1 else None)


def same(a, b):
    """Equal settings: numbers to 1e-12, anything else (None, strings) by equality."""
    if a is None or b is None:
        return a is b
    try:
        return abs(float(a) - float(b)) < 1e-12
    except (TypeError, ValueError):
        return a == b


def mean_se(x: np.ndarray) -> tuple[float, float]:
    """Mean and standard error over seeds."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if not x.size:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0


def md(text) -> str:
    """``text`` safe inside markdown and a table cell: markup characters (| ` * [ ] < > & backslash) escaped,
    line breaks as spaces."""
    out = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`|*[]":
        out = out.replace(ch, "\\" + ch)
    return " ".join(out.splitlines())


def shell_line(*words) -> str:
    """A shell command of ``words`` on one line, each quoted as a POSIX shell reads it back (a word with a line
    break, another unprintable character or a markup character of ``MARKUP`` as bash's ``$'...'``), so that it
    stays one line inside a code fence and holds no HTML or backtick for a renderer to act on."""
    return " ".join(_shell_word(str(w)) for w in words)


#: Characters a markdown renderer may act on even inside a code fence's line (HTML, a backtick closing the fence).
MARKUP = "<>&`"


def _shell_word(word: str) -> str:
    """shlex's quoting, or bash's ``$'...'`` for a word with an unprintable or a ``MARKUP`` character."""
    if word.isprintable() and not set(word) & set(MARKUP):
        return shlex.quote(word)
    return "$'" + "".join(_shell_char(c) for c in word) + "'"


def _shell_char(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if c.isprintable() and c not in MARKUP:
        return c
    return f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"


def fmt_interval(iv) -> str:
    """A ``stats.Interval`` as mean ± its half-width; under ``stats.MIN_SEEDS`` values the half-width reads
    "n/a (too few seeds)"."""
    from harness.reports.stats import MIN_SEEDS
    if iv.n < MIN_SEEDS and iv.mean == iv.mean:
        return fmt(iv.mean) + " ± n/a (too few seeds)"
    return fmt(iv.mean, iv.half)


def fmt(m, se=None, pct=False):
    if m != m:
        return "n/a"
    f = (lambda v: f"{100 * v:.3g}%") if pct else (lambda v: f"{v:.3g}")
    return f(m) if se is None else f"{f(m)} ± {f(se)}"
