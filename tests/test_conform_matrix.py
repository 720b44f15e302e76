"""The ecosystem matrix: one row per reference convention, the worst verdict per framework, links to the minimal
inputs, and the cells of conventions a framework does not compute."""
import json

import pytest

from harness.conform.matrix import matrix_markdown, write_matrix


def row(reference, status, family="typical", minimal=False, matches=()):
    r = {"algorithm": reference.split("[")[0], "reference": reference, "status": status, "family": family,
         "matches": list(matches), "target_errors": [], "knob": "k", "call": "f"}
    if minimal:
        r["minimal"] = {"rows": 1}
    return r


def report(name, rows):
    return {"target": name, "versions": {name: "1.0"}, "how": "called", "rows": rows, "file": name}


def table(text):
    return {line.split(" | ")[0].strip("| `"): line.split(" | ")[1:] for line in text.splitlines()
            if line.startswith("| `")}


def test_worst_verdict_wins_and_links_its_minimal_input():
    a = report("a", [row("dapo", "agrees"), row("dapo", "differs", "extreme", True, ["dapo[agg=token_mean]"]),
                     row("gspo", "differs", minimal=True, matches=["gspo[agg=token_mean]"])])
    b = report("b", [row("dapo", "agrees"), row("grpo[beta=0]", "agrees")])
    rows = table(matrix_markdown([a, b]))
    assert rows["dapo"] == ["differs; matches dapo[agg=token_mean] ([minimal input](a.md#diff-0))", "agrees |"]
    assert rows["gspo"][0] == "differs; matches gspo[agg=token_mean] ([minimal input](a.md#diff-1))"
    assert rows["gspo"][1] == "not implemented |"
    assert rows["grpo[beta=0]"] == ["not implemented", "agrees |"]
    assert "| a 1.0 | b 1.0 |" in matrix_markdown([a, b])


def test_other_modes_only_when_the_algorithm_is_checked_elsewhere():
    a = report("a", [row("grpo[agg=token_mean]", "agrees")])
    b = report("b", [row("grpo", "agrees")])
    rows = table(matrix_markdown([a, b]))
    assert rows["grpo"][0] == "other modes only" and rows["grpo[agg=token_mean]"][1] == "other modes only |"


def test_write_matrix_reads_reports_and_notes(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(report("a", [row("dapo", "agrees")])))
    (tmp_path / "notes.md").write_text("## In words\n")
    text = write_matrix(tmp_path).read_text()
    assert "| `dapo` | agrees |" in text and text.endswith("## In words\n")
    with pytest.raises(ValueError, match="out: no conformance reports"):
        write_matrix(tmp_path / "empty")
