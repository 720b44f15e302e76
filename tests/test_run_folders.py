"""Output folders keep to one kind and reports count each run once; work that cannot succeed is refused before it
starts: a sweep, a training run and a report in each other's folders, a rerun that moves seeds between sets, two
sweeps of one label and seeds, rankings over too few seeds, grids past the cap, settings past the machine's memory,
the demo's arguments, a terminal log saved in a sweep folder."""
import json
import os
import shutil
import time
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.reports.rundirs import load_runs, output_file
from harness.reports.ranking import rankings
from harness.reports.sim import ranking_lines
from harness.runs.sim import format_ranking
from sim import sweep
from sim.sweep import plan, run_sweep

def _sweep(out, seeds=2, steps=3, algos=("grpo",)):
    return run_sweep("bandit", list(algos), seeds, steps, out=str(out), workers=1, progress=False)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_sweep_a_training_run_and_a_report_refuse_each_others_folders(tmp_path):
    from gpu import checkpoint
    sweep_dir, run_dir, report_dir = tmp_path / "sweep", tmp_path / "run", tmp_path / "report"
    other_sweep = tmp_path / "sweep2"
    _sweep(sweep_dir)
    _sweep(other_sweep)
    run_dir.mkdir()
    os.close(checkpoint.own(run_dir))  # what a training run takes first in run.out_dir (gpu.train.Trainer)
    output_file(report_dir / "r.md", inputs=[sweep_dir])  # what a report of the sweep takes first
    held = {d: _names(d) for d in (sweep_dir, other_sweep, run_dir, report_dir)}

    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({"run": {"out_dir": str(sweep_dir)}, "model": {"name": "tiny"}}))
    result = CliRunner().invoke(app, ["train", "--config", str(config)])
    assert result.exit_code == 2 and result.output.strip() == (
        f"error: run.out_dir: {sweep_dir} already holds a simulator sweep (sweep.lock); one kind of output a folder: "
        "use another run.out_dir")
    with pytest.raises(ValueError, match=f"^run.out_dir: {report_dir} already holds a report "):
        checkpoint.own(report_dir)
    for other, kind in ((run_dir, "a training run"), (report_dir, "a report")):
        with pytest.raises(ValueError, match=f"^out: {other} already holds {kind} "):
            _sweep(other)
    for other, kind in ((run_dir, "a training run"), (other_sweep, "a simulator sweep")):
        with pytest.raises(ValueError, match=f"^out: {other} already holds {kind} "):
            output_file(other / "r.md", inputs=[sweep_dir])
    assert {d: _names(d) for d in held} == held  # nothing written into a folder of another kind
    output_file(sweep_dir / "report.md", inputs=[sweep_dir])  # a sweep's own report, in its folder
    assert _names(sweep_dir) == held[sweep_dir]


def test_a_rerun_that_moves_a_seed_to_the_other_set_is_refused(tmp_path):
    _sweep(tmp_path, "0-1:2-3")
    configs = {p: p.read_text() for p in tmp_path.glob("runs/*/config.json")}
    with pytest.raises(ValueError, match=r"^seeds: .* holds a sweep with --seeds 0-1:2-3 \(discovery:replication\); "
                                         r"--seeds 2-3:0-1 moves seed 2 from the replication to the discovery set"):
        _sweep(tmp_path, "2-3:0-1")
    assert {p: p.read_text() for p in tmp_path.glob("runs/*/config.json")} == configs
    assert [c["seeds"] for c in json.loads((tmp_path / "sweep.json").read_text())["commands"]] == ["0-1:2-3"]
    _sweep(tmp_path, "0-1,4:2-3,5")  # more seeds, each old one in its set: accepted
    sets = {json.loads(p.read_text())["seed"]: json.loads(p.read_text())["set"]
            for p in tmp_path.glob("runs/*/config.json")}
    assert sets == {0: "discovery", 1: "discovery", 4: "discovery", 2: "replication", 3: "replication",
                    5: "replication"}


def test_two_sweeps_of_one_label_and_seeds_are_kept_apart_and_a_copy_counts_once(tmp_path):
    short, long_ = tmp_path / "steps3", tmp_path / "steps4"
    _sweep(short, 2, 3)
    _sweep(long_, 2, 4)
    with pytest.warns(UserWarning, match=f"^grpo: seeds 0-1 in more than one of {short}, {long_}; kept apart"):
        runs = load_runs([short, long_])
    by_label = {}
    for r in runs:
        by_label.setdefault(r["label"], []).append(r["seed"])
    assert by_label == {f"grpo ({short})": [0, 1], f"grpo ({long_})": [0, 1]}  # 2 seeds each, not 4 of one

    copy = tmp_path / "copy"
    shutil.copytree(short, copy)
    with pytest.warns(UserWarning, match="counted once"):
        runs = load_runs([short, copy])
    assert sorted((r["label"], r["seed"]) for r in runs) == [("grpo", 0), ("grpo", 1)]
    more = tmp_path / "more"  # other seeds of the same settings: pooled
    run_sweep("bandit", ["grpo"], "2-3", 3, out=str(more), workers=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = load_runs([short, more])
    assert sorted((r["label"], r["seed"]) for r in runs) == [("grpo", s) for s in range(4)]

    twice = short / "runs" / "grpo__seed0_again"  # one seed twice in one folder, with other metrics
    shutil.copytree(long_ / "runs" / "grpo__seed0", twice)
    with pytest.raises(ValueError, match=f"^{twice}: grpo seed 0 again, with other config or metrics than "):
        load_runs([short])


def test_a_ranking_over_fewer_than_five_seeds_shows_no_interval_and_warns(tmp_path):
    _sweep(tmp_path, 2, 3, algos=("grpo", "dr_grpo"))
    with pytest.warns(UserWarning, match=r"^ranking: 1 seed\(s\) in a set, fewer than 5; its intervals read n/a"):
        text = format_ranking(load_runs([tmp_path]))
    with pytest.warns(UserWarning, match="^ranking: 1 seed"):
        table = "\n".join(ranking_lines(rankings(load_runs([tmp_path]))))
    for shown in (text, table):
        assert "n/a (too few seeds)" in shown and "nan" not in shown and "± 0" not in shown


def test_a_grid_past_the_cap_is_refused_before_any_point_is_planned():
    grid = {"lr": [round(0.001 * (i + 1), 3) for i in range(400)], "epochs": list(range(1, 401))}
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"^set: the grid lr \(400 values\) x epochs \(400 values\) makes 160,000 "
                                         r"runs with 1 algorithm\(s\) and 1 seeds; expected at most 100,000"):
        plan("bandit", ["grpo"], 1, 3, grid)
    assert time.perf_counter() - start < 0.5
    assert len(plan("bandit", ["grpo"], 1, 3, {"lr": grid["lr"]})) == 400  # under the cap


def test_settings_past_the_machines_memory_are_refused_before_the_folder_is_touched(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "available_bytes", lambda: 64 * 2 ** 30)
    big = {"n_prompts": [10 ** 5], "batch_prompts": [10 ** 5], "group_size": [4096]}
    with pytest.raises(ValueError, match=r"^settings: batch_prompts=100000, group_size=4096, max_len=16 need at "
                                         r"least 195.3 GiB .*; this machine has 64.0 GiB available"):
        run_sweep("toy_lm", ["grpo"], 1, 2, big, out=str(tmp_path / "big"), workers=1, progress=False)
    assert not (tmp_path / "big").exists()
    # the bound: four 8-byte [responses, max_len] arrays a seed, the largest `workers` jobs at once
    jobs = sweep.jobs(plan("toy_lm", ["grpo", "dapo"], 2, 2, {"batch_prompts": [100], "group_size": [64]}), 2)
    need = 32 * 64 * 16 * (100 * 2 + 100 * 2)  # dapo's rounds draw ds_oversample (1.0) x batch_prompts prompts
    assert sum(sweep.job_bytes(job)[0] for job in jobs) == need
    monkeypatch.setattr(sweep, "available_bytes", lambda: need)
    sweep.check_memory(jobs, 2)
    monkeypatch.setattr(sweep, "available_bytes", lambda: need - 1)
    with pytest.raises(ValueError, match=r"^settings: batch_prompts=100, group_size=64, .*max_len=16 need at least "
                                         r"12.5 MiB \(2 job\(s\) at once.*; this machine has 12.5 MiB available"):
        sweep.check_memory(jobs, 2)
    sweep.check_memory(jobs, 1)  # one job at a time fits


def test_demo_arguments_are_checked_before_verify_runs(tmp_path, monkeypatch):
    import harness.cli
    monkeypatch.setattr(harness.cli, "_verify_rows", lambda **_: pytest.fail("verify ran before the check"))
    for args, message in ((["--sim-steps", "0"], "error: sim-steps: expected a positive integer, got 0"),
                          (["--train-steps", "-1"], "error: train-steps: expected an integer in [1, 2147483647], "
                                                    "got -1")):
        result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "demo"), *args])
        assert result.exit_code == 2 and result.output.strip() == message


def test_a_terminal_log_saved_in_a_sweep_folder_is_noted_not_read_as_a_run(tmp_path):
    _sweep(tmp_path / "sweep", 2, 3, algos=("grpo", "dr_grpo"))
    log = tmp_path / "sweep" / "console.log"
    log.write_text("sim bandit: 100%|##########| 4/4\n")
    with pytest.warns(UserWarning) as caught:
        result = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--out", str(tmp_path / "r.md")])
    assert result.exit_code == 0, result.output
    assert f"{log}: not a run of a simulator sweep; left out of the report" in [str(w.message) for w in caught]
    assert "| grpo | 2 |" in (tmp_path / "r.md").read_text()


def test_one_label_in_two_environments_is_not_kept_apart_by_folder(tmp_path):
    run_sweep("bandit", ["grpo"], 2, 3, out=str(tmp_path / "bandit"), workers=1, progress=False)
    run_sweep("toy_lm", ["grpo"], 2, 3, out=str(tmp_path / "toy_lm"), workers=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = load_runs([tmp_path / "bandit", tmp_path / "toy_lm"])
    assert sorted((r["env"], r["label"], r["seed"]) for r in runs) == [
        ("bandit", "grpo", 0), ("bandit", "grpo", 1), ("toy_lm", "grpo", 0), ("toy_lm", "grpo", 1)]


def test_train_runs_of_one_label_with_other_settings_in_one_folder_are_not_pooled_as_seeds(tmp_path):
    """configs/tiny's grpo and grpo_sharpening: the same algorithm and hyper-parameters, another model."""
    for config, model in (("grpo", "tiny_char"), ("grpo_sharpening", "tiny_char_sharpening")):
        for seed in (0, 1):
            d = tmp_path / config / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "config.json").write_text(json.dumps({
                "algo": {"name": "grpo"}, "model": {"name": model}, "train": {"epochs": 4}, "seed": seed,
                "run": {"seed": seed, "out_dir": str(d), "steps": 2, "progress": seed == 1}}))
            (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "accuracy": 0.1 * seed}) + "\n")
    with pytest.warns(UserWarning, match=r"^grpo: runs with other settings in .* \(grpo; grpo_sharpening\); kept "
                                         r"apart, one label a setting"):
        runs = load_runs([tmp_path])
    counts = {}
    for r in runs:
        counts[r["label"]] = counts.get(r["label"], 0) + 1
    assert counts == {"grpo (grpo)": 2, "grpo (grpo_sharpening)": 2}  # each config's seeds, a display flag aside
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert {r["label"] for r in load_runs([tmp_path / "grpo"])} == {"grpo"}  # one setting: its plain label
