"""The ecosystem matrix: one row per reference convention, a symbol per framework (the worst verdict), every distinct
finding of a cell as a numbered footnote linking to its minimal input, and the cells of conventions a framework
does not compute."""
import json
import re

import pytest

from harness.conform.matrix import SYMBOL, matrix_markdown, write_matrix


def finding(name, family="typical", max_err=0.5):
    return {"name": name, "family": family, "max_err": max_err, "cases": 1, "of": 1, "minimal_input": {"rows": 1}}


def row(reference, kind, family="typical", findings=(), call="f", knob="k"):
    return {"algorithm": reference.split("[")[0], "reference": reference, "kind": kind, "family": family,
            "findings": list(findings), "matches": [], "target_errors": [], "knob": knob, "call": call, "cases": 1}


def report(name, rows):
    return {"target": name, "versions": {name: "1.0"}, "how": "called", "rows": rows, "file": name}


def table(text):
    return {line.split(" | ")[0].strip("| `"): [c.strip(" |") for c in line.split(" | ")[1:]]
            for line in text.splitlines() if line.startswith("| `")}


def notes(text):
    return {int(n): body for n, body in re.findall(r'^(\d+)\. <a id="note-\d+"></a>(.*)$', text, re.M)}


def test_a_cell_lists_every_distinct_finding_with_the_worst_symbol():
    clamp = finding("clamps the log-ratio at +-20", "extreme", 3e8)
    a = report("a", [row("dapo", "differs", findings=[finding("matches dapo[agg=token_mean]")], knob="default"),
                     row("dapo", "differs", "extreme", [finding("matches dapo[agg=token_mean]", "extreme"), clamp],
                         knob="default"),
                     row("dapo", "raises", "extreme", [finding("raises ZeroDivisionError on 7 of 30 cases",
                                                               "extreme", None)], knob="eps_high=0.28"),
                     row("gspo", "agrees")])
    b = report("b", [row("dapo", "agrees"), row("grpo[beta=0]", "agrees")])
    text = matrix_markdown([a, b])
    cells, footnotes = table(text), notes(text)
    assert cells["dapo"] == [f"{SYMBOL['raises']} [1](#note-1) [2](#note-2) [3](#note-3)", SYMBOL["agrees"]]
    assert cells["gspo"] == [SYMBOL["agrees"], SYMBOL["not implemented"]]
    assert cells["grpo[beta=0]"] == [SYMBOL["not implemented"], SYMBOL["agrees"]]
    # the same finding on two families of one check is one footnote; each links to its place on the target's page
    assert footnotes[1] == ("**a** `f`, default: matches dapo[agg=token_mean] (typical, extreme; largest difference "
                            "0.5) ([minimal input](a.md#diff-0))")
    assert footnotes[2].startswith("**a** `f`, default: clamps the log-ratio at +-20 (extreme; largest difference "
                                   "3e+08)")
    assert footnotes[2].endswith("(a.md#diff-2))")
    assert footnotes[3].startswith("**a** `f`, eps_high=0.28: raises ZeroDivisionError on 7 of 30 cases (extreme)")
    assert len(footnotes) == 3 and "| a 1.0 | b 1.0 |" in text


def test_other_modes_only_when_the_algorithm_is_checked_elsewhere():
    a = report("a", [row("grpo[agg=token_mean]", "agrees")])
    b = report("b", [row("grpo", "agrees")])
    rows = table(matrix_markdown([a, b]))
    assert rows["grpo"][0] == rows["grpo[agg=token_mean]"][1] == SYMBOL["other modes only"]


def test_write_matrix_reads_reports_and_notes(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(report("a", [row("dapo", "agrees")])))
    (tmp_path / "notes.md").write_text("## In words\n")
    text = write_matrix(tmp_path).read_text()
    assert f"| `dapo` | {SYMBOL['agrees']} |" in text and text.endswith("## In words\n")
    with pytest.raises(ValueError, match="out: no conformance reports"):
        write_matrix(tmp_path / "empty")
