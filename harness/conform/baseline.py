"""Baselines: a gate that fails only on what is new. ``--write-baseline FILE`` records a run's findings;
``--baseline FILE`` lets through those it records, and fails on a finding it does not record or one whose magnitude
grew.

A finding is known by its check (algorithm, call, knob), case family and name, the name without what varies
between equal runs of a changed codebase: the case count ("on 7 of 30 cases", compared as the magnitude instead)
and an error's place ("(at core_algos.py:412)", which moves with every edit above it). So a changed kind (another
convention matched, a clamp at another threshold, another exception) is a new finding. Its magnitude grew when the
largest scaled difference grew by more than the check's tolerance (finite to inf included), or, for a raise or a
step cell's error, when it occurs on more of the same cases. A step-level finding is one grid cell (micro-batch
size and ranks) that is not exact, with its largest relative difference from the reference's gradient.

The file (JSON, keys sorted, findings in a fixed order, one a line, so that it diffs well in a repository):
``{"cliplab_baseline": 1, "target", "level" ("loss" or "step"), "seeds", "algorithms", "findings": [{"algorithm",
"call", "knob", "family", "finding", "max_err" (null for a raise; "inf" for a non-finite one), "cases", "of"}]}``."""
from __future__ import annotations

import json
import math
import re

from spec.records import read_json, write_text

VERSION = 1
KEY = ("algorithm", "call", "knob", "family", "finding")
_COUNT = re.compile(r" on \d+ of \d+ cases$")
_PLACE = re.compile(r" \(at [^()]*:\d+\)")


def finding_name(name: str) -> str:
    """A finding's name without its case count and an error's place."""
    return _PLACE.sub("", _COUNT.sub("", name))


def _magnitude(value) -> float | None:
    return None if value is None else float(value)


def findings_of(report: dict) -> list[dict]:
    """Every finding of a report (either level) as a baseline entry, with the ``tolerance`` its growth is held to."""
    out = []
    for row in report["rows"]:
        check = {k: row[k] for k in ("algorithm", "call", "knob", "family")}
        if report.get("level") == "step":
            for cell in row["grid"]:
                if cell["status"] in ("exact", "n/a"):
                    continue
                what = ("error " + "; ".join(cell["target_errors"]) if cell["status"] == "error"
                        else cell["status"])
                out.append({**check, "finding": finding_name(f"micro {cell['micro']}, ranks {cell['ranks']}: {what}"),
                            "max_err": _magnitude(cell.get("max_rel_diff")), "cases": cell["cases"],
                            "of": report["seeds"], "tolerance": row["tolerance"], "place": cell})
        else:
            out += [{**check, "finding": finding_name(f["name"]), "max_err": _magnitude(f["max_err"]),
                     "cases": f["cases"], "of": f["of"], "tolerance": row["tolerance"], "place": f}
                    for f in row["findings"]]
    return out


def _key(entry: dict) -> tuple:
    return tuple(str(entry[k]) for k in KEY)


def write_baseline(report: dict, path) -> int:
    """Record ``report``'s findings in ``path`` (atomically); returns how many."""
    entries = sorted(({k: e[k] for k in (*KEY, "max_err", "cases", "of")} for e in findings_of(report)), key=_key)
    for e in entries:
        if e["max_err"] is not None and not math.isfinite(e["max_err"]):
            e["max_err"] = str(e["max_err"])
    head = {"cliplab_baseline": VERSION, "target": report["target"], "level": report.get("level", "loss"),
            "seeds": report["seeds"], "algorithms": sorted({r["algorithm"] for r in report["rows"]})}
    lines = [json.dumps(e, sort_keys=True) for e in entries]
    text = json.dumps(head, indent=1, sort_keys=True)[:-2] + ',\n "findings": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"
    write_text(path, text)
    return len(entries)


def read_baseline(path, level: str, seeds: int) -> dict:
    """A baseline file, checked: a ValueError naming the file when it cannot be read, is not one, is of another
    version or level, or was written with another number of seeds (magnitudes over other batches do not compare)."""
    base = read_json(path)
    where = f"baseline: {path}"
    if base.get("cliplab_baseline") != VERSION:
        raise ValueError(f"{where}: not a cliplab baseline of version {VERSION} (written by --write-baseline)")
    try:
        entries = {_key(e): e for e in base["findings"]}
        for e in entries.values():
            e["max_err"] = _magnitude(e["max_err"])
            int(e["cases"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: a finding lacks or garbles {exc}; write it again with --write-baseline") from None
    if base.get("level") != level:
        raise ValueError(f"{where}: written at --level {base.get('level')}; this run is at --level {level}")
    if base.get("seeds") != seeds:
        raise ValueError(f"{where}: written with --seeds {base.get('seeds')}; run with the same --seeds (its "
                         f"magnitudes are over those batches), or write it again")
    return {**base, "path": str(path), "entries": entries}


def apply_baseline(report: dict, base: dict) -> dict:
    """Mark each finding of ``report`` known, new or grown against ``base`` (``baseline``: "known", "new: not in
    the baseline", or "grown: the baseline has X on N cases"), refusing a baseline of another target or algorithm;
    returns the counts, with the recorded findings no longer seen (``gone``), and stores them as
    ``report["baseline"]``."""
    where = f"baseline: {base['path']}"
    if base.get("target") != report["target"]:
        raise ValueError(f"{where}: written for target {base.get('target')!r}; this run checks {report['target']!r}")
    algorithms = {r["algorithm"] for r in report["rows"]}
    if algorithms and not algorithms & set(base.get("algorithms") or ()):
        raise ValueError(f"{where}: written for algorithm {', '.join(base.get('algorithms') or ['none'])}; this run "
                         f"checks {', '.join(sorted(algorithms))}")
    counts, seen = {"known": 0, "new": 0, "grew": 0}, set()
    for entry in findings_of(report):
        old = base["entries"].get(_key(entry))
        seen.add(_key(entry))
        if old is None:
            kind, status = "new", "new: not in the baseline"
        elif _grew(entry, old):
            was = "" if old["max_err"] is None else f"a largest difference of {old['max_err']:.3g}, "
            kind, status = "grew", f"grown: the baseline has {was}on {old['cases']} cases"
        else:
            kind, status = "known", "known"
        entry["place"]["baseline"] = status
        counts[kind] += 1
    gone = [dict(zip(KEY, k)) for k in base["entries"] if k not in seen]
    report["baseline"] = {"file": base["path"], **counts, "gone": gone}
    return report["baseline"]


def _grew(entry: dict, old: dict) -> bool:
    if entry["max_err"] is None or old["max_err"] is None:
        return entry["cases"] > int(old["cases"])
    return entry["max_err"] > old["max_err"] + entry["tolerance"]


def passes(finding: dict) -> bool:
    """Whether a finding is let through: accepted by name or known to the baseline."""
    return bool(finding.get("accepted")) or finding.get("baseline") == "known"


def summary(report: dict) -> str:
    """The baseline's line under a report: counts, and the recorded findings no longer seen."""
    b = report["baseline"]
    gone = f"; {len(b['gone'])} recorded no longer seen (write it again to drop them)" if b["gone"] else ""
    return f"baseline {b['file']}: {b['new']} new, {b['grew']} grown, {b['known']} known{gone}"
