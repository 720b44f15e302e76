"""Reports and the CLI on damaged or hostile run folders: half-written lines, empty seeds, truncated configs, paths
that are files, FIFOs, malformed fields, copied runs, an --out that is a run file; labels and folder names that carry
markdown, HTML or a code fence."""
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


# ---- reliability, round 3: nothing replaced, nothing counted twice, nothing waited on, no markup let through ------
def _cli_proc(*args, timeout=120):
    """The CLI in a child process (a FIFO bug would hang it: the timeout fails the test instead)."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=ROOT, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)


def _verl_run(folder, name="grpo"):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run": name, "algorithm": "grpo", "steps": 2}))
    (folder / "verl.jsonl").write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": 1.0 / s}}) + "\n"
                                               for s in (1, 2)))


def test_report_out_never_replaces_a_run_file_or_a_log(sweep, tmp_path):
    metrics = sweep / "runs" / "grpo__seed0" / "metrics.jsonl"
    before = metrics.read_bytes()
    code, out = _cli("report", sweep, "--out", metrics)
    assert code == 2 and out == f"error: out: {metrics} is not a .md file; expected a markdown file path (a report " \
                                "never replaces another file)"
    _verl_run(tmp_path / "cluster" / "grpo")
    log = tmp_path / "cluster" / "grpo" / "verl.jsonl"
    logged = log.read_bytes()
    code, out = _cli("report", tmp_path / "cluster", "--out", log)
    assert code == 2 and out.startswith(f"error: out: {log} is not a .md file")
    named = tmp_path / "log.md"  # a log named .md, given as the file to report on
    named.write_bytes(logged)
    code, out = _cli("report", named, "--out", named)
    assert code == 2 and out == f"error: out: {named} is one of the files to report on; expected a new markdown " \
                                "file path"
    assert metrics.read_bytes() == before and log.read_bytes() == logged and named.read_bytes() == logged


def test_a_copied_or_symlinked_run_folder_counts_once_with_a_warning(tmp_path):
    runs = tmp_path / "sweep" / "runs"
    _sim_run(runs / "grpo__seed0", "grpo", 0, [0.0, 0.25])
    _sim_run(runs / "grpo__seed1", "grpo", 1, [1.0, 0.75])
    import shutil
    shutil.copytree(runs / "grpo__seed0", runs / "grpo__seed0_copy")
    (runs / "grpo__seed1_link").symlink_to(runs / "grpo__seed1", target_is_directory=True)
    with pytest.warns(UserWarning, match="counted once") as caught:
        text = write_report([tmp_path / "sweep"], tmp_path / "r.md", bandit=False).read_text()
    assert sorted(str(w.message).split(":")[0] for w in caught if "counted once" in str(w.message)) == \
        [str(runs / "grpo__seed0_copy"), str(runs / "grpo__seed1_link")]
    assert _row(text, "grpo")[1:3] == ["2", "0.5"]  # 2 seeds; last-step accuracy (0.25 + 0.75) / 2


def test_a_fifo_where_a_file_should_be_is_a_one_line_error_not_a_hang(tmp_path):
    cases = {}
    for name in ("metrics.jsonl", "config.json"):  # the simulator's run files
        run = tmp_path / name / "runs" / "r0"
        _sim_run(run, "grpo", 0, [0.5])
        (run / name).unlink()
        os.mkfifo(run / name)
        cases[tmp_path / name] = run / name
    _sim_run(tmp_path / "sweepjson" / "runs" / "r0", "grpo", 0, [0.5])
    os.mkfifo(tmp_path / "sweepjson" / "sweep.json")
    cases[tmp_path / "sweepjson"] = tmp_path / "sweepjson" / "sweep.json"
    (tmp_path / "verl" / "grpo").mkdir(parents=True)  # a cluster log, and a .jsonl that is sniffed for verl's format
    os.mkfifo(tmp_path / "verl" / "grpo" / "verl.jsonl")
    cases[tmp_path / "verl"] = tmp_path / "verl" / "grpo" / "verl.jsonl"
    _verl_run(tmp_path / "sniffed" / "grpo")
    os.mkfifo(tmp_path / "sniffed" / "other.jsonl")
    for folder, fifo in cases.items():
        proc = _cli_proc("report", folder, "--out", tmp_path / "r.md")
        assert proc.returncode == 2 and proc.stderr == f"error: {fifo}: not a regular file; expected a file to read\n"
    proc = _cli_proc("report", tmp_path / "sniffed", "--out", tmp_path / "r.md")
    assert proc.returncode == 0, proc.stderr  # the FIFO is skipped, the run beside it reported


@pytest.mark.parametrize("where, content, message", [
    ("metrics.jsonl", '{"step": 1, "accuracy": 0.5}\n{"step": 2, "accuracy": "high"}\n',
     "metrics.jsonl: record 2 (step 2), accuracy: expected a number or null, got 'high'"),
    ("metrics.jsonl", b'{"step": 1}\n{"step": 2, "accuracy": 0.5}\n{"step": 3, "x": "\xff"}\n',
     "metrics.jsonl: line 3, column 19: byte 0xff is not UTF-8"),
    ("config.json", '{"algo": "grpo", "seed": 0, "params": "lr=0.1"}',
     "config.json: params: expected an object of settings, got 'lr=0.1'"),
    ("config.json", '{"algo": "grpo", "seed": "zero"}', "config.json: seed: expected an integer, got 'zero'"),
    ("config.json", '{"algo": "grpo", "seed": 0, "label": 5}', "config.json: label: expected a string, got 5"),
    ("config.json", '{"algo": ["grpo"], "seed": 0}', "config.json: algo: expected an algorithm name, got ['grpo']"),
    ("config.json", '{"algo": {"name": 3, "hp": {}}}', "config.json: algo.name: expected an algorithm name, got 3"),
])
def test_malformed_run_files_are_one_line_errors_naming_the_file_and_field(tmp_path, where, content, message):
    run = tmp_path / "runs" / "r0"
    _sim_run(run, "grpo", 0, [0.5])
    (run / where).write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out = _cli("report", tmp_path, "--out", tmp_path / "r.md")
    assert code == 2 and out == f"error: {run}/{message}"


@pytest.mark.parametrize("name, content, message", [
    ("trainer_state.json", {"log_history": [{"step": "one", "reward": 1.0}]},
     "log_history[0].step: expected an integer, got 'one'"),
    ("trainer_state.json", {"log_history": [{"step": 1, "reward": 1.0}], "global_step": "1", "max_steps": 5},
     "global_step: expected an integer, got '1'"),
    ("trainer_state.json", {"log_history": ["step 1"]}, "log_history[0]: expected an object, got 'step 1'"),
    ("trainer_state.json", b'{"log_history": []}\n\xfe', "line 2, column 1: byte 0xfe is not UTF-8"),
    ("run.json", [1, 2], "expected a JSON object, got list"),
    ("run.json", {"run": "grpo", "steps": "ten"}, "steps: expected an integer, got 'ten'"),
])
def test_malformed_cluster_logs_are_one_line_errors_naming_the_file_and_field(tmp_path, name, content, message):
    run = tmp_path / "grpo"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "reward": 1.0}]}))
    (run / name).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    code, out = _cli("report", tmp_path, "--out", tmp_path / "r.md")
    assert code == 2 and out == f"error: {run / name}: {message}"


def test_nan_literals_symlink_loops_and_empty_folders_still_hold(tmp_path):
    _sim_run(tmp_path / "nan" / "runs" / "r0", "grpo", 0, [0.5])
    (tmp_path / "nan" / "runs" / "r0" / "metrics.jsonl").write_text('{"step": 1, "accuracy": NaN, "clip_frac": '
                                                                    'Infinity}\n{"step": 2, "accuracy": 1.0}\n')
    _sim_run(tmp_path / "loop" / "runs" / "r0", "grpo", 0, [0.5])
    (tmp_path / "loop" / "runs" / "r0" / "up").symlink_to(tmp_path / "loop", target_is_directory=True)
    (tmp_path / "loop" / "self").symlink_to(tmp_path / "loop", target_is_directory=True)
    (tmp_path / "empty").mkdir()
    proc = _cli_proc("report", tmp_path / "nan", "--out", tmp_path / "nan.md")
    assert proc.returncode == 0 and _row((tmp_path / "nan.md").read_text(), "grpo")[1:3] == ["1", "1"]
    proc = _cli_proc("report", tmp_path / "loop", "--out", tmp_path / "loop.md")
    assert proc.returncode == 0 and _row((tmp_path / "loop.md").read_text(), "grpo")[1:3] == ["1", "0.5"]
    proc = _cli_proc("report", tmp_path / "empty", "--out", tmp_path / "empty.md")
    assert proc.returncode == 2 and proc.stderr.startswith("error: dirs: no complete runs") \
        and proc.stderr.count("\n") == 1


HOSTILE_DIR = "run\n```\n<script>x</script> | `tick` [a](b)"


def _fenced(text: str) -> list[list[str]]:
    """The lines of each code fence of ``text`` (a fence opens and closes with a line that starts with ```)."""
    blocks, inside = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if inside is None:
                inside = []
            else:
                blocks.append(inside)
                inside = None
        elif inside is not None:
            inside.append(line)
    assert inside is None, "a fence is left open"
    return blocks


def _bash_words(line: str) -> list[str]:
    """The words bash reads from ``line`` (how a reader would paste the report's command)."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True)
    return out.stdout.decode().split("\0")[:-1]


def test_sim_report_keeps_a_hostile_sweep_folder_inside_its_fence(tmp_path):
    from sim.sweep import run_sweep
    sweep = tmp_path / HOSTILE_DIR
    run_sweep("bandit", ["grpo"], 1, 3, out=str(sweep), workers=1, progress=False)
    text = write_report([sweep], tmp_path / "r.md", bandit=False).read_text()
    (block,) = _fenced(text)
    outside = text.split("```")[0] + text.split("```")[-1]  # a fence shows its text as it is: markup only outside
    assert "<script>" not in outside and "`tick`" not in outside
    assert len(block) == 2 and _bash_words(block[0])[-2:] == ["--out", str(sweep)]
    assert _bash_words(block[1]) == ["cliplab", "report", str(sweep), "--out", str(tmp_path / "r.md")]


def test_cluster_report_escapes_every_folder_name_label_and_note(tmp_path):
    hostile = tmp_path / "logs" / "x|y<script>`z`"
    _verl_run(hostile, name="a|b<img src=x>`c`")
    (hostile / "verl.jsonl").write_text((hostile / "verl.jsonl").read_text() + '{"step": 3, "da')  # cut short
    out = tmp_path / "r.md"
    text = __import__("harness.reports.cluster", fromlist=["write_report"]).write_report([tmp_path / "logs"], out) \
        .read_text()
    outside = text.split("```")[0] + text.split("```")[-1]
    assert "<script>" not in outside and "<img" not in outside and "`c`" not in outside
    runs_row = next(ln for ln in text.splitlines() if ln.startswith("| a"))
    assert len(re.split(r"(?<!\\)\|", runs_row)) == 10  # 8 cells between 9 unescaped pipes
    assert runs_row.startswith(f"| {md('a|b<img src=x>`c`')} | verl | grpo |")
    (block,) = _fenced(text)
    assert _bash_words(block[0]) == ["cliplab", "report", str(tmp_path / "logs"), "--out", str(out)]
    assert f"- {md(str(hostile / 'verl.jsonl'))}: cut short" in text


def test_throughput_and_evidence_reports_escape_names(tmp_path):
    from harness.reports.evidence import algo_table, Evidence
    from harness.reports.throughput import write_report as throughput_report
    bench = {"kind": "cliplab-throughput", "model": "m|<b>", "device": "d`x`", "precision": "bf16", "params": 1e6,
             "grad_checkpointing": False, "flops_per_step": 1e12, "peak_tflops": None, "total_s": 1.0,
             "mfu_scope": "training step only",
             "batch": {"prompts": 1, "group": 2, "prompt_len": 3, "gen_len": 4},
             "rows": [{"algo": "grpo|<i>", "steps": 2, "step_s": 0.5}]}
    (tmp_path / "t.json").write_text(json.dumps(bench))
    text = throughput_report([tmp_path / "t.json"], tmp_path / "t.md").read_text()
    assert "<b>" not in text and "<i>" not in text and "`x`" not in text
    assert next(ln for ln in text.splitlines() if ln.startswith("| grpo")).startswith("| grpo\\|&lt;i&gt; | 2 |")
    from gpu.config import from_dict
    cfg = from_dict({"algo": {"name": "grpo"}, "data": {"system": "s"}}).to_dict()
    run = tmp_path / "ev" / "grpo|<u>" / "seed0"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "accuracy": 0.5}) + "\n")
    header = algo_table(Evidence(tmp_path / "ev"))[0]
    assert header == "| metric | grpo\\|&lt;u&gt; (1) |"
