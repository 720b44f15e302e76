"""Sweeps: resume after a killed run equals an uninterrupted sweep; summary; CLI function; report; the lock file,
reruns with other algorithms, grid values listed twice, a worker killed alone, Ctrl-C."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from harness.reports.claim_record import SCHEMA
from harness.reports.claims import CLAIMS
from harness.reports.sim import write_report
from harness.runs.sim import parse_algos, sim_command
from sim.config import parse_seeds, parse_sets
from sim.loop import run
from sim.sweep import jobs, plan, run_id, run_sweep

ROOT = Path(__file__).resolve().parents[1]
ALGOS, SEEDS, STEPS = ["grpo", "dcpo"], 2, 60


def _files(out: Path) -> dict:
    return {p.relative_to(out).as_posix(): p.read_text() for p in sorted((out / "runs").rglob("*")) if p.is_file()}


def _written(path) -> bool:
    """A part file with content; False if the run finished (and renamed it) between the glob and this look."""
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def test_resume_after_a_killed_sweep_equals_an_uninterrupted_one(tmp_path):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run_sweep("toy_lm", ALGOS, SEEDS, STEPS, out=str(whole), workers=2, progress=False)
    code = (f"from sim.sweep import run_sweep; run_sweep('toy_lm', {ALGOS!r}, {SEEDS}, {STEPS}, "
            f"out={str(broken)!r}, workers=1, progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.time() + 120
    try:
        while time.time() < deadline:  # kill once one run is done and the next is part-written
            done = list(broken.glob("runs/*/done.json"))
            parts = [p for p in broken.glob("runs/*/metrics.jsonl.part") if _written(p)]
            if done and parts:
                break
            assert proc.poll() is None, "the sweep finished before it could be killed"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert 1 <= len(list(broken.glob("runs/*/done.json"))) < len(ALGOS) * SEEDS
    killed = {p.parent.name: p.read_text() for p in broken.glob("runs/*/done.json")}

    summary = run_sweep("toy_lm", ALGOS, SEEDS, STEPS, out=str(broken), workers=1, progress=False)
    assert _files(broken) == _files(whole)  # same runs, same bytes: nothing lost, nothing repeated
    for name, text in killed.items():  # runs done before the crash were kept, not rerun
        assert (broken / "runs" / name / "done.json").read_text() == text
    assert summary == json.loads((whole / "summary.json").read_text())
    for f in (broken / "runs").rglob("*"):
        assert not f.name.endswith((".part", ".tmp"))
    for f in (broken / "runs").glob("*/metrics.jsonl"):
        assert len(f.read_text().splitlines()) == STEPS


def test_summary_is_the_mean_over_seeds_of_the_runs(tmp_path):
    summary = run_sweep("bandit", ["grpo"], 3, 20, {"lr": [0.05, 0.1]}, out=str(tmp_path), workers=1,
                        progress=False)
    assert set(summary["algorithms"]) == {"grpo[lr=0.05]", "grpo[lr=0.1]"}
    for label, row in summary["algorithms"].items():
        runs = [json.loads(c.read_text()) for c in tmp_path.glob("runs/*/config.json")]
        folders = [tmp_path / "runs" / f"{label.replace('[', '_').replace(']', '_')}__seed{s}" for s in range(3)]
        clip = [np.mean([json.loads(x)["clip_frac"] for x in (f / "metrics.jsonl").read_text().splitlines()])
                for f in folders]
        final_entropy = [json.loads((f / "metrics.jsonl").read_text().splitlines()[-1])["entropy"] for f in folders]
        assert row["seeds"] == 3 and len(runs) == 6
        assert row["clip_frac"] == pytest.approx(np.mean(clip))
        assert row["entropy_final"] == pytest.approx(np.mean(final_entropy))
        for key in ("reward", "accuracy", "entropy_final", "clip_frac", "rur", "zero_grad_frac", "gen_per_trained"):
            assert key in row


def test_resuming_into_a_different_sweep_is_refused(tmp_path):
    run_sweep("bandit", ["grpo"], 1, 3, out=str(tmp_path), workers=1, progress=False)
    with pytest.raises(ValueError, match="^out:"):
        run_sweep("bandit", ["grpo"], 1, 4, out=str(tmp_path), workers=1, progress=False)


def test_bad_sweep_settings_fail_before_running(tmp_path):
    with pytest.raises(ValueError, match="^set:"):
        sim_command("toy_lm", "grpo", 1, 2, ["not_a_key=1"], str(tmp_path), workers=1, progress=False)
    with pytest.raises(ValueError, match="^algos:"):
        parse_algos("grpo,reinforce")
    with pytest.raises(ValueError, match="^seeds:"):
        sim_command("toy_lm", "grpo", 0, 2, [], str(tmp_path), workers=1, progress=False)
    assert not list(tmp_path.glob("runs/*"))
    assert parse_algos("all")[-1] == "dpo"


def test_sim_command_json_and_report(tmp_path, capsys):
    out = tmp_path / "sweep"
    sim_command("toy_lm", "grpo,dcpo,gspo", 2, 12, [], str(out), json_out=True, workers=1, progress=False)
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"algorithms", "ranking", "claims"} and set(printed["algorithms"]) == {"grpo", "dcpo", "gspo"}
    jsonschema.validate(printed["claims"], SCHEMA)  # the claim records, as claims.json holds them
    assert {c["claim"] for s in printed["claims"]["run_sets"] for c in s["claims"]} == {c.id for c, _ in CLAIMS}
    md = write_report([out], tmp_path / "report" / "report.md", bandit=False)
    text = md.read_text()
    for claim, _ in CLAIMS:
        assert claim.text in text
    assert "not measured" in text  # the eps_high and SAPO ablations were not run
    assert "reproduced" in text or "partly" in text
    pngs = list(md.parent.glob("*.png"))
    assert pngs and all(p.stat().st_size < 400_000 for p in pngs)
    assert "--algos grpo,dcpo,gspo --seeds 0:1 --steps 12" in text


def test_report_reads_real_model_run_folders(tmp_path):
    """The gpu harness writes <run>/config.json (algo = {name, hp}) and metrics.jsonl with its own metric names."""
    for algo, tcr in (("grpo", 0.01), ("gspo", 0.2)):
        for seed in range(2):
            run = tmp_path / f"{algo}_{seed}"
            run.mkdir()
            (run / "config.json").write_text(json.dumps({"algo": {"name": algo, "hp": {}}, "seed": seed}))
            lines = [json.dumps({"tcr": tcr * (1 + 0.1 * seed), "len_mean": 10.0 + step, "entropy": 1.0 - 0.01 * step,
                                 "reward_mean": 0.5, "rur": 0.5}) for step in range(20)]
            (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    md = write_report([tmp_path], tmp_path / "out" / "report.md", bandit=False)
    text = md.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| [GSPO clips far more"))
    assert "TCR, GSPO / GRPO (x): 20" in row and "**partly**" in row  # the ratio, and its numbers in the details
    details = (md.parent / "claims.md").read_text()
    assert "GSPO 21%" in details and "GRPO 1.05%" in details


def test_keep_heap_reuses_memory_for_large_temporaries():
    import resource
    from sim.sweep import keep_heap
    from sim.tabular import tables
    keep_heap()
    z = np.random.default_rng(0).standard_normal((1288, 128))  # a feature_lm evaluation's logit table (1.3 MB)
    for _ in range(3):
        tables(z)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        tables(z)
    # without it every call maps and zero-fills fresh pages for its 1.3 MB arrays: about 1,250 faults a call
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 500


# ---- reliability, round 3: the lock, reruns with other algorithms, duplicate grid values, a dead worker ----------
def test_a_lock_that_is_a_link_or_not_a_file_is_refused_and_left_as_it_is(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    for name, make in (("symlink", lambda p: p.symlink_to(target)), ("hardlink", lambda p: os.link(target, p)),
                       ("fifo", os.mkfifo), ("folder", os.mkdir)):
        out = tmp_path / name
        out.mkdir()
        make(out / "sweep.lock")
        with pytest.raises(ValueError, match=rf"^out: cannot use {out}/sweep.lock as the sweep's lock \(.*\); "
                                             "remove it$"):
            run_sweep("bandit", ["grpo"], 1, 2, out=str(out), workers=1, progress=False)
        assert not (out / "runs").exists()
    assert target.read_text() == "keep me\n"


def test_a_rerun_with_other_algorithms_keeps_the_first_ones_and_every_command(tmp_path):
    first = run_sweep("bandit", ["grpo"], 2, 5, out=str(tmp_path), workers=1, progress=False)
    run_sweep("bandit", ["grpo"], 2, 5, out=str(tmp_path), workers=1, progress=False)  # the same command: resumed
    both = run_sweep("bandit", ["dcpo"], 1, 5, {"lr": [0.05]}, out=str(tmp_path), workers=1, progress=False)
    assert list(both["algorithms"]) == ["dcpo[lr=0.05]", "grpo"]  # this command's labels first
    assert both["algorithms"]["grpo"] == first["algorithms"]["grpo"]
    assert both["algorithms"]["dcpo[lr=0.05]"]["seeds"] == 1
    assert json.loads((tmp_path / "summary.json").read_text()) == both
    assert json.loads((tmp_path / "sweep.json").read_text())["commands"] == [
        {"algos": ["grpo"], "seeds": "0:1", "grid": {}}, {"algos": ["dcpo"], "seeds": "0-0", "grid": {"lr": [0.05]}}]
    # the seeds as their discovery:replication sets, which rerun the same runs
    text = write_report([tmp_path], tmp_path / "report.md", bandit=False).read_text()
    cmds = text.split("```")[1].strip().splitlines()
    assert cmds == [f"cliplab sim --env bandit --algos grpo --seeds 0:1 --steps 5 --out {tmp_path}",
                    f"cliplab sim --env bandit --algos dcpo --seeds 0-0 --steps 5 --set lr=0.05 --out {tmp_path}",
                    f"cliplab report {tmp_path} --out {tmp_path / 'report.md'}"]


def test_a_sweep_json_written_before_the_history_reads_as_one_command(tmp_path):
    run_sweep("bandit", ["grpo"], 1, 3, out=str(tmp_path), workers=1, progress=False)
    (tmp_path / "sweep.json").write_text(json.dumps({"env": "bandit", "steps": 3, "seeds": 1, "algos": ["grpo"],
                                                     "grid": {}}))
    run_sweep("bandit", ["gspo"], 1, 3, out=str(tmp_path), workers=1, progress=False)
    assert [c["algos"] for c in json.loads((tmp_path / "sweep.json").read_text())["commands"]] == [["grpo"], ["gspo"]]
    (tmp_path / "sweep.json").write_text(json.dumps({"env": "bandit", "steps": 3, "commands": {"algos": "grpo"}}))
    with pytest.raises(ValueError, match=r"sweep.json: commands: expected a list of"):
        run_sweep("bandit", ["grpo"], 1, 3, out=str(tmp_path), workers=1, progress=False)


@pytest.mark.parametrize("grid, message", [
    ({"lr": [0.1, 0.1]}, "lr lists the value 0.1 twice; give each value once"),
    ({"lr": [1, 1.0]}, "lr lists the value 1.0 twice; give each value once"),
    ({"reward": ["binary", "binary"]}, "reward lists the value 'binary' twice; give each value once"),
])
def test_a_grid_value_listed_twice_is_an_error_before_anything_runs(tmp_path, grid, message):
    """Before: lr=0.1,0.1 ran two tasks into one folder (a missing .part file), and a rerun counted 4 seeds for 2."""
    with pytest.raises(ValueError, match=f"^set: {re.escape(message)}$"):
        run_sweep("bandit", ["grpo"], 2, 2, grid, out=str(tmp_path), workers=1, progress=False)
    assert not list(tmp_path.iterdir())


def test_grid_values_with_the_same_folder_name_are_an_error(monkeypatch):
    import sim.sweep
    monkeypatch.setattr(sim.sweep, "resolve", lambda env, algo, params: {"dynamic_sampling": False, "env_seed": 0})
    with pytest.raises(ValueError, match=r"^set: two grid points of grpo have the same folder name "
                                         r"'grpo_reward=a_b_'; give values that differ in letters or digits$"):
        sim.sweep.plan("bandit", ["grpo"], 1, 2, {"reward": ["a/b", "a_b"]})


def test_cli_set_with_a_value_twice_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app
    res = CliRunner().invoke(app, ["sim", "--env", "bandit", "--algos", "grpo", "--seeds", "2", "--steps", "2",
                                   "--set", "lr=0.1,0.10", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and res.output == "error: set: lr lists the value 0.1 twice; give each value once\n"
    assert not (tmp_path / "s").exists()


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _running(pids: list[int]) -> list[int]:
    """The processes among ``pids`` that still run (a zombie does not)."""
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except FileNotFoundError:
            pass
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_killed_with_sigkill_ends_the_sweep_naming_its_runs_and_a_resume_finishes(tmp_path):
    out, whole = tmp_path / "killed", tmp_path / "whole"
    args = ["--env", "toy_lm", "--algos", "grpo,dpo", "--seeds", "2", "--steps", "40", "--workers", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "sim", *args, "--out", str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 60
        while len(_children(proc.pid)) < 2 and time.time() < deadline:
            time.sleep(0.002)
        workers = _children(proc.pid)
        os.kill(workers[0], signal.SIGKILL)  # one worker, not the sweep's process
        _, err = proc.communicate(timeout=60)  # it used to wait for the lost job forever
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2
    (line,) = [ln for ln in err.splitlines() if "error" in ln]
    match = re.fullmatch(r"error: workers: the worker process running (.+) was killed by SIGKILL; the sweep "
                         r"stopped, its done runs are kept: rerun the same command to resume", line)
    assert match, err
    for run in match.group(1).split(","):  # the named runs did not finish
        assert not (out / "runs" / run.strip() / "done.json").exists()
    assert len(workers) == 2 and not _running(workers), "a worker outlived the sweep"
    sim_command("toy_lm", "grpo,dpo", 2, 40, [], str(out), workers=2, progress=False)  # the lock was released
    sim_command("toy_lm", "grpo,dpo", 2, 40, [], str(whole), workers=2, progress=False)
    assert _files(out) == _files(whole) and (out / "summary.json").read_text() == (whole / "summary.json").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_workers_and_the_sweep_resumes_to_the_same_bytes(tmp_path):
    out, whole = tmp_path / "stopped", tmp_path / "whole"
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "sim", "--env", "toy_lm", "--algos", "grpo,dpo",
                             "--seeds", "2", "--steps", "40", "--workers", "2", "--out", str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal job
    try:
        deadline = time.time() + 60
        while len(_children(proc.pid)) < 2 and time.time() < deadline:
            time.sleep(0.002)
        workers = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and len(workers) == 2 and not _running(workers)
    sim_command("toy_lm", "grpo,dpo", 2, 40, [], str(out), workers=2, progress=False)
    sim_command("toy_lm", "grpo,dpo", 2, 40, [], str(whole), workers=2, progress=False)
    assert _files(out) == _files(whole) and (out / "summary.json").read_text() == (whole / "summary.json").read_text()


@pytest.mark.parametrize("spec, discovery, replication", [
    (4, (0, 1), (2, 3)), ("5", (0, 1, 2), (3, 4)), ("1000-1003", (1000, 1001), (1002, 1003)),
    ("7,3,9", (7, 3), (9,)), ("0-2:10,12", (0, 1, 2), (10, 12)), ("1", (0,), ())])
def test_seeds_take_a_count_a_range_or_a_list_split_into_two_sets(spec, discovery, replication):
    sets = parse_seeds(spec)
    assert (sets.discovery, sets.replication) == (discovery, replication)
    assert parse_seeds(sets.text()) == sets


@pytest.mark.parametrize("spec", ["", "5-4", "-3", "2--1", "0-9:5-12", "1,1", "x", "0", "100000000", "0-5000",
                                  "3:3"])
def test_bad_seeds_are_one_line_errors_naming_seeds(spec):
    with pytest.raises(ValueError, match=r"^seeds: [^\n]*$"):
        parse_seeds(spec)


def test_seeds_in_blocks_share_an_environment_draw_and_each_run_records_its_set():
    tasks = plan("bandit", ["grpo"], "3-12", 2, {"env_seed": [100]})
    draws = {t["seed"]: t["settings"]["env_seed"] for t in tasks}
    assert draws == {s: 100 + s // 5 for s in range(3, 13)}
    assert [t["set"] for t in tasks] == ["discovery"] * 5 + ["replication"] * 5
    assert [len(job) for job in jobs(tasks)] == [10]  # one stacked trainer per label, over its draws


def test_a_sweep_stacked_across_draws_writes_the_bytes_of_one_stacked_trainer_per_draw(tmp_path):
    grid = {"n_prompts": [16], "batch_prompts": [4], "minibatches": [2], "eval_every": [3]}
    run_sweep("feature_lm", ["grpo", "dapo"], "0-9", 7, grid, out=str(tmp_path / "across"), workers=1,
              progress=False)
    for draw in ("0-4", "5-9"):  # each draw's seeds as a sweep of their own: one stacked trainer per draw
        run_sweep("feature_lm", ["grpo", "dapo"], draw, 7, grid, out=str(tmp_path / "per_draw"), workers=1,
                  progress=False)
    runs = sorted((tmp_path / "across" / "runs").iterdir())
    assert len(runs) == 2 * 10
    for run_dir in runs:
        other = tmp_path / "per_draw" / "runs" / run_dir.name
        for name in ("metrics.jsonl", "done.json"):
            assert (run_dir / name).read_bytes() == (other / name).read_bytes(), run_dir.name
        across, per_draw = (json.loads((d / "config.json").read_text()) for d in (run_dir, other))
        assert across.pop("set") == ("discovery" if int(run_dir.name[-1]) < 5 else "replication")
        per_draw.pop("set")  # each per-draw sweep splits its own seeds into two sets
        assert across == per_draw


def test_a_run_in_a_sweep_is_the_run_alone_in_its_environment_draw(tmp_path):
    run_sweep("bandit", ["grpo"], "6-7", 4, out=str(tmp_path), workers=1, progress=False)
    alone = run("bandit", "grpo", 7, 4, {"env_seed": 1})
    lines = (tmp_path / "runs" / "grpo__seed7" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(alone))


def test_set_targets_one_algorithm():
    tasks = plan("bandit", ["grpo", "dapo"], 1, 2, parse_sets(["dapo.eps_high=0.28,0.3", "lr=0.05"]))
    labels = sorted({t["label"] for t in tasks})
    assert labels == ["dapo[eps_high=0.28,lr=0.05]", "dapo[eps_high=0.3,lr=0.05]", "grpo[lr=0.05]"]
    assert {t["settings"]["loss"]["eps_high"] for t in tasks if t["algo"] == "grpo"} == {0.2}
    with pytest.raises(ValueError, match="^set: .*'dapo'.*not in this sweep"):
        plan("bandit", ["grpo"], 1, 2, parse_sets(["dapo.eps_high=0.28"]))
    with pytest.raises(ValueError, match="^set: algorithm 'dpo' has no setting 'eps_high'"):
        plan("bandit", ["dpo"], 1, 2, parse_sets(["dpo.eps_high=0.28"]))


def test_plots_have_at_most_six_panels_none_empty_at_100_dpi(tmp_path):
    from PIL import Image

    from harness.reports.sim import MAX_PANELS, plot_curves
    from harness.reports.rundirs import Groups
    keys = [f"m{i}" for i in range(8)]
    runs = [{"dir": "d", "label": "grpo", "algo": "grpo", "params": {}, "seed": s, "env": "toy_lm",
             "records": [{**{k: float(t + s) for k in keys}, "empty": None} for t in range(5)]} for s in range(2)]
    paths = plot_curves(Groups(runs), ["grpo"], tmp_path / "p.png", panels=keys + ["empty"])
    assert len(paths) == 2 and MAX_PANELS == 6  # 8 panels with data: 6 + 2; the empty metric has none
    for path in paths:
        with Image.open(path) as im:
            assert im.info["dpi"][0] >= 99


def test_cliplab_sim_imports_numpy_with_one_blas_thread():
    """`cliplab sim` loads NumPy only after ``sim`` has set OPENBLAS_NUM_THREADS=1: OpenBLAS reads it once, when NumPy
    loads, and a second thread per worker process only spins against the sweep's other workers (a 5-seed feature_lm
    sweep took three times the CPU)."""
    code = """if True:
        import os, sys
        seen = []

        class FirstNumpy:  # records the setting when NumPy's import starts
            def find_spec(self, name, path=None, target=None):
                if name == "numpy" and not seen:
                    seen.append(os.environ.get("OPENBLAS_NUM_THREADS"))

        sys.meta_path.insert(0, FirstNumpy())
        from harness.cli import app
        try:
            app(["sim", "--env", "nowhere"], standalone_mode=False)
        except BaseException:
            pass
        print(seen)
    """
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "['1']", done.stdout + done.stderr


def test_base_settings_are_every_runs_and_in_no_label_and_a_resume_at_other_ones_is_refused(tmp_path):
    base = {"lr": 0.05, "group_size": 4}
    run_sweep("bandit", ["grpo"], 1, 3, {"eps_high": [0.2, 0.28]}, out=str(tmp_path), workers=1, progress=False,
              base=base)
    configs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("runs/*/config.json"))]
    assert {c["label"] for c in configs} == {"grpo[eps_high=0.2]", "grpo[eps_high=0.28]"}
    assert all(c["base"] == base and c["settings"]["lr"] == 0.05 and c["settings"]["group_size"] == 4
               for c in configs)
    alone = run("bandit", "grpo", 0, 3, {**base, "eps_high": 0.28, "env_seed": configs[1]["settings"]["env_seed"]})
    lines = (tmp_path / "runs" / run_id("grpo", {"eps_high": 0.28}, 0) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(alone))  # the same run as the settings alone
    with pytest.raises(ValueError, match=r"^out: .* base settings"):
        run_sweep("bandit", ["grpo"], 1, 3, {"eps_high": [0.2]}, out=str(tmp_path), workers=1, progress=False,
                  base={"lr": 0.1, "group_size": 4})
    with pytest.raises(ValueError, match="^set: unknown key"):
        plan("bandit", ["grpo"], 1, 3, {}, {"not_a_key": 1})
    over = plan("bandit", ["grpo"], 1, 3, {"lr": [0.2]}, base)  # a grid value wins over the base
    assert over[0]["settings"]["lr"] == 0.2 and over[0]["label"] == "grpo[lr=0.2]"
