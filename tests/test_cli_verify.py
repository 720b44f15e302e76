"""`cliplab verify` agrees on every algorithm and option and says so as a table and as JSON."""
import json

from typer.testing import CliRunner

from harness.cli import app
from harness.verify.layers import COLUMNS, OPTIONS, PAIRS, PARTS_CHECKED, parts_case
from spec.registry import ALGORITHMS, PARTS


def test_verify_json_names_every_algorithm_and_agrees(tmp_path):
    result = CliRunner().invoke(app, ["verify", "--json", "--seeds", "1", "--out", str(tmp_path / "v.md")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["ok"] is True
    assert all(row["agrees"] for row in data["rows"]) and all(d["holds"] for d in data["derivations"])
    pairs = {(row["algorithm"], row["pair"]) for row in data["rows"]}
    parts = {"grpo_advantage", "dr_grpo_advantage", "rloo_advantage", "gdpo_advantage", "gpg_advantage",
             "reinforce_pp", "sas", "gae", "value_loss", "kl", "dcpo_bounds", "overlong", "dynamic_sampling"}
    assert set(PARTS) - {"rollout_correction", "opsm"} <= parts  # every part has its rows (those two: options)
    assert all((name, pair) in pairs for name in set(ALGORITHMS) | parts for pair in PAIRS)
    rows = {(row["algorithm"], row["pair"]): row for row in data["rows"]}
    for pair in PAIRS:  # gradients measured where the layers give one, n/a (null) where they do not
        assert rows[("value_loss", pair)]["grad_err"] is not None and rows[("dpo", pair)]["grad_err"] is not None
        assert rows[("gae", pair)]["grad_err"] is None
    for name, alg in ALGORITHMS.items():  # one case per applicable option in the exact pair (seed 0)
        if alg.clip != "none":
            assert rows[(name, "spec~sim")]["cases"] == sum(opt.applies(name) for opt in OPTIONS)
    text = (tmp_path / "v.md").read_text()
    assert "| dcpo | spec~sim |" in text and "| gae | sim~gpu32 |" in text and "| n/a |" in text


def test_help_explains():
    result = CliRunner().invoke(app, ["verify", "--help"])
    assert result.exit_code == 0 and "three layers" in result.output


def test_verify_filters_by_algos_and_prints_a_table_a_pipe_can_read():
    result = CliRunner().invoke(app, ["verify", "--algos", "grpo,gae", "--seeds", "1"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][1:]  # below the header
    cells = [line.strip("| ").split(" | ") for line in rows]
    assert {(c[0], c[1]) for c in cells} == {(name, pair) for name in ("grpo", "gae") for pair in PAIRS}
    assert all(len(c) == len(COLUMNS) and c[-1] == "agrees" for c in cells)  # one whole row a line, not wrapped
    assert set(PARTS_CHECKED) == set(parts_case(0))  # every part can be chosen by name


def test_verify_names_the_algorithms_it_knows_for_an_unknown_one():
    result = CliRunner().invoke(app, ["verify", "--algos", "grpo,nope"])
    assert result.exit_code == 2 and "algos: unknown 'nope'; expected names separated by commas among ppo, grpo" \
        in result.output
