"""The claims' renderers, each reading claim records (``harness.reports.claim_record``) only: the markdown summary
(one line per claim and regime, linked to its details), the details appendix (both seed sets, the regime card's
conditions, the attribution), the folded list of claims not measured or not testable here, ``claims.json``
(``claim_record.SCHEMA``) and the console's lines."""
from __future__ import annotations

import json
import re
from pathlib import Path

from spec.records import read_json, write_text
from spec.regime import NOT_APPLICABLE

from harness.reports.claim_record import Kind, RunSet, from_json, to_json
from harness.reports.rundirs import fmt

#: The files written beside a report: the records, and the details each summary line links to.
JSON_NAME, DETAILS_NAME = "claims.json", "claims.md"
#: Record kinds folded into one short list below the summary (each with what would measure it).
FOLDED = (Kind.NOT_MEASURED, Kind.NOT_TESTABLE)


def prose(text: str) -> str:
    """``text`` as literal markdown outside a table: backslash, backtick and asterisk escaped, a ``](`` that would
    close a link's text escaped, a ``<`` that could open an HTML tag written as an entity; line breaks as spaces."""
    out = str(text).replace("\\", "\\\\").replace("`", "\\`").replace("*", "\\*").replace("](", "\\](")
    out = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", out)
    return " ".join(out.splitlines())


def cell(text: str) -> str:
    """``text`` as literal markdown inside a table cell (``prose``, and the cell's ``|`` escaped)."""
    return prose(text).replace("|", "\\|")


def alt(text: str) -> str:
    """``text`` as an image's alt text (``prose``, and its brackets escaped)."""
    return prose(text).replace("[", "\\[").replace("]", "\\]")


def anchor(run_set: str, claim: str, n: int) -> str:
    """A details heading that is its own GitHub anchor (lower case, digits, ``_`` and ``-`` only)."""
    return re.sub(r"[^a-z0-9_-]+", "-", "-".join(x for x in (run_set, claim, str(n)) if x).lower()).strip("-")


def _keys(run_set: RunSet) -> list[str]:
    """Each record's anchor: its claim's id and its place among that claim's records."""
    seen: dict = {}
    out = []
    for r in run_set.records:
        seen[r.claim.id] = seen.get(r.claim.id, 0) + 1
        out.append(anchor(run_set.name, r.claim.id, seen[r.claim.id]))
    return out


def effect(est) -> str:
    """An estimate as "what value ± half" (its test beside); "-" where there is none."""
    if est is None:
        return "-"
    value = fmt(est.value, est.half, pct=est.pct)
    test = f" ({est.test}, Holm p {est.p:.2g})" if est.p is not None else (
        f" ({est.test})" if est.test in ("structural", "too few") else "")
    return f"{est.what}: {value}{test}"


def summary_lines(run_set: RunSet, details: str = DETAILS_NAME, extra=((), None)) -> list[str]:
    """One table line per claim and regime (claim, regime, the discovery seeds' effect ± 95% half-width, verdict,
    reason), each claim linked to its details in ``details``; then the claims not measured or not testable here in
    one short list, each with the command that would measure it or the reason it cannot be tested. ``extra``:
    (column names, a function of a record giving their markdown cells), added to both."""
    names, cells_of = extra
    keys = _keys(run_set)
    shown = [(r, k) for r, k in zip(run_set.records, keys) if r.kind not in FOLDED]
    folded = [(r, k) for r, k in zip(run_set.records, keys) if r.kind in FOLDED]
    lines = []
    if shown:
        head = ["claim", "regime", "effect (discovery seeds)", "verdict", "reason", *names]
        lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for r, k in shown:
            row = [f"[{cell(r.claim.text)}]({details}#{k})", cell(r.regime or "-"), cell(effect(r.discovery.estimate)),
                   f"**{cell(r.verdict_text())}**", cell(r.reason), *(cells_of(r) if names else ())]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if folded:
        lines += ["Not measured or not testable here:", ""]
        for r, k in folded:
            what = f"run `{r.command}`" if r.command else prose(r.reason)
            regime = f" ({prose(r.regime)})" if r.regime else ""
            more = "".join(f"; {n}: {c}" for n, c in zip(names, cells_of(r))) if names else ""
            lines.append(f"- [{prose(r.claim.text)}]({details}#{k}){regime}: {r.kind.value}; {what}{more}")
        lines.append("")
    return lines


def _set_line(name: str, s) -> str:
    if s is None:
        return f"- {name}: not run"
    seeds = f" (seeds {s.seeds})" if s.seeds else ""
    out = f"- {name}{seeds}: **{prose(s.verdict.text())}**"
    if s.estimate is not None:
        out += f"; {prose(effect(s.estimate))}"
    return out + (f". Measured: {prose(s.measured)}" if s.measured else "")


def detail_lines(run_sets: list[RunSet]) -> list[str]:
    """Per record, a section (its anchor as heading): the claim and its source, the regime and the labels compared,
    the verdict and reason, each seed set's verdict, estimate and measurements, the regime card's conditions with
    their measured values, the attribution, and the command that would measure it."""
    lines = []
    for run_set in run_sets:
        for r, k in zip(run_set.records, _keys(run_set)):
            lines += [f"### {k}", "", f"**{prose(r.claim.text)}** ({prose(r.claim.source.text())})"
                      + (f"; {prose(run_set.name)}" if run_set.name else "") + (
                          f"; regime {prose(r.regime)}" if r.regime else "") + ".", ""]
            if r.compared:
                lines.append(f"- compared: {prose(', '.join(r.compared))}")
            lines.append(f"- verdict: **{prose(r.verdict_text())}**: {prose(r.reason)}")
            lines.append(_set_line("discovery" if r.status != "single set" else "runs", r.discovery))
            if r.status != "single set":
                lines.append(_set_line("replication", r.replication))
            for c in r.conditions:
                state = (f"{NOT_APPLICABLE} for its algorithm" if not c.applicable else "not logged"
                         if c.value is None else f"measured {c.value:.3g}, {'holds' if c.holds else 'fails'}")
                lines.append(f"- regime card, {prose(c.label)}: {prose(c.condition.text())} "
                             f"({prose(c.condition.why)}): {state}")
            if r.attribution:
                lines.append(f"- attribution: {prose(r.attribution)}")
            if r.command:
                lines.append(f"- to measure it: `{r.command}`")
            lines.append("")
    return lines


def details_page(run_sets: list[RunSet], title: str, produced_by: str) -> str:
    """The details appendix beside a report: a section per record (``detail_lines``)."""
    return "\n".join([f"# {prose(title)}: claim details", "", f"Produced by {produced_by}; each line of the "
                      f"report's claims links to its section here. The records: {JSON_NAME} beside this file.", "",
                      *detail_lines(run_sets)])


def json_text(run_sets: list[RunSet]) -> str:
    """``claims.json``'s text: ``claim_record.to_json``, one claim record a line."""
    data = to_json(run_sets)
    sets = []
    for s in data["run_sets"]:
        claims = ",\n".join("   " + json.dumps(c, sort_keys=True, ensure_ascii=False) for c in s.pop("claims"))
        head = json.dumps(s, sort_keys=True, ensure_ascii=False)[:-1]
        sets.append(f"  {head}, \"claims\": [\n{claims}\n  ]}}")
    return f"{{\"version\": {data['version']}, \"run_sets\": [\n" + ",\n".join(sets) + "\n]}\n"


def write_claims(folder, run_sets: list[RunSet], title: str, produced_by: str) -> tuple[Path, Path]:
    """Write ``claims.json`` and the details page ``claims.md`` into ``folder`` (atomically); their paths."""
    folder = Path(folder)
    js, page = folder / JSON_NAME, folder / DETAILS_NAME
    write_text(js, json_text(run_sets))
    write_text(page, details_page(run_sets, title, produced_by))
    return js, page


def read_claims(path) -> list[RunSet]:
    """The run sets of a ``claims.json``; a ValueError naming the file where it is not one."""
    data = read_json(path)
    try:
        return from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a claims.json of this version (at {exc!r}); regenerate its report") from None


def console_lines(run_set: RunSet) -> list[str]:
    """Plain-text lines for a terminal: one per measured claim and regime (verdict, claim, regime, effect), then how
    many are not measured or not testable here."""
    out = []
    folded = 0
    for r in run_set.records:
        if r.kind in FOLDED:
            folded += 1
            continue
        regime = f" [{r.regime}]" if r.regime else ""
        out.append(f"{r.verdict_text()}: {r.claim.text}{regime}; {effect(r.discovery.estimate)}")
    if folded:
        out.append(f"{folded} claim(s) not measured or not testable here: see the report's list")
    return out
