"""``cliplab conform TARGET --level step``: drive a trainer's own code (or a user's per-micro-batch loss,
``harness.conform.kinds_step``) for one optimisation step (micro-batches,
gradient accumulation, data-parallel ranks simulated in one process, with the loss-scale factors and token or
sequence counts the trainer passes) and report the factor by which the accumulated gradient w.r.t. the per-token
log-probs differs from the gradient of the paper's loss on the whole batch, per micro-batch size and rank count."""
from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import numpy as np

from spec.records import write_text

from harness.conform.engine import file_stem, strict_json
from harness.conform.cases import STEP_FAMILIES, STEP_ROWS, NotApplicable, StepCheck, step_batch

MICRO = (1, 2, 4, None)  # rows per micro-batch and rank; None: the rank's whole share
RANKS = (1, 2)
TINY = 1e-300


def factor(got, want) -> dict:
    """Least-squares c in got ~ c * want; residual = max |got - c want| / max(|got|, |c want|); rel_diff =
    max |got - want| / max |want|. A zero reference gradient gives c = 1 when got is zero too, else None."""
    g, w = np.ravel(np.asarray(got, dtype=float)), np.ravel(np.asarray(want, dtype=float))
    rel = float(np.abs(g - w).max() / max(np.abs(w).max(), TINY)) if g.size else 0.0
    if not g.size or not np.any(w):
        return {"factor": 1.0 if not np.any(g) else None, "residual": 0.0 if not np.any(g) else 1.0,
                "rel_diff": rel if np.any(w) else (0.0 if not np.any(g) else float("inf"))}
    c = float(g @ w / (w @ w))
    residual = float(np.abs(g - c * w).max() / max(np.abs(g).max(), np.abs(c * w).max(), TINY))
    return {"factor": c, "residual": residual, "rel_diff": rel}


def run_cell(check: StepCheck, family: str, micro, ranks: int, seeds: int) -> dict:
    """One grid cell over ``seeds`` batches: exact (factor 1), a factor (proportional, mean +- standard error,
    range), or not proportional (largest relative difference); where it is not exact, ``matches``: the check's
    candidates that give the target's gradient on every batch (``_used``: the batches, for ``_matches``)."""
    make = check.batches or step_batch
    fits, errors, grads, used_batches = [], [], [], []
    cell = {"micro": "whole" if micro is None else micro, "ranks": ranks}
    for seed in range(seeds):
        batch = make(seed, family)
        try:
            grad, used = check.step(batch, micro, ranks)
        except NotApplicable as exc:
            return {**cell, "cases": 0, "target_errors": [], "status": "n/a", "why": str(exc)}
        except Exception as exc:  # noqa: BLE001 (the target is outside code and may raise anything)
            errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
            continue
        fits.append(factor(grad, check.reference.fn(used)[1]))
        grads.append(grad)
        used_batches.append(used)
    cell.update(cases=len(fits), target_errors=sorted(set(errors)), _used=used_batches)
    if not fits:
        return {**cell, "status": "error"}
    tol = check.tolerance
    cs = np.array([f["factor"] if f["factor"] is not None else np.nan for f in fits])
    cell.update(max_residual=max(f["residual"] for f in fits), max_rel_diff=max(f["rel_diff"] for f in fits))
    if np.isnan(cs).any() or cell["max_residual"] > tol:
        cell["status"] = "not proportional"
        cell["matches"] = _matches(check, cell, grads)
        return cell
    cell.update(factor_mean=float(cs.mean()), factor_se=float(cs.std(ddof=1) / np.sqrt(len(cs))) if len(cs) > 1
                else 0.0, factor_min=float(cs.min()), factor_max=float(cs.max()))
    cell["status"] = "exact" if np.all(np.abs(cs - 1.0) <= tol) else "scaled"
    if cell["status"] != "exact":
        cell["matches"] = _matches(check, cell, grads)
    return cell


def _matches(check: StepCheck, cell: dict, grads: list | None = None) -> list[str]:
    """The check's candidates that give ``grads`` (the target's, else the reference's: at an exact cell) on each of
    the cell's batches."""
    micro = None if cell["micro"] == "whole" else cell["micro"]
    grads = grads or [check.reference.fn(used)[1] for used in cell["_used"]]
    return [name for name, fn in check.candidates.items()
            if all(factor(g, fn(used, micro, cell["ranks"]))["rel_diff"] <= check.tolerance
                   for g, used in zip(grads, cell["_used"]))]


def run_step_check(check: StepCheck, seeds: int) -> list[dict]:
    """One row per case family, each with the grid of micro-batch sizes x ranks."""
    rows = []
    for family in STEP_FAMILIES:
        grid = [run_cell(check, family, m, r, seeds) for r in RANKS for m in MICRO]
        ran = [c for c in grid if c["status"] != "n/a"]
        status = "agrees" if all(c["status"] == "exact" for c in ran) else (
            "error" if all(c["status"] == "error" for c in ran) else "differs")
        matches, compared = [], [c for c in ran if c["cases"]]
        if status == "differs" and check.candidates and compared:
            matches = [name for name in check.candidates if all(
                name in (c["matches"] if "matches" in c else _matches(check, c)) for c in compared)]
        for c in grid:
            c.pop("_used", None)
            c.pop("matches", None)
        rows.append({"algorithm": check.algorithm, "call": check.call, "knob": check.knob, "family": family,
                     "reference": check.reference.label, "note": check.note, "status": status, "matches": matches,
                     "tolerance": check.tolerance, "grid": grid})
    return rows


def step_targets() -> tuple[str, ...]:
    from harness.conform.targets import step
    return tuple(sorted(m.name for m in pkgutil.iter_modules(step.__path__)))


def load_step_target(target, adapter=None):
    """The step-level target ``target`` (a module of harness.conform.targets.step), or a ValueError naming the known
    ones; a user's per-micro-batch loss (``module:function`` or a function, with ``adapter``) as
    ``harness.conform.kinds_step`` drives it."""
    if callable(target) or ":" in target:
        from harness.conform.kinds_step import UserStep
        return UserStep(target, adapter)
    if adapter is not None:
        raise ValueError("adapter: --level step drives a trainer (verl, trl or openrlhf) as it is, or a "
                         "module:function with --adapter")
    known = step_targets()
    if target not in known:
        raise ValueError(f"target: --level step covers {', '.join(known)}; got {target!r}")
    return importlib.import_module(f"harness.conform.targets.step.{target}").StepTarget()


def conform_step(target, seeds: int = 5, adapter=None) -> dict:
    """Every step-level check of ``target`` (a trainer, or a user's loss with ``adapter``) over the grid MICRO x
    RANKS and both step families."""
    import torch
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds: expected a positive integer (generated batches per grid cell), got {seeds!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tgt = None
    try:
        tgt = load_step_target(target, adapter)
        rows = [row for check in tgt.step_checks() for row in run_step_check(check, seeds)]
    finally:
        torch.set_num_threads(threads)
        if hasattr(tgt, "close"):  # a user's worker process ends with its report
            tgt.close()
    return {"target": tgt.name, "level": "step", "versions": tgt.versions, "how": tgt.how, "seeds": seeds,
            "rows": rows}


def cell_text(cell: dict, tolerance: float = 0.0) -> str:
    """``1``, one factor, mean +- standard error (range), ``not proportional (...)`` or the target's error."""
    if cell["status"] == "error":
        return "error: " + "; ".join(cell["target_errors"])
    if cell["status"] == "n/a":
        return "n/a"
    if cell["status"] == "exact":
        return "1"
    if cell["status"] == "not proportional":
        return f"not proportional (max rel. diff {cell['max_rel_diff']:.3g})"
    if cell["factor_max"] - cell["factor_min"] <= tolerance * max(1.0, abs(cell["factor_max"])):
        return f"{cell['factor_mean']:.6g}"
    return (f"{cell['factor_mean']:.4g} +- {cell['factor_se']:.2g} "
            f"(range {cell['factor_min']:.4g} to {cell['factor_max']:.4g})")


def markdown(report: dict) -> str:
    """A grid per check: rows are family x ranks, columns micro-batch sizes; a cell is the factor."""
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    heads = [f"micro {m}" if m is not None else "whole share" for m in MICRO]
    lines = [f"# Step-level conformance: {report['target']}", "", f"Versions: {versions}. {report['how']}", "",
             f"Each cell runs {report['seeds']} generated batches of {STEP_ROWS} responses (groups of 4, one "
             "advantage per response). Families: " + "; ".join(f"{k}: {v}" for k, v in STEP_FAMILIES.items()) +
             ". A cell is the factor c in (accumulated gradient) = c x (gradient of the reference loss on the whole "
             "batch), fitted by least squares per batch: `1` when c = 1 within the check's tolerance on every "
             "batch; a single number when c is the same on every batch; mean +- standard error and range when it "
             "varies with the batch; `not proportional` when the least-squares residual exceeds the tolerance "
             "(the largest |target - reference| / max |reference| is shown); `n/a` where the trainer cannot be "
             "configured so. Micro-batch sizes are rows per "
             "micro-batch on each rank; the rank count divides the batch into contiguous shares, and the ranks' "
             "gradients are averaged as DDP/FSDP's all-reduce does.", ""]
    lines += ["## Findings", "", *findings(report), ""]
    seen = set()
    for r in report["rows"]:
        key = (r["algorithm"], r["call"], r["knob"])
        if key not in seen:
            seen.add(key)
            lines += [f"## {r['algorithm']}: {r['knob']}", "", f"Trainer path: `{r['call']}`. Reference: "
                      f"`{r['reference']}` (tolerance {r['tolerance']:g}).", *([r["note"]] if r["note"] else []),
                      "", "| family | ranks | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
        for ranks in RANKS:
            cells = [cell_text(c, r["tolerance"]) for c in r["grid"] if c["ranks"] == ranks]
            lines.append(f"| {r['family']} | {ranks} | " + " | ".join(cells) + " |")
        if r["family"] == list(STEP_FAMILIES)[-1]:
            lines.append("")
    return "\n".join(lines) + "\n"


def findings(report: dict) -> list[str]:
    """One markdown bullet per check and family that differs from the reference somewhere on the grid."""
    return [f"- {r['algorithm']}, {r['knob']} ({r['family']}): {_summary(r)}." + (f" {r['note']}" if r["note"] else "")
            + "".join(f" Matches: {m}." for m in r["matches"])
            for r in report["rows"] if r["status"] != "agrees"] or ["- none: the accumulated gradient equals the "
                                                                   "reference's at every split"]


def findings_page(folder: Path) -> str:
    """The step-level findings of every report in ``folder`` (its *.json), for the conformance matrix."""
    lines = ["# Step-level findings", "", "Regenerated by `cliplab conform NAME --level step --out "
             "reports/conformance` for each of " + ", ".join(step_targets()) + ". Each target's page has the grids "
             "(factor per micro-batch size and rank count) and says how its trainer was driven.", ""]
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
        lines += [f"## [{report['target']}]({path.stem}.md) ({versions})", "", *findings(report), ""]
    return "\n".join(lines)


def _summary(row: dict) -> str:
    """Where the grid differs from 1, cells with the same text grouped: ``0.75 at every split`` or per cell."""
    texts: dict = {}
    for c in row["grid"]:
        if c["status"] not in ("exact", "n/a"):
            texts.setdefault(cell_text(c, row["tolerance"]), []).append(f"m={c['micro']} r={c['ranks']}")
    if len(texts) == 1 and len(next(iter(texts.values()))) == len(row["grid"]):
        return f"{next(iter(texts))} at every micro-batch size and rank count (vs `{row['reference']}`)"
    return (f"vs `{row['reference']}`, by micro-batch rows m and ranks r: "
            + "; ".join(f"{', '.join(cells)}: {text}" for text, cells in texts.items())
            + ("; 1 elsewhere" if any(c["status"] == "exact" for c in row["grid"]) else ""))


def write_step_report(report: dict, out: str | Path) -> None:
    """``<out>/step/<target>.md`` and ``.json``, then the findings of every target there, ``<out>/step/README.md``."""
    folder = Path(out) / "step"
    folder.mkdir(parents=True, exist_ok=True)
    stem = file_stem(report["target"])
    write_text(folder / f"{stem}.md", markdown(report))
    write_text(folder / f"{stem}.json", json.dumps(strict_json(report), indent=1, sort_keys=True) + "\n")
    write_text(folder / "README.md", findings_page(folder))


def step_command(target: str, json_out: bool = False, out: str | Path | None = None, seeds: int = 5,
                 baseline=None, write_baseline=None, adapter=None) -> dict:
    """CLI body: run the step-level checks, print one line per check and family (or JSON), and write
    ``<out>/step/<target>.md`` and ``.json`` and the findings of every target there, ``<out>/step/README.md``;
    ``report["ok"]``: every check agrees at every split, or (with ``baseline``, a file of known findings) differs
    only in grid cells that file records, none grown; ``write_baseline``: record the cells that differ there."""
    from harness.conform.baseline import read_baseline
    base = None if baseline is None else read_baseline(baseline, "step", seeds)
    out, write_baseline = (None if p is None else Path(p).absolute() for p in (out, write_baseline))
    report = hold_to_baseline(conform_step(target, seeds=seeds, adapter=adapter), base)
    if write_baseline is not None:
        from harness.conform.baseline import write_baseline as record
        report["baseline_written"] = {"file": str(write_baseline), "findings": record(report, write_baseline)}
    if out is not None:
        write_step_report(report, out)
    if json_out:
        print(json.dumps(strict_json(report), indent=1, sort_keys=True))
        return report
    for r in report["rows"]:
        text = "agrees at every split" if r["status"] == "agrees" else _summary(r)
        if r["outcome"] == "differs" and "baseline" in report:
            text = "new or grown: " + "; ".join(f"m={c['micro']} r={c['ranks']}: {cell_text(c, r['tolerance'])} "
                                                  f"[{c['baseline']}]" for c in r["grid"]
                                                  if c.get("baseline", "known") != "known")
        mark = f"{r['outcome'] if r['outcome'] != 'agrees' else '':<9} " if "baseline" in report else ""
        print(f"{mark}{r['algorithm']:<10} {r['knob']:<48} {r['family']:<12} {text}")
        print("".join(f"    matches: {m}\n" for m in r["matches"]), end="")
    if "baseline" in report:
        from harness.conform.baseline import summary
        print(summary(report))
    if write_baseline is not None:
        print(f"baseline written: {write_baseline} ({report['baseline_written']['findings']} findings)")
    return report


def hold_to_baseline(report: dict, base: dict | None) -> dict:
    """Each row's ``outcome``: agrees, differs, or baselined (every cell that differs is known to ``base``, none
    grown); ``report["ok"]``: none differs."""
    if base is not None:
        from harness.conform.baseline import apply_baseline
        apply_baseline(report, base)
    for r in report["rows"]:
        known = base is not None and all(c.get("baseline", "known") == "known" for c in r["grid"])
        r["outcome"] = "agrees" if r["status"] == "agrees" else "baselined" if known else "differs"
    report["ok"] = all(r["outcome"] != "differs" for r in report["rows"])
    return report
