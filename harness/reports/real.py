"""Markdown report with plots for real-model runs (folders with config.json and metrics.jsonl from gpu/train.py),
reusing the simulator report's run loading and plotting."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from spec.records import read_json, read_text, safe_name, write_text

from harness.reports.sim import plot_lines
from harness.reports.rundirs import Groups, check_dirs, fmt, load_runs, md, output_file

PANELS = ("accuracy", "reward", "entropy", "clip_frac", "rur", "kl_ref", "resp_len", "gap_mean_abs")
COLUMNS = (("accuracy", "first"), ("accuracy", "last"), ("reward", "first"), ("reward", "last"),
           ("entropy", "final"), ("tcr", "all"), ("rur", "all"), ("len_mean", "all"), ("gap_mean_abs", "all"),
           ("gen_per_trained", "all"), ("step_time_s", "all"), ("tokens_per_s", "all"),
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


def run_lines(dirs, png: Path, notes: str = "", level: str = "##") -> list[str]:
    """Markdown lines (runs, summary table, curves at ``png``) for the real-model runs under ``dirs``, one label per
    run folder; section headings at ``level``."""
    dirs = [Path(d) for d in ([dirs] if isinstance(dirs, (str, Path)) else dirs)]
    runs = []
    for folder in _folders(dirs):
        for r in load_runs([folder]):
            r["label"] = folder.name  # one label per run folder
            runs.append(r)
    if not runs:
        raise ValueError(f"dirs: no runs with config.json and metrics.jsonl under {', '.join(map(str, dirs))}")
    groups = Groups(runs)
    figures = plot_lines(groups, groups.labels(), png, "real-model runs", panels=PANELS, smooth=3)
    lines = ([notes, ""] if notes else []) + [f"{level} Runs", ""]
    for label in groups.labels():
        run = groups.runs[label][0]
        lines.append(f"- **{md(label)}**: {_setup(run)}")
    lines += ["", f"{level} Summary", "",
              "first/last: mean over the first/last 20% of steps; final: last step; all: mean over steps. "
              "accuracy and reward are over every sampled response of a step (before dynamic-sampling filtering); "
              "tcr is the clipped-token fraction; rur the share of responses with a non-zero advantage; "
              "gap_mean_abs the mean |log pi_engine - log pi_trainer| on sampled tokens.", ""]
    lines += summary_rows(groups)
    lines += ["", f"{level} Curves (3-step moving average)", "", *figures, ""]
    return lines


def write_report(dirs, out_md, title: str = "cliplab real-model report", notes: str = "") -> Path:
    """Write ``out_md`` and a PNG of the curves beside it for the runs under ``dirs``; returns the markdown path."""
    dirs = check_dirs([dirs] if isinstance(dirs, (str, Path)) else dirs)
    out_md = output_file(out_md, inputs=dirs)
    lines = run_lines(dirs, out_md.with_name(safe_name(out_md.stem) + "_curves.png"), notes)
    write_text(out_md, "\n".join([f"# {md(title)}", ""] + lines) + "\n")
    return out_md


KEEP = "<!-- Below this line: kept as written (python -m harness.reports.real regenerates only what is above). -->"
EVIDENCE_PANELS = ("accuracy", "entropy", "clip_frac", "rur", "ratio_dev_median", "len_wrong", "cov_logp_adv",
                   "gen_per_trained")


def write_readme(readme="reports/real/README.md", evidence="reports/real/evidence", runs="reports/real/runs",
                 sim="reports/sim") -> Path:
    """Regenerate the real-model README from the committed run folders: the evidence runs (mean ± CI, paired
    differences, claims table against the simulator's), then the earlier single-seed runs (with their notes,
    ``runs``/NOTES.md); the text after the KEEP marker of the existing README is kept."""
    from harness.reports.claim_render import write_claims
    from harness.reports.evidence import Evidence, real_records, section
    readme = output_file(readme, "readme")
    old = read_text(readme) if readme.exists() else ""
    tail = old.split(KEEP, 1)[1] if KEEP in old else "\n"
    ev = Evidence(evidence)
    records = real_records(ev)
    ev_runs = [r for r in load_runs([evidence])]
    groups = Groups([{**r, "label": r["algo"]} for r in ev_runs])
    png = readme.with_name("evidence_curves.png")
    figures = plot_lines(groups, groups.labels(), png, "evidence runs", panels=EVIDENCE_PANELS, smooth=1)
    notes_path = Path(runs) / "NOTES.md"
    notes = read_text(notes_path).strip() if notes_path.exists() else ""
    lines = ["# Real-model evidence: SmolLM2-135M-Instruct on synthetic addition", "",
             "Regenerate this file from the committed run folders (reports/real/evidence, reports/real/runs) and the "
             "simulator's summaries (reports/sim): `python -m harness.reports.real`. The evidence runs themselves: "
             "`reports/real/run_evidence.sh` (resumable; configs/evidence).", "",
             "## Evidence runs: several updates per rollout batch, every algorithm over seeds", "",
             *section(ev, sim, records), "", "Curves (mean over seeds, min-max band):", "", *figures, "",
             "## Earlier runs: one update per batch, one seed (reports/real/runs)", "",
             *run_lines([runs], readme.with_name(safe_name(readme.stem) + "_curves.png"), notes, level="###"), KEEP]
    write_claims(readme.parent, [records], "Real-model evidence", "`python -m harness.reports.real`")
    write_text(readme, "\n".join(lines) + tail)
    return readme


def main(argv=None) -> None:
    import argparse
    p = argparse.ArgumentParser(description="Regenerate reports/real/README.md from the committed run folders.")
    p.add_argument("--readme", default="reports/real/README.md")
    p.add_argument("--evidence", default="reports/real/evidence")
    p.add_argument("--runs", default="reports/real/runs")
    p.add_argument("--sim", default="reports/sim")
    a = p.parse_args(argv)
    print(write_readme(a.readme, a.evidence, a.runs, a.sim))


def _folders(dirs) -> list[Path]:
    """Run folders: each dir itself when it holds metrics.jsonl, else every folder below it that does."""
    out = []
    for d in check_dirs(dirs):
        out += [d] if (d / "metrics.jsonl").exists() else sorted(p.parent for p in d.glob("**/metrics.jsonl"))
    return out


if __name__ == "__main__":
    main()
