"""``cliplab sim``: run a simulator sweep and print its summary."""
from __future__ import annotations

import json
from pathlib import Path

from sim.config import parse_sets
from spec.records import read_json, read_jsonl
from spec.registry import ALGORITHMS
from spec.schema import did_you_mean
from spec.tracking import WandbRun, wandb_ready

BACKENDS = ("process", "ray")
#: Accuracy is the one scale across algorithms (each paper's reward scheme differs: see the ranking).
SHOWN = ("accuracy", "accuracy_exact", "entropy_final", "clip_frac", "rur", "zero_grad_frac", "gen_per_trained")


def parse_algos(text: str) -> list[str]:
    """``"grpo,dapo"`` -> ["grpo", "dapo"]; ``"all"`` -> every registry algorithm."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    if names == ["all"]:
        return list(ALGORITHMS)
    if not names:
        raise ValueError("algos: expected a comma-separated list of algorithms (or 'all')")
    for name in names:
        if name not in ALGORITHMS:
            raise ValueError(f"algos: unknown algorithm {name!r}{did_you_mean(name, ALGORITHMS)}; expected among "
                             f"{', '.join(ALGORITHMS)} or 'all'")
    if len(set(names)) != len(names):
        raise ValueError(f"algos: an algorithm is listed twice in {text!r}")
    return names


def format_table(summary: dict) -> str:
    """A plain-text table of the summary, one row per label."""
    rows = [["label", *SHOWN]]
    for label, vals in summary["algorithms"].items():
        rows.append([label] + ["-" if vals[k] is None else f"{vals[k]:.4g}" for k in SHOWN])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def run_sweep_on(backend: str, env: str, algos: list[str], seeds: int, steps: int, grid: dict | None = None,
                 out: str = "runs/sim", workers: int = 2, progress: bool = True, address: str | None = None,
                 on_run=None, base: dict | None = None) -> dict:
    """The sweep on ``backend``: ``process`` (sim.sweep.run_sweep, local processes) or ``ray``; ``on_run(folder)``
    is called with each run's folder as it is done; ``base``: settings every run shares, in no label."""
    if backend == "process":
        if address is not None:
            raise ValueError("address: only the ray backend connects to a cluster")
        from sim.sweep import run_sweep
        return run_sweep(env, algos, seeds, steps, grid, out, workers=workers, progress=progress, on_run=on_run,
                         base=base)
    if backend == "ray":
        from harness.runs.ray import run_sweep_ray
        return run_sweep_ray(env, algos, seeds, steps, grid, out, address=address, num_cpus=workers,
                             progress=progress, on_run=on_run, base=base)
    raise ValueError(f"backend: unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


def wandb_logger(project: str, out: str):
    """A sweep's ``on_run``: each run, as it is done, becomes one W&B run in ``project`` with its config and
    per-step metrics, named by its folder, grouped by the sweep folder's name, its job type the label."""
    if not project.strip():
        raise ValueError("wandb: expected a W&B project name, got an empty string")
    wandb_ready("wandb")

    def log_run(folder: Path) -> None:
        cfg = read_json(folder / "config.json")
        run = WandbRun("wandb", project, folder, name=folder.name, group=Path(out).name, config=cfg,
                       job_type=cfg["label"])
        for record in read_jsonl(folder / "metrics.jsonl"):
            run.log(record)
        run.close()
    return log_run


def sim_command(env: str, algos: str | list[str], seeds, steps: int, sets: list[str] | None, out: str,
                json_out: bool = False, workers: int = 2, progress: bool = True, backend: str = "process",
                address: str | None = None, wandb: str | None = None, fitted: str | dict | None = None) -> dict:
    """Run ``algos`` x ``seeds`` x the ``--set`` grid on ``env`` into ``out``; print the summary (JSON if asked).
    With ``wandb`` (a project), each finished run is also logged to Weights & Biases. ``fitted``: a fit's settings
    (or its fit.json, ``--fitted``) that every run shares under the grid, named in no label."""
    from harness.runs.match import ENV, read_fit
    if fitted is not None and env != ENV:
        raise ValueError(f"env: --fitted runs at a fit of {ENV}, got {env!r}")
    base = read_fit(fitted) if isinstance(fitted, (str, Path)) else fitted
    names = parse_algos(algos) if isinstance(algos, str) else parse_algos(",".join(algos))
    on_run = wandb_logger(wandb, out) if wandb is not None else None
    summary = run_sweep_on(backend, env, names, seeds, steps, parse_sets(sets), out, workers=workers,
                           progress=progress, address=address, on_run=on_run, base=base)
    if json_out:
        from harness.reports.claim_record import to_json
        from harness.reports.ranking import as_json, rankings
        from harness.reports.rundirs import load_runs
        from harness.reports.sim import claim_sets
        runs = load_runs([out])
        print(json.dumps({"algorithms": summary["algorithms"], "ranking": as_json(rankings(runs)),
                          "claims": to_json(claim_sets(runs))}, indent=1, sort_keys=True))
    else:
        from harness.reports.rundirs import load_runs
        from harness.reports.sim import claims_text
        runs = load_runs([out])  # read once for the ranking and the claims
        print(format_ranking(runs))
        print("summary at the end of each run (equal steps; means over seeds):\n" + format_table(summary))
        print(claims_text(runs))
    return summary


def match_command(paths, label: str | None, budget: int, env: str, algos: str, seeds, steps: int,
                  sets: list[str] | None, out: str, json_out: bool, workers: int) -> bool:
    """``cliplab sim --match``: fit feature_lm to the regime card of ``paths`` (``harness.runs.match``), print the
    fit; if it matches, run ``algos`` there (single ``--set`` values stay fixed in the fit; the fit's settings are
    every run's, in no label). The fit's record is ``out``/fit.json either way. Returns whether the card was
    matched."""
    from spec.records import write_json

    from harness.reports.regime import FIT_FILE
    from harness.runs.match import ENV, fit
    if env not in ("toy_lm", ENV):  # toy_lm: the option's default
        raise ValueError(f"env: --match fits and ablates on {ENV}, got {env!r}")
    from sim.sweep import plan
    grid = parse_sets(sets)
    plan(ENV, parse_algos(algos), seeds, steps, grid)  # the ablation's arguments checked before the fit's minutes
    fixed = {k: v[0] for k, v in grid.items() if len(v) == 1 and "." not in k}
    record = Path(out) / FIT_FILE
    previous = read_json(record) if record.is_file() else None
    result = fit(paths, label=label, budget=budget, workers=workers, fixed=fixed, previous=previous)
    if previous is not None and result.record() == previous:
        print(f"{record} was fitted to this card with the same budget and settings: reused (delete it to fit "
              f"again)")
    print("\n".join(result.lines()), flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    write_json(record, result.record())  # before the ablation, so that a stopped one resumes at the same fit
    if result.matched:
        sim_command(ENV, algos, seeds, steps, sets, out, json_out, workers, fitted=result.settings)
    return result.matched


def format_ranking(runs: list[dict]) -> str:
    """The rankings of a sweep's ``runs`` (``harness.reports.rundirs.load_runs``; ``harness.reports.ranking``) as
    plain text, the answer first: per equal budget, the verdict, a table of the labels, the pairs, each label's gap
    to the leader and the notes."""
    from harness.reports.ranking import difference, pair_cell, rankings
    from harness.reports.rundirs import fmt_interval
    from harness.reports.sim import METRIC_NAMES, ranking_text, replication_cell
    parts = []
    for rk in rankings(runs):
        metric, pk = METRIC_NAMES.get(rk.metric, rk.metric), rk.pass_k
        table = [[c for c in ("rank", "group", "label", "reward", metric, pk, f"replication {metric}",
                              "replication rank") if c]]
        for s in rk.standings:
            table.append([str(s.rank), s.group, s.label, s.reward, fmt_interval(s.metric),
                          *([fmt_interval(s.pass_k)] if pk else []),
                          fmt_interval(s.replication_metric) if s.replication_metric else "-",
                          str(s.replication_rank or "-")])
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        pairs = [f"  {p.ahead} - {p.behind}: {pair_cell(p.metric, p.separable)}"
                 + (f"; {pk} {difference(p.pass_k)}" if pk else "") + f"; replication {replication_cell(p)}"
                 for p in rk.pairs]
        parts.append("\n".join([
            f"ranking at equal {rk.axis} ({rk.budget:,.0f} {rk.unit}; {rk.env}, {Path(rk.folder).name}):",
            f"{rk.verdict} {rk.replication}",
            *("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table),
            f"pairs (ahead - behind, {metric}):", *pairs,
            "gaps to the leader:", *(f"  {s.label}: {s.gap}" for s in rk.standings[1:]),
            *ranking_text(rk), ""]))
    return "\n".join(parts)
