"""Claims as records (harness/reports/claim_record.py): claims.json against its schema and back, the committed
reports' records, and the rendered markdown: one line per claim linked to its details, the unmeasured ones folded with
their command, no escape artefacts or internal references, "Produced by" lines relative to the repository."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from harness.reports.claim_record import SCHEMA, Kind, to_json
from harness.reports.claim_render import json_text, read_claims
from harness.reports.claims import run_claims

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"


def _validate(data: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, SCHEMA)


def _dcpo_runs(shift: float, n: int = 5) -> list[dict]:
    """DCPO under its ternary and the binary reward, n seeds a set: the binary runs' accuracy ``shift`` higher."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(2 * n):
        base = 0.3 + 0.02 * rng.standard_normal()
        for label, params, acc in (("dcpo", {}, base), ("dcpo[reward=binary]", {"reward": "binary"},
                                                        base + shift + 0.01 * rng.standard_normal())):
            runs.append({"dir": "d", "label": label, "algo": "dcpo", "params": params, "seed": seed,
                         "set": "discovery" if seed < n else "replication", "env": "toy_lm", "settings": None,
                         "records": [{"step": s, "accuracy_exact": acc, "accuracy": acc, "malformed": 0.0}
                                     for s in range(10)]})
    return runs


def test_records_go_through_claims_json_and_back_and_follow_the_schema():
    rs = run_claims(_dcpo_runs(0.1), "toy_lm")
    data = json.loads(json_text([rs]))  # one record a line
    assert len(json_text([rs]).splitlines()) == len(rs.records) + 4
    _validate(data)
    from harness.reports.claim_record import from_json
    assert to_json(from_json(data)) == data
    rec = next(r for r in rs.records if r.claim.id == "dcpo_reward")
    row = next(c for c in data["run_sets"][0]["claims"] if c["claim"] == "dcpo_reward")
    assert row["kind"] == "reproduced" and row["discovery"]["estimate"]["test"] == "paired"
    assert row["discovery"]["estimate"]["value"] == pytest.approx(rec.discovery.estimate.value)
    assert row["replication"]["seeds"] == "5-9" and row["source"]["arxiv"] == "2509.02333"
    # the regime card on the ternary runs of the discovery seeds: headroom = 1 - their accuracy at the end
    assert [c["entry"] for c in row["conditions"]] == ["headroom"] and row["conditions"][0]["value"] == \
        pytest.approx(1 - np.mean([r["records"][0]["accuracy_exact"] for r in _dcpo_runs(0.1)[:10:2]]))
    missing = next(c for c in data["run_sets"][0]["claims"] if c["claim"] == "gspo_clips")
    assert missing["kind"] == "not measured" and missing["command"].startswith("cliplab sim --algos grpo,gspo")
    with pytest.raises(Exception):  # the schema refuses a kind outside the closed set
        _validate({**data, "run_sets": [{**data["run_sets"][0], "claims": [{**row, "kind": "mostly"}]}]})


@pytest.mark.parametrize("report", ["real", "tiny", "sim"])
def test_the_committed_claims_json_follow_the_schema(report):
    path = REPORTS / report / "claims.json"
    _validate(json.loads(path.read_text()))
    run_sets = read_claims(path)
    assert run_sets and all(r.claim.id and r.kind in Kind for s in run_sets for r in s.records)


def test_a_claims_json_that_is_not_one_is_a_one_line_error(tmp_path):
    path = tmp_path / "claims.json"
    path.write_text('{"version": 1, "run_sets": [{"name": "x"}]}')
    with pytest.raises(ValueError, match=r"^.*claims.json: not a claims.json of this version"):
        read_claims(path)


@pytest.mark.parametrize("report", ["real", "tiny"])
def test_each_reason_is_one_short_sentence(report):
    """The reason stands in a table line; the numbers and the attribution go to the details."""
    for s in read_claims(REPORTS / report / "claims.json"):
        for r in s.records:
            assert 0 < len(r.reason.split()) <= 30 and "\n" not in r.reason, (r.claim.id, r.reason)


#: What a rendered report must not hold: an entity where the character itself reads right, an internal reference,
#: a path outside the repository (a "Produced by" line that would not regenerate it from a clone).
ARTEFACTS = (re.compile(r"&gt;|&lt;[\s\d]|-&gt;"), re.compile(r"\b(issue|round) \d+\b", re.I),
             re.compile(r"(?<![\w.])/(tmp|home|work|root)/"))


def hygiene(text: str) -> list[str]:
    """The escape artefacts, internal references and outside paths in a markdown text, and a ``\\|`` outside a
    table."""
    found = [m.group(0) for pattern in ARTEFACTS for m in pattern.finditer(text)]
    fence = False
    for line in text.splitlines():
        fence ^= line.startswith("```")
        if not fence and not line.startswith("|") and "\\|" in line:
            found.append(line[:80])
    return found


#: Every committed report (run folders' notes aside).
COMMITTED = sorted(p.relative_to(REPORTS).as_posix() for p in REPORTS.rglob("*.md")
                   if not {"runs", "runs_vllm", "evidence"} & set(p.relative_to(REPORTS).parts))


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_reports_have_no_escape_artefacts_or_internal_references(name):
    assert hygiene((REPORTS / name).read_text()) == []


def test_the_simulator_report_links_each_claim_to_its_details_and_folds_the_unmeasured(tmp_path, monkeypatch):
    """A 3-step bandit sweep, reported from inside the working folder: "Produced by" names the sweep relative to it;
    one line per measured record, the others in the folded list with their command; each link has its section."""
    from harness.reports.rundirs import load_runs
    from harness.reports.sim import claims_text, write_report
    from sim.sweep import run_sweep
    monkeypatch.chdir(tmp_path)
    run_sweep("bandit", ["grpo", "dcpo"], 2, 3, out=str(tmp_path / "sweep"), workers=1, progress=False)
    with pytest.warns(UserWarning):  # a ranking over 1 seed a set
        out = write_report([tmp_path / "sweep"], tmp_path / "out" / "report.md")
    text = out.read_text()
    fence = text.split("```")[1]
    assert str(tmp_path) not in fence and "cliplab report sweep --out out/report.md" in fence
    assert hygiene(text) == [] and hygiene((out.parent / "claims.md").read_text()) == []
    run_sets = read_claims(out.parent / "claims.json")
    _validate(json.loads((out.parent / "claims.json").read_text()))
    records = [r for s in run_sets for r in s.records]
    section = text.split("## Claims", 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("| [") or ln.startswith("- [")]
    assert len(lines) == len(records)  # one line per claim and regime, measured or folded
    details = (out.parent / "claims.md").read_text()
    for link in re.findall(r"\]\(claims\.md#([\w-]+)\)", section):
        assert f"\n### {link}\n" in details
    folded = [r for r in records if r.kind is Kind.NOT_MEASURED]
    assert folded and all(f"run `{r.command}`" in section for r in folded)
    assert any(s.name == "bandit" and s.records[0].kind is Kind.REPRODUCED for s in run_sets)
    console = claims_text(load_runs([tmp_path / "sweep"]))
    assert "not measured or not testable here" in console and "`" not in console.replace("`cliplab report`", "")


def test_a_hostile_label_in_a_claim_cell_stays_literal_text():
    """A label reaches the claims' cells as it was named: it must stay one cell of plain text, no link, no HTML, no
    code span, and read as typed (an arrow or a comparison is not turned into an entity)."""
    from harness.reports.claim_render import cell, prose
    hostile = "x|y<script>`z`*[a](b)\\ pi_old < 0.2 -> ok"
    text = cell(hostile)
    assert len(re.split(r"(?<!\\)\|", f"| {text} |")) == 3 and "<script" not in text
    assert not re.search(r"(?<!\\)[`*]|(?<!\\)\]\(", text)
    assert text.endswith("pi_old < 0.2 -> ok") and "|" in prose(hostile) and "\\|" not in prose(hostile)
