"""The committed simulator report (reports/sim) against the summaries its sweeps wrote (reports/sim/summaries):
every label's row of the report's summary table is those summaries' numbers; the report states its seed sets,
its multiplicity correction and its ranking at equal generation budget; its plots are readable."""
import json
import re
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "reports" / "sim"
REPORT = (SIM / "report.md").read_text()


def _table_rows() -> dict[str, dict[str, str]]:
    """The report's summary table: label -> {column: cell}."""
    lines = REPORT.split("## Summary per label", 1)[1].splitlines()
    header = next(line for line in lines if line.startswith("| label |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    rows = {}
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].replace("\\", "")] = dict(zip(cols, cells))
    return rows


SUMMARIES = sorted((SIM / "summaries").glob("*.json"))


def test_the_committed_sweeps_ran_20_seeds_in_two_sets():
    assert SUMMARIES
    for path in SUMMARIES:
        for label, row in json.loads(path.read_text())["algorithms"].items():
            assert row["seeds"] == 20, (path.name, label)
    assert "Discovery seeds 0-9" in REPORT and "replication seeds 10-19" in REPORT


@pytest.mark.parametrize("path", SUMMARIES, ids=lambda p: p.stem)
def test_the_report_table_is_the_committed_summaries(path):
    rows = _table_rows()
    sweep = json.loads(path.read_text())
    for label, summary in sweep["algorithms"].items():
        row = rows[f"{sweep['env']}: {label}"]  # the report names the environment (it has two)
        for key in ("accuracy", "accuracy_exact", "entropy_final", "clip_frac", "rur", "gen_per_trained"):
            value = summary[key]
            if value is None:
                assert row[key] == "n/a", (label, key)
            else:
                assert float(row[key]) == pytest.approx(value, rel=5e-3, abs=1e-9), (label, key)


def test_the_report_states_holm_detectable_effects_and_a_ranking_at_equal_budget():
    assert "Holm" in REPORT and "smallest detectable effect" in REPORT
    assert "no effect" not in REPORT.replace("no effect\"", "")
    for env in ("feature_lm", "toy_lm"):
        assert f"### {env}: ranking at equal generation budget" in REPORT


def test_the_plots_are_readable():
    images = [m for m in re.findall(r"\]\((report_[^)]+\.png)\)", REPORT)]
    assert images
    for name in images:
        with Image.open(SIM / name) as im:
            dpi = im.info.get("dpi", (0, 0))[0]
            assert dpi >= 99, name
            assert im.size[0] >= 1000, name
