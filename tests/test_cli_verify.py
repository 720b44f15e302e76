"""`cliplab verify` agrees on every algorithm and says so as a table and as JSON."""
import json

from typer.testing import CliRunner

from harness.cli import app
from spec.registry import ALGORITHMS


def test_verify_json_names_every_algorithm_and_agrees(tmp_path):
    result = CliRunner().invoke(app, ["verify", "--json", "--seeds", "1", "--out", str(tmp_path / "v.md")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["ok"] is True
    assert set(ALGORITHMS) <= {row["algorithm"] for row in data["rows"]}
    assert all(row["agrees"] for row in data["rows"]) and all(d["holds"] for d in data["derivations"])
    pairs = {(row["algorithm"], row["pair"]) for row in data["rows"]}
    assert all((name, pair) in pairs for name in ALGORITHMS for pair in ("spec~sim", "sim~gpu64", "sim~gpu32"))
    assert "| dcpo | spec~sim |" in (tmp_path / "v.md").read_text()


def test_help_explains():
    result = CliRunner().invoke(app, ["verify", "--help"])
    assert result.exit_code == 0 and "three layers" in result.output
