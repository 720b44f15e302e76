"""Reports and the CLI on damaged or hostile run folders: half-written lines, empty seeds, truncated configs, paths
that are files; labels and folder names that carry markdown."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.reports.real import write_report as real_report
from harness.reports.sim import TABLE, write_report
from harness.reports.rundirs import md
from spec.records import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "x|y<script>`z`*[a](b)\\"


def _sim_run(folder, label, seed, rewards, algo="grpo"):
    """A simulator-style run folder (the report reads config.json's label and metrics.jsonl)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"algo": algo, "seed": seed, "label": label, "params": {}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "reward": r, "accuracy": r,
                                                              "clip_frac": 0.01}) + "\n"
                                                  for i, r in enumerate(rewards)))


def _row(text: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is ``first_cell``, split on unescaped pipes."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {first_cell} |"))
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_read_jsonl_drops_a_half_written_last_line_and_names_a_bad_middle_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    with pytest.warns(UserWarning, match=r"metrics.jsonl: dropped a half-written last line \(line 3"):
        assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        read_jsonl(path)


def test_report_counts_only_the_seeds_with_metrics_and_warns(tmp_path):
    _sim_run(tmp_path / "runs" / "grpo__seed0", "grpo", 0, [])
    _sim_run(tmp_path / "runs" / "grpo__seed1", "grpo", 1, [0.25, 0.75])
    with pytest.warns(UserWarning, match=r"grpo__seed0.metrics.jsonl: no metrics"):
        text = write_report([tmp_path], tmp_path / "r.md", bandit=False).read_text()
    cells = _row(text, "grpo")
    assert cells[1] == "1"  # seeds with data
    assert cells[2] == "0.75"  # accuracy over the last 10% of steps of the one seed with data


def test_report_warns_when_seeds_have_different_lengths(tmp_path):
    _sim_run(tmp_path / "runs" / "grpo__seed0", "grpo", 0, [0.0])
    _sim_run(tmp_path / "runs" / "grpo__seed1", "grpo", 1, [0.5, 1.0])
    with pytest.warns(UserWarning, match="grpo: its seeds have 1 to 2 steps; they are compared over the first 1"):
        text = write_report([tmp_path], tmp_path / "r.md", bandit=False).read_text()
    assert _row(text, "grpo")[1:3] == ["2", "0.25"]


def test_report_reads_a_run_whose_last_line_is_half_written(tmp_path):
    _sim_run(tmp_path / "runs" / "a", "grpo", 0, [0.5, 0.5])
    with (tmp_path / "runs" / "a" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward": 0.')
    with pytest.warns(UserWarning, match="dropped a half-written last line"):
        text = write_report([tmp_path], tmp_path / "r.md", bandit=False).read_text()
    assert _row(text, "grpo")[2] == "0.5"


def test_markdown_escape_keeps_one_cell_and_no_markup():
    cell = md(HOSTILE + "\nnext")
    assert len(re.split(r"(?<!\\)\|", f"| {cell} |")) == 3  # one cell between the two delimiters
    assert "<" not in cell and ">" not in cell and "\n" not in cell
    assert not re.search(r"(?<!\\)[`*\[\]]", cell)  # every backtick, star and bracket escaped
    assert cell.startswith("x\\|y&lt;script&gt;")


def test_sim_report_escapes_a_hostile_label_and_folder_name(tmp_path):
    sweep = tmp_path / "sw|eep<b>"
    _sim_run(sweep / "runs" / "r0", HOSTILE, 0, [0.5, 1.0])
    text = write_report([sweep], tmp_path / "out" / "r.md", bandit=False).read_text()
    assert "<script>" not in text and "<b>" not in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| x")]
    assert len(rows) == 1 and len(_row(text, md(HOSTILE))) == 2 + len(TABLE)  # label, seeds and the metric columns
    assert f"### {md(sweep.name)}" in text
    png = re.search(r"!\[.*\]\(([^)]*)\)", text).group(1)
    assert (tmp_path / "out" / png).is_file() and re.fullmatch(r"[\w.=-]+", png)


def test_real_report_escapes_a_hostile_run_folder_and_config_values(tmp_path):
    from gpu.config import from_dict
    run = tmp_path / "x|y<script>"
    run.mkdir()
    cfg = from_dict({"algo": {"name": "grpo"}, "data": {"system": "s"}}).to_dict()
    cfg["model"]["name"] = "m|<img>"
    (run / "config.json").write_text(json.dumps(cfg))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5, "accuracy": 0.5}) + "\n")
    text = real_report([tmp_path], tmp_path / "out" / "README.md").read_text()
    assert "<script>" not in text and "<img>" not in text
    assert _row(text, md(run.name))[1] == "1"
    assert "- **x\\|y&lt;script&gt;**: model m\\|&lt;img&gt;" in text


@pytest.fixture
def sweep(tmp_path):
    _sim_run(tmp_path / "sweep" / "runs" / "grpo__seed0", "grpo", 0, [0.5, 1.0])
    return tmp_path / "sweep"


def _cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output.strip()


def test_cli_report_errors_name_the_path(sweep, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, out = _cli("report", afile)
    assert code == 2 and out.startswith(f"error: {afile}: unknown log format; expected verl's") and "\n" not in out
    for bad, named in ((afile / "r.md", afile), (sweep, sweep)):  # a file in its folder's way; a folder as file
        code, out = _cli("report", sweep, "--out", bad)
        assert code == 2 and out.startswith(f"error: out: {named} is a f") and "\n" not in out
    (sweep / "runs" / "grpo__seed0" / "config.json").write_text('{"algo": "gr')
    code, out = _cli("report", sweep, "--out", tmp_path / "r.md")
    assert code == 2 and out.startswith("error: ") and "grpo__seed0/config.json: not valid JSON" in out


def test_cli_report_warns_in_one_line_on_a_truncated_metrics_file(sweep, tmp_path):
    with (sweep / "runs" / "grpo__seed0" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "report", str(sweep), "--out", str(tmp_path / "r.md")],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == str(tmp_path / "r.md")
    path = sweep / "runs" / "grpo__seed0" / "metrics.jsonl"
    assert proc.stderr == (f"warning: {path}: dropped a half-written last line (line 3: Unterminated string "
                           "starting at)\n")


def test_cli_sim_out_that_is_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        code, text = _cli("sim", "--env", "bandit", "--algos", "grpo", "--seeds", "1", "--steps", "2", "--out", out)
        assert code == 2 and text.startswith("error: out: ") and "\n" not in text


def test_cli_train_out_dir_that_is_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"run": {"out_dir": str(afile / "run")}, "model": {"name": "tiny"}}))
    for extra in ([], ["--allow-config-change"]):
        code, out = _cli("train", "--config", cfg, *extra)
        assert code == 2 and out == f"error: run.out_dir: {afile} is a file; expected a folder (on the way to " \
                                    f"{afile / 'run'})"


def test_cli_verify_out_that_is_a_folder_fails_before_the_run(tmp_path):
    code, out = _cli("verify", "--out", tmp_path)
    assert code == 2 and out == f"error: out: {tmp_path} is a folder; expected a markdown file path"


def test_cli_turns_an_os_error_into_one_line_naming_the_file(tmp_path, capsys):
    import typer

    from harness.cli import _user_errors
    missing = tmp_path / "no" / "such.md"
    with pytest.raises(typer.Exit) as exit_:
        _user_errors(missing.read_text)
    assert exit_.value.exit_code == 2
    assert capsys.readouterr().err == f"error: {missing}: No such file or directory\n"


def test_cli_demo_and_conform_out_that_is_a_file_fail_before_the_run(tmp_path):
    (tmp_path / "afile").write_text("x")
    for args in (["demo"], ["conform", "trl"]):
        code, out = _cli(*args, "--out", tmp_path / "afile")
        assert code == 2 and out == f"error: out: {tmp_path / 'afile'} is a file; expected a folder"
