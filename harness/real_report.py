"""Markdown report with plots for real-model runs (folders with config.json and metrics.jsonl from gpu/train.py),
reusing the simulator report's run loading and plotting."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from spec.records import read_json

from .report import plot_curves
from .rundirs import Groups, check_dirs, fmt, load_runs, md, output_file

PANELS = ("accuracy", "reward", "entropy", "clip_frac", "rur", "kl_ref", "resp_len", "gap_mean_abs")
COLUMNS = (("accuracy", "first"), ("accuracy", "last"), ("reward", "first"), ("reward", "last"),
           ("entropy", "final"), ("tcr", "all"), ("rur", "all"), ("len_mean", "all"), ("gap_mean_abs", "all"),
           ("ds_generated_per_trained", "all"), ("step_time_s", "all"), ("tokens_per_s", "all"),
           ("peak_mem_mb", "final"))


def _setup(run: dict) -> str:
    """One line on what the run was, from its config.json (markdown-escaped)."""
    path = Path(run["dir"]) / "config.json"
    cfg = read_json(path) if path.exists() else {}
    if not cfg:
        return ""
    try:
        return md(_describe(cfg))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a config written by cliplab train (at {exc})") from None


def _describe(cfg: dict) -> str:
    """Model, data, rollout, optimiser and loss settings of a real-model config, in one line."""
    m, d, r, t, a = cfg["model"], cfg["data"], cfg["rollout"], cfg["train"], cfg["algo"]
    res = cfg.get("resolved", {"reward": a["reward"], "advantage": a["advantage"], "loss": a["hp"]})
    loss = ", ".join(f"{k}={v}" for k, v in res["loss"].items() if v is not None)
    extras = [k for k in ("dynamic_sampling", "overlong_filter") if a.get(k)]
    if a.get("overlong_max_len"):
        extras.append(f"soft overlong {a['overlong_max_len']}/{a['overlong_cache_len']}")
    return (f"model {m['name']} (train_top_layers={m.get('train_top_layers')}, lora={bool(m.get('lora'))}); "
            f"data {d['source']} (digits={d['digits']}, terms={d['terms']}, ops={d['ops']!r}); engine {r['engine']}, "
            f"{r['prompts_per_step']} prompts x G={r['group_size']}, max_new_tokens={r['max_new_tokens']}, "
            f"T={r['temperature']}; lr {t['lr']}, epochs {t['epochs']}; steps {cfg['run']['steps']}, "
            f"threads {cfg['run'].get('threads')}; reward {res['reward']}, advantage {res['advantage']}; "
            f"loss: {loss}" + (f"; {', '.join(extras)}" if extras else ""))


def summary_rows(groups: Groups) -> list[str]:
    """One table row per run label: first/last 20% of steps for reward and accuracy, means for the rest."""
    head = [f"{k} ({p})" for k, p in COLUMNS]
    lines = ["| label | steps | " + " | ".join(head) + " |", "|---" * (len(head) + 2) + "|"]
    for label in groups.labels():
        cells = []
        steps = groups.curve(label, "step").shape[1]
        for key, part in COLUMNS:
            c = groups.curve(label, key)
            if not np.isfinite(c).any():
                cells.append("n/a")
                continue
            n = max(1, c.shape[1] // 5)
            sl = {"all": slice(None), "first": slice(0, n), "last": slice(-n, None), "final": slice(-1, None)}[part]
            cells.append(fmt(float(np.nanmean(c[:, sl]))))
        lines.append(f"| {md(label)} | {steps} | " + " | ".join(cells) + " |")
    return lines


def write_report(dirs, out_md, title: str = "cliplab real-model report", notes: str = "") -> Path:
    """Write ``out_md`` and a PNG of the curves beside it for the runs under ``dirs``; returns the markdown path."""
    dirs = [Path(d) for d in ([dirs] if isinstance(dirs, (str, Path)) else dirs)]
    runs = []
    for folder in _folders(dirs):
        for r in load_runs([folder]):
            r["label"] = folder.name  # one label per run folder
            runs.append(r)
    if not runs:
        raise ValueError(f"dirs: no runs with config.json and metrics.jsonl under {', '.join(map(str, dirs))}")
    groups = Groups(runs)
    out_md = output_file(out_md)
    png = out_md.with_name(out_md.stem + "_curves.png")
    plot_curves(groups, groups.labels(), png, panels=PANELS, smooth=3)
    lines = [f"# {title}", "", notes, "", "## Runs", ""]
    for label in groups.labels():
        run = groups.runs[label][0]
        lines.append(f"- **{md(label)}**: {_setup(run)}")
    lines += ["", "## Summary", "",
              "first/last: mean over the first/last 20% of steps; final: last step; all: mean over steps. "
              "accuracy and reward are over every sampled response of a step (before dynamic-sampling filtering); "
              "tcr is the clipped-token fraction; rur the share of responses with a non-zero advantage; "
              "gap_mean_abs the mean |log pi_engine - log pi_trainer| on sampled tokens.", ""]
    lines += summary_rows(groups)
    lines += ["", "## Curves (3-step moving average)", "", f"![curves]({png.name})", ""]
    out_md.write_text("\n".join(lines) + "\n")
    return out_md


def _folders(dirs) -> list[Path]:
    """Run folders: each dir itself when it holds metrics.jsonl, else every folder below it that does."""
    out = []
    for d in check_dirs(dirs):
        out += [d] if (d / "metrics.jsonl").exists() else sorted(p.parent for p in d.glob("**/metrics.jsonl"))
    return out
