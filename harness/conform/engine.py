"""``cliplab conform TARGET``: drive an outside implementation and the reference with the same batches, and say
for each algorithm, mode and knob whether they agree, by how much they differ, on which minimal input, and which
named convention of the reference the target matches instead."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from spec.records import write_text
from spec.registry import (AGG_MODES, CAP_MODES, HPARAMS, KL_KINDS, POLICY_ALGORITHMS, ROLLOUT_CORRECTIONS,
                           get_algorithm)

from harness.conform.cases import TOLERANCE, Batch, Check, Convention
from harness.verify.layers import scaled_diff

def _diff(got, want) -> tuple[float, float]:
    """Scaled differences of value and gradient; inf where the target is not finite and the reference is."""
    def one(a, b):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if not np.array_equal(np.isfinite(a), np.isfinite(b)):
            return float("inf")
        return scaled_diff(np.nan_to_num(a), np.nan_to_num(b))
    return one(got[0], want[0]), 0.0 if got[1] is None or want[1] is None else one(got[1], want[1])


def _differs(check: Check, batch: Batch, conv: Convention) -> bool:
    try:
        value, grad, used = check.run(batch)
        d = _diff((value, grad), conv.fn(used))
    except Exception:  # noqa: BLE001 (the target is outside code and may raise anything)
        return False
    return max(d) > check.tolerance


def shrink(check: Check, batch: Batch, conv: Convention, budget: int = 300) -> Batch:
    """Fewest groups, rows, columns and unmasked tokens (then simplest values) on which target and ``conv`` differ."""
    calls = [0]

    def still(b, limit=budget):  # never down to a batch without tokens: those are reported apart
        calls[0] += 1
        return b.mask.sum() > 0 and calls[0] <= limit and _differs(check, b, conv)

    changed = True
    while changed and calls[0] < budget:
        changed = False
        g, n_rows = batch.group_size, len(batch.mask)
        tries = []
        for k in range(n_rows // g):  # drop a group
            if n_rows > g:
                tries.append(lambda b, k=k: b.take(rows=[r for r in range(len(b.mask)) if r // g != k]))
        for j in range(g):  # drop the j-th response of every group
            if g > 1:
                tries.append(lambda b, j=j: b.take(rows=[r for r in range(len(b.mask)) if r % g != j],
                                                   group_size=g - 1))
        for t in range(batch.max_len):  # drop a column
            if batch.max_len > 1:
                tries.append(lambda b, t=t: b.take(cols=[c for c in range(b.max_len) if c != t]))
        for i, t in zip(*np.nonzero(batch.mask)):  # mask a token out
            tries.append(lambda b, i=i, t=t: replace(b, mask=_unset(b.mask, i, t)))
        for attempt in tries:
            smaller = attempt(batch)
            if still(smaller):
                batch, changed = smaller, True
                break
    for digits in (0, 1, 2):  # simpler numbers, whole arrays at a time
        for name in ("adv", "logp", "old_logp", "ref_logp"):
            simpler = replace(batch, **{name: np.round(getattr(batch, name), digits)})
            if name == "logp":  # keep the log-ratio where it was: round the old log-probs with it
                simpler = replace(simpler, old_logp=simpler.logp - (batch.logp - batch.old_logp).round(digits))
            if not np.array_equal(getattr(simpler, name), getattr(batch, name)) and still(simpler, budget + 12):
                batch = simpler
    return batch


def _unset(mask, i, t):
    out = mask.copy()
    out[i, t] = 0.0
    return out


def run_check(check: Check, seeds: int = 30) -> list[dict]:
    """One row per case family: agrees or differs, largest differences, minimal input, what it matches instead."""
    return [_run_family(check, family, seeds) for family in check.families]


def _run_family(check: Check, family: str, seeds: int) -> dict:
    row = {"algorithm": check.algorithm, "call": check.call, "knob": check.knob, "family": family,
           "reference": check.reference.label if check.reference else None, "note": check.note,
           "reads": check.reads}
    runs, errors = [], []
    for seed in range(seeds):
        batch = check.cases(seed, family)
        try:
            value, grad, used = check.run(batch)
        except Exception as exc:  # noqa: BLE001 (the target is outside code and may raise anything)
            errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
            continue
        if batch.mask.sum() == 0:  # a batch without tokens is reported apart: it would hide every other match
            _empty_batch(check, row, used, value)
            continue
        runs.append((batch, used, value, grad))
    row["cases"], row["target_errors"] = len(runs), sorted(set(errors))
    if not runs:
        return {**row, "status": "error", "loss_diff": None, "grad_diff": None, "matches": []}
    if check.reference is None:
        row.update(status="no reference", loss_diff=None, grad_diff=None)
    else:
        diffs = [_diff((v, g), check.reference.fn(u)) for _, u, v, g in runs]
        bad = [k for k, d in enumerate(diffs) if max(d) > check.tolerance]
        row["loss_diff"] = max(d[0] for d in diffs)
        row["grad_diff"] = max(d[1] for d in diffs)
        row["status"] = "differs" if bad else "agrees"
        if bad:
            worst = max(bad, key=lambda k: max(diffs[k]))
            small = shrink(check, runs[worst][0], check.reference)
            row["minimal"] = _describe(check, small)
    if row["status"] != "agrees":
        row.update(_matches(check, runs))
    return row


def _empty_batch(check: Check, row: dict, used: Batch, value) -> None:
    """Note what the target returns on a batch whose mask is all zero, where the reference's loss is 0."""
    if check.reference is None or "empty_batch" in row:
        return
    want = check.reference.fn(used)[0]
    if max(_diff((value, None), (want, None))) > check.tolerance:
        row["empty_batch"] = {"input": used.to_json(), "target": _plain(value), "reference": _plain(want)}


def _describe(check: Check, batch: Batch) -> dict:
    value, grad, used = check.run(batch)
    want = check.reference.fn(used)
    out = {"rows": int(len(used.mask)), "tokens": int(used.mask.sum()), "input": used.to_json(),
           "target": _plain(value), "reference": _plain(want[0])}
    if grad is not None and want[1] is not None:
        out["target_grad"], out["reference_grad"] = _plain(grad), _plain(want[1])
    if check.exact is not None:
        out["reference_exact"] = _plain(check.exact(used))
    return out


def _plain(x):
    arr = np.asarray(x, dtype=float)
    return float(arr) if arr.ndim == 0 else np.round(arr, 12).tolist()


def _matches(check: Check, runs) -> dict:
    """Which candidate conventions reproduce the target on every case (value and gradient, or only one of them)."""
    full, value_only, grad_only = [], [], []
    has_grad = all(g is not None for _, _, _, g in runs)
    for conv in check.candidates:
        ok_val, ok_grad = True, has_grad
        try:
            for _, u, v, g in runs:  # stop at the first case on which neither value nor gradient matches
                d = _diff((v, g), conv.fn(u))
                ok_val, ok_grad = ok_val and d[0] <= check.tolerance, ok_grad and d[1] <= check.tolerance
                if not (ok_val or ok_grad):
                    break
        except ValueError:
            continue
        label = conv.label if conv.named else conv.label + " (not a reference convention)"
        if ok_val and (ok_grad or not has_grad):
            full.append(label)
        elif ok_val:
            value_only.append(label)
        elif ok_grad:
            grad_only.append(label)
    return {"matches": full, "value_matches": value_only, "grad_matches": grad_only}


def conform(target, seeds: int = 30, only: Callable[[Check], bool] | None = None, adapter=None) -> dict:
    """Run every check of ``target`` (a framework name, module:function, a Python function computing a policy loss,
    or a target object) and return the report."""
    import torch
    check_seeds(seeds)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is an order of magnitude faster on shared cores
    try:
        tgt = target_of(target, adapter)
        checks = [c for c in tgt.checks() if only is None or only(c)]
        rows = [row for check in checks for row in run_check(check, seeds)]
    finally:
        torch.set_num_threads(threads)
    return {"target": tgt.name, "versions": tgt.versions, "tolerance": getattr(tgt, "tolerance", TOLERANCE),
            "seeds": seeds,
            "how": tgt.how, "rows": rows}


def check_seeds(seeds) -> None:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds: expected a positive integer (generated batches per check and family), got {seeds!r}")


def target_of(target, adapter=None):
    """A target object: ``target`` itself if it is one, a framework's or module:function's by name, or a Python
    function's (with ``adapter`` a dict or key=value text)."""
    if hasattr(target, "checks"):
        return target
    if isinstance(target, str):
        from harness.conform.targets import load_target
        return load_target(target, adapter)
    from harness.conform.targets.callable import CallableTarget
    return CallableTarget(target, adapter)


def verdict(row: dict) -> str:
    """One line: agrees / differs, what the target matches instead, and what it does on a batch without tokens."""
    text = _verdict(row)
    if row.get("empty_batch"):
        e = row["empty_batch"]
        text += (f"; on a batch without tokens it returns {json.dumps(e['target'])} where the reference gives "
                 f"{json.dumps(e['reference'])}")
    return text


def _verdict(row: dict) -> str:
    if row["status"] == "agrees":
        return "agrees"
    if row["status"] == "error":
        return "target raised on every case: " + "; ".join(row["target_errors"])
    head = "no reference convention" if row["status"] == "no reference" else f"differs from {row['reference']}"
    if row.get("matches"):
        return f"{head}; matches {', '.join(row['matches'])}"
    parts = []
    if row.get("value_matches"):
        parts.append("value matches " + ", ".join(row["value_matches"]))
    if row.get("grad_matches"):
        parts.append("gradient matches " + ", ".join(row["grad_matches"]))
    return f"{head}; " + ("; ".join(parts) if parts else "matches none of the reference's conventions")


def diff_anchor(index: int) -> str:
    """The HTML anchor of a report page's ``index``-th difference (the matrix links to it)."""
    return f"diff-{index}"


def markdown(report: dict) -> str:
    """The report as commit-ready markdown: a summary table, then each difference with its minimal input."""
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines = [f"# Conformance: {report['target']}", "", f"Versions: {versions}. {report['how']}", "",
             f"Each check runs {report['seeds']} generated batches per family (typical: mixed lengths, empty and "
             "length-1 rows, several groups; extreme: log-ratios of +-20 and small sampling probabilities, or for "
             "the KL estimators reference log-probs up to 30 nats away; lone: prompts with a single response). "
             "A batch whose mask is all zero is reported apart, at the end of the verdict. "
             f"Agreement means max |target - reference| / max(1, |reference|) <= {report['tolerance']:g} for the "
             "loss (or values) and for its gradient.", "",
             "| algorithm | target call | knob | family | cases | max loss diff | max grad diff | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
    for r in report["rows"]:
        lines.append(f"| {r['algorithm']} | `{r['call']}` | {r['knob']} | {r['family']} | {r['cases']} | "
                     f"{fmt(r.get('loss_diff'))} | {fmt(r.get('grad_diff'))} | {verdict(r)} |")
    diffs = [r for r in report["rows"] if r.get("minimal")]
    if diffs:
        lines += ["", "## Differences and their minimal inputs", ""]
    for index, r in enumerate(diffs):
        m = r["minimal"]
        lines += [f'<a id="{diff_anchor(index)}"></a>', "",
                  f"### {r['algorithm']}: `{r['call']}`, {r['knob']} ({r['family']})", "", verdict(r) + ".",
                  *([r["note"]] if r["note"] else []), "",
                  f"Minimal input ({m['rows']} rows, {m['tokens']} tokens; the check reads {r['reads']}): "
                  f"`{json.dumps(m['input'])}`", "",
                  f"- target: `{json.dumps(m['target'])}`", f"- reference: `{json.dumps(m['reference'])}`"]
        if "reference_exact" in m:
            lines.append(f"- reference, exact (sympy): `{json.dumps(m['reference_exact'])}`")
        if "target_grad" in m:
            lines += [f"- target gradient: `{json.dumps(m['target_grad'])}`",
                      f"- reference gradient: `{json.dumps(m['reference_grad'])}`"]
        if r["target_errors"]:
            lines.append(f"- the target raised on some generated batches: {'; '.join(r['target_errors'])}")
        lines.append("")
    return "\n".join(lines) + "\n"


def strict_json(obj):
    """The report with non-finite numbers written as strings ("inf", "nan"), so that any JSON reader takes it."""
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def file_stem(target: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in target)


def write_report(report: dict, out: str | Path) -> None:
    """``<out>/<target>.md`` and ``.json``, each written atomically."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = file_stem(report["target"])
    write_text(folder / f"{stem}.md", markdown(report))
    write_text(folder / f"{stem}.json", json.dumps(strict_json(report), indent=1, sort_keys=True) + "\n")


# ---- the command: verdict kinds, accepted conventions, console lines, exit code ------------------------------------

#: Verdict kinds that fail ``cliplab conform`` (exit 1) and ``assert_conforms``. The others: agrees, accepted
#: (differs, and matches a convention the user accepts), not implemented, no reference (nothing claimed).
FAILING = ("differs", "raises")
CHOICES = {"agg": tuple(AGG_MODES), "kl": KL_KINDS, "cap_mode": CAP_MODES,
           "rollout_correction": (*ROLLOUT_CORRECTIONS, "None")}
NUMERIC = tuple(k for k in HPARAMS if k not in CHOICES and k not in ("max_len", "cov_seed"))
LABEL = re.compile(r"(?:.* \()?(?P<name>[a-z0-9_]+)(?:\[(?P<settings>[^\]]*)\])?\)?")


def kind(row: dict) -> str:
    """A check's verdict kind: the engine's when it records one, else from its status (error: raises). A check that
    agrees on every batch with tokens but not on a batch without any differs."""
    found = row.get("kind") or {"error": "raises"}.get(row["status"], row["status"])
    return "differs" if found == "agrees" and row.get("empty_batch") else found


def parse_accept(entries) -> dict:
    """``--accept`` entries: KEY=VALUE items (comma-separated), or files of them, one a line, ``#`` comments;
    -> {key: {values}}. An entry that names no known convention is a ValueError listing the known ones."""
    items = []
    for entry in entries or ():
        if "=" in entry:
            items += entry.split(",")
            continue
        try:
            items += [line.split("#")[0] for line in Path(entry).read_text().splitlines()]
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"accept: {entry!r} is neither KEY=VALUE nor a readable file of them "
                             f"({getattr(exc, 'strerror', None) or exc})") from None
    accepted = {}
    for item in filter(None, (i.strip() for i in items)):
        key, _, value = (x.strip() for x in item.partition("="))
        if not (value in CHOICES.get(key, ()) or key in NUMERIC and isinstance(_setting(value), (float, type(None)))):
            known = [f"{k}={v}" for k, values in CHOICES.items() for v in values]
            raise ValueError(f"accept: {item!r} names no known convention; known: {', '.join(known)}, or KEY=NUMBER "
                             f"for {', '.join(NUMERIC)}")
        accepted.setdefault(key, set()).add(_setting(value))
    return accepted


def _setting(text: str):
    """A setting's value as labels write it: a number, None, or a name."""
    if text == "None":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _settings(label: str | None):
    """(algorithm, every hyper-parameter with the registry's defaults) of a policy convention's label, or None
    for a label that names no reference convention."""
    found = LABEL.fullmatch(label or "")
    if not found or found["name"] not in POLICY_ALGORITHMS:
        return None
    given = dict(item.split("=", 1) for item in (found["settings"] or "").split(", ") if "=" in item)
    merged = {**{k: str(v) for k, v in get_algorithm(found["name"]).defaults.items()}, **given}
    return found["name"], {k: _setting(v) for k, v in merged.items() if k != "max_len"}


def accepted_match(row: dict, accepted: dict) -> str | None:
    """The first convention the target matches that differs from the reference only in accepted settings."""
    want = _settings(row.get("reference"))
    if want is None or not accepted:
        return None
    for label in row.get("matches") or ():
        got = _settings(label)
        if got and got[0] == want[0] and all(
                got[1].get(k) in accepted.get(k, ()) for k in set(got[1]) | set(want[1])
                if got[1].get(k) != want[1].get(k)):
            return label
    return None


def closest(check: Check, minimal: dict) -> str | None:
    """The known convention nearest to the target on a minimal input: the reference or a candidate, with the
    largest scaled difference there."""
    data = dict(minimal["input"])
    group_size = data.pop("group_size")
    arrays = {k: np.asarray(v, dtype=float) for k, v in data.items()}
    core = {k: arrays.pop(k) for k in ("logp", "old_logp", "adv", "mask", "ref_logp")}
    try:
        value, grad, used = check.run(Batch(**core, group_size=group_size, extra=arrays))
    except Exception:  # noqa: BLE001 (the target is outside code)
        return None
    best = None
    for conv in [c for c in (check.reference, *check.candidates) if c is not None]:
        try:
            gap = max(_diff((value, grad), conv.fn(used)))
        except ValueError:
            continue
        if best is None or gap < best[0]:
            best = (gap, conv.label if conv.named else conv.label + " (not a reference convention)")
    return None if best is None else f"{best[1]} (off by {best[0]:.2e} there)"


def settle(target, report: dict, accepted: dict | None = None) -> dict:
    """Give each row its ``outcome`` (its kind, or accepted) and, where it differs, the ``closest`` known convention:
    the first it matches (a named one first), else the nearest on its minimal input; ``report["ok"]``: no row
    differs or raises."""
    checks = None
    for row in report["rows"]:
        row["outcome"] = kind(row)
        if row["outcome"] == "differs" and accepted_match(row, accepted or {}):
            row["outcome"] = "accepted"
        if row["outcome"] == "differs" and row.get("matches"):
            named = [m for m in row["matches"] if not m.endswith("(not a reference convention)")]
            row["closest"] = (named or row["matches"])[0]
        elif row["outcome"] == "differs" and row.get("minimal"):
            checks = checks or {(c.algorithm, c.call, c.knob): c for c in target.checks()}
            check = checks.get((row["algorithm"], row["call"], row["knob"]))
            row["closest"] = check and closest(check, row["minimal"])
    report["ok"] = not any(r["outcome"] in FAILING for r in report["rows"])
    return report


def console_lines(report: dict, failing_only: bool = False) -> list[str]:
    """Each check on a line (outcome, algorithm, knob, family, verdict); under each difference its largest errors,
    its minimal input, both values and the closest known convention; then a summary line."""
    fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
    lines = []
    for r in report["rows"]:
        if failing_only and r["outcome"] not in FAILING:
            continue
        lines.append(f"{r['outcome'].upper() if r['outcome'] in FAILING else r['outcome']:<8} {r['algorithm']} "
                     f"[{r['knob']}] {r['family']}: {verdict(r)}")
        if r["outcome"] not in (*FAILING, "accepted"):
            continue
        if r.get("loss_diff") is not None:
            lines.append(f"    largest difference over {r['cases']} batches: loss {fmt(r['loss_diff'])}, gradient "
                         f"{fmt(r['grad_diff'])} (tolerance {report['tolerance']:g}, scaled by max(1, |reference|))")
        if r.get("target_errors") and r["outcome"] != "raises":
            lines.append(f"    raised on some batches: {'; '.join(r['target_errors'])}")
        if r.get("minimal"):
            m = r["minimal"]
            exact = f" (exact: {json.dumps(m['reference_exact'])})" if "reference_exact" in m else ""
            lines += [f"    minimal input (rows: {m['rows']}, tokens: {m['tokens']}; reads {r['reads']}): "
                      f"{json.dumps(m['input'])}",
                      f"    target {json.dumps(m['target'])}, reference {json.dumps(m['reference'])}{exact}"]
        if r.get("empty_batch"):
            lines.append(f"    batch without tokens: {json.dumps(r['empty_batch']['input'])}")
        if r.get("closest"):
            lines.append(f"    closest known convention: {r['closest']}")
        if r.get("note"):
            lines.append(f"    note: {r['note']}")
    counts = {}
    for r in report["rows"]:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    lines.append(f"{report['target']}: {len(report['rows'])} checks: "
                 + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                 + ("" if report["ok"] else " (fails)"))
    return lines


def conform_command(target: str, json_out: bool = False, out: str | Path | None = None, seeds: int = 30,
                    adapter: str | None = None, accept=()) -> dict:
    """CLI body: run the checks, print each with its outcome and each difference with its numbers (or JSON), and
    write ``<out>/<target>.md`` and ``.json``; ``report["ok"]`` says whether any check differs or raises."""
    check_seeds(seeds)
    accepted = parse_accept(accept)
    out = None if out is None else Path(out).absolute()  # whatever the target does, the report lands here
    tgt = target_of(target, adapter)
    report = settle(tgt, conform(tgt, seeds=seeds), accepted)
    if out is not None:
        write_report(report, out)
    if json_out:
        print(json.dumps(strict_json(report), indent=1, sort_keys=True))
    else:
        print("\n".join(console_lines(report)))
    return report


def assert_conforms(fn, algorithm: str, *, seeds: int = 30, accept=(), **adapter) -> dict:
    """Assert that ``fn`` (a function, or "module:function") computes ``algorithm``'s policy loss with the
    hyper-parameters and parameter names in ``adapter`` (the keys of ``cliplab conform --adapter``, e.g. beta=0,
    logp="log_probs", adv_shape="seq") on generated batches. On a difference, the AssertionError shows its minimal
    input, both values and the closest known convention. ``accept``: conventions to let pass (KEY=VALUE or files,
    as ``--accept``). Returns the report."""
    __tracebackhide__ = True  # pytest shows the assertion, not this frame
    check_seeds(seeds)
    accepted = parse_accept([accept] if isinstance(accept, str) else accept)
    from harness.conform.targets.callable import CallableTarget
    target = CallableTarget(fn, {"algorithm": algorithm, **adapter})
    report = settle(target, conform(target, seeds=seeds), accepted)
    if not report["ok"]:
        raise AssertionError(f"{target.name} does not conform to {algorithm}:\n"
                             + "\n".join(console_lines(report, failing_only=True)))
    return report
