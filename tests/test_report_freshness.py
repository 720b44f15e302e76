"""The committed reports that regenerate from committed data in under a minute are what the code writes now, byte
for byte: the real-model README with its two plots (from reports/real's run folders and the simulator's report and
summaries), and the conformance matrix and step-level findings (from the committed NAME.json reports). The simulator's
report regenerates from sweeps that are not committed (reports/sim/regenerate.sh, minutes); `make reports` rebuilds
every report in order."""
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL, CONFORMANCE = ROOT / "reports" / "real", ROOT / "reports" / "conformance"


def _same(new: Path, committed: Path, how: str) -> None:
    assert new.read_bytes() == committed.read_bytes(), f"{committed.relative_to(ROOT)} is stale: {how}"


def test_the_real_model_readme_and_its_plots_are_fresh(tmp_path):
    from harness.reports.real import write_readme
    shutil.copy(REAL / "README.md", tmp_path / "README.md")  # its text after the KEEP marker is kept as written
    write_readme(tmp_path / "README.md", REAL / "evidence", REAL / "runs", ROOT / "reports" / "sim")
    for name in ("README.md", "README_curves.png", "evidence_curves.png", "claims.json", "claims.md"):
        _same(tmp_path / name, REAL / name, "python -m harness.reports.real")


def test_the_conformance_matrix_and_step_findings_are_fresh(tmp_path):
    from harness.conform.matrix import write_matrix
    from harness.conform.step import findings_page
    folder = tmp_path / "conformance"
    shutil.copytree(CONFORMANCE, folder)
    step = findings_page(folder / "step")  # as `cliplab conform all` writes them, from the reports' JSON
    assert step == (CONFORMANCE / "step" / "README.md").read_text(), \
        "reports/conformance/step/README.md is stale: cliplab conform all --out reports/conformance"
    _same(write_matrix(folder, step.replace("# Step-level", "## Step-level", 1)), CONFORMANCE / "README.md",
          "cliplab conform all --out reports/conformance")
