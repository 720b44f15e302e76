"""A command line that says what to do next: --version, "did you mean" on a misspelt algorithm, --set key or
conformance target (an unknown key listing only the keys of the sweep's algorithms), help that is never cut at 80
columns, the recipes behind `cliplab recipe list | launch | cost`, and cluster reports that name a malformed value,
write numbers for reading, keep simulator runs out of a cluster table and list the formats they read. Each runs the
command in-process (typer's CliRunner)."""
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.recipes import cost as recipe_cost, launch as recipes
from harness.reports.cluster import FORMATS
from sim.config import known_keys
from spec.schema import did_you_mean

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, **env):
    result = CliRunner().invoke(app, [str(a) for a in args], env=env or None)
    return result.exit_code, result.output


def one_line_error(args, code=2):
    exit_code, out = cli(*args)
    lines = out.strip().splitlines()
    assert exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), out
    return lines[0]


# ---- --version ----------------------------------------------------------------------------------------------------
def test_version_is_the_installed_metadata_else_pyprojects(monkeypatch):
    import importlib.metadata
    shipped = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    assert cli("--version") == (0, f"cliplab {importlib.metadata.version('cliplab')}\n")

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli("--version") == (0, f"cliplab {shipped}\n")


# ---- did you mean -------------------------------------------------------------------------------------------------
def test_a_misspelt_algorithm_or_target_names_the_closest(tmp_path):
    assert "unknown algorithm 'dapox' (did you mean 'dapo'" in one_line_error(
        ["sim", "--algos", "grpo,dapox", "--steps", "2", "--out", tmp_path / "s"])
    line = one_line_error(["conform", "verlx"])
    assert "unknown target 'verlx' (did you mean 'verl'?)" in line and "module:function" in line
    assert "did you mean" not in one_line_error(["conform", "qqqqq"])  # nothing close: no guess
    assert not (tmp_path / "s").exists()
    assert "unknown 'gea' (did you mean 'gae'?)" in one_line_error(["verify", "--algos", "grpo,gea"])
    assert "got 'adma' (did you mean 'adam'?)" in one_line_error(  # any setting with choices (spec.schema.Rule)
        ["sim", "--algos", "grpo", "--set", "optimizer=adma", "--steps", "2", "--out", tmp_path / "s"])


def test_did_you_mean_names_the_closest_or_all_those_equally_close():
    algos = ["grpo", "gspo", "gmpo", "dapo", "dcpo", "dpo"]
    assert did_you_mean("dapox", algos) == " (did you mean 'dapo'?)"
    assert did_you_mean("gpro", algos) == " (did you mean 'gmpo', 'grpo' or 'gspo'?)"  # equally close: all
    assert did_you_mean("xyz", algos) == "" and did_you_mean("grpo", []) == ""


def test_an_unknown_set_key_names_the_closest_and_lists_only_the_sweeps_keys(tmp_path):
    line = one_line_error(["sim", "--algos", "grpo,dapo", "--set", "eps_hihg=0.3", "--steps", "2", "--out",
                           tmp_path / "s"])
    assert "unknown key(s) eps_hihg (did you mean 'eps_high'?) for env 'toy_lm'" in line
    listed = re.search(r"the loss settings of grpo, dapo \((.*)\) or the run's and toy_lm's \((.*)\)$", line)
    loss, run = (part.split(", ") for part in listed.groups())
    assert {"eps_high", "eps_low", "beta", "kl", "agg", "dual_clip"} <= set(loss) and {"lr", "group_size"} <= set(run)
    # the settings of algorithms outside the sweep: SAPO's temperatures, DCPO's cap, the Cov selections
    assert not {"tau_pos", "tau_neg", "r_max", "clip_cov_ratio", "kl_cov_coef", "cap_mode"} & set(loss + run)
    assert sorted(loss + run) == sorted(set(known_keys("toy_lm")) - {"tau_pos", "tau_neg", "r_max", "cap_mode",
                                                                      "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                                                      "cov_seed", "kl_cov_ratio", "kl_cov_coef",
                                                                      "vespo_k_pos", "vespo_lambda_pos",
                                                                      "vespo_k_neg", "vespo_lambda_neg"})
    line = one_line_error(["sim", "--algos", "grpo,dpo", "--set", "dpo.eps_high=0.3", "--steps", "2", "--out",
                           tmp_path / "s"])
    assert "algorithm 'dpo' has no setting 'eps_high'" in line and "the loss settings of dpo (beta)" in line


# ---- help at 80 columns -------------------------------------------------------------------------------------------
def commands(group=None, path=()):
    """Every command path of the CLI (groups included), from the root."""
    group = group or typer.main.get_command(app)
    yield path
    if hasattr(group, "commands"):  # a group
        for name, sub in group.commands.items():
            yield from commands(sub, (*path, name))


def _texts(command) -> list[str]:
    return [command.help or ""] + [p.help or "" for p in command.params if getattr(p, "help", None)]


@pytest.mark.parametrize("path", list(commands()), ids=lambda p: " ".join(p) or "cliplab")
def test_help_at_80_columns_is_never_cut(path):
    exit_code, out = cli(*path, "--help", COLUMNS="80")
    assert exit_code == 0, out
    assert "…" not in out and max(map(len, out.splitlines())) <= 80
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())
    for text in _texts(command):  # every word of the command's and its parameters' help is shown
        for word in text.split():
            assert word in flat, f"cliplab {' '.join(path)} --help lost {word!r}"


# ---- recipes ------------------------------------------------------------------------------------------------------
def recipe_runs() -> dict:
    return {p.parent.name: list(yaml.safe_load(p.read_text())["runs"])
            for p in sorted((ROOT / "configs" / "recipes").glob("*/recipe.yaml"))}


def test_recipe_list_and_the_launch_help_name_every_run():
    exit_code, out = cli("recipe", "list")
    assert exit_code == 0
    for name, runs in recipe_runs().items():
        block = out.split(f"{name}: ")[1].split("\n  runs: ")[1].splitlines()[0]
        assert [part.split(" (")[0] for part in block.split("), ")] == runs
    _, help_text = cli("recipe", "launch", "verl", "--help", COLUMNS="200")
    for name, runs in recipe_runs().items():
        assert f"{name}: {', '.join(runs)}" in help_text
    assert re.search(r"\*\s+--val\s.*\[required\]", help_text)  # shown as required, and it is
    exit_code, out = cli("recipe", "launch", "verl", "dcpo_math7b", "dcpo", "--model", ROOT, "--train", ROOT)
    assert exit_code == 2 and "Missing option '--val'" in out
    assert "did you mean 'dcpo_math7b'" in one_line_error(["recipe", "cost", "dcpo_math"])
    assert "did you mean 'dcpo'" in one_line_error(["recipe", "launch", "verl", "dcpo_math7b", "dcpo2", "--model",
                                                    ROOT, "--train", ROOT, "--val", ROOT, "--dry-run"])


def test_a_broken_recipe_leaves_the_help_of_the_others(tmp_path):
    """The help texts read the run names without checking a recipe, so that one broken recipe.yaml cannot stop
    every cliplab command at import; `cliplab recipe launch` on it still refuses it by name."""
    for name, text in (("ok", "runs: {a: {}, b: {}}\n"), ("broken", "runs: [\n"), ("odd", "- 1\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "recipe.yaml").write_text(text)
    assert recipes.run_names(tmp_path) == {"broken": [], "odd": [], "ok": ["a", "b"]}
    assert recipes.run_names() == recipe_runs()
    assert "expected the keys" in one_line_error(["recipe", "cost", tmp_path / "odd"])
    assert f"{tmp_path / 'broken' / 'recipe.yaml'}: not YAML" in one_line_error(["recipe", "cost",
                                                                                 tmp_path / "broken"])


def test_the_verl_dry_run_prints_the_launchs_whole_environment(tmp_path, monkeypatch):
    """The dry run's shell line is what the launch runs: the same command, and the same variables added to the
    environment (verl's file logger path, cliplab's plug-in module)."""
    (tmp_path / "m").mkdir()
    args = ["dcpo_math7b", "dcpo", "--model", tmp_path / "m", "--train", tmp_path, "--val", tmp_path, "--out",
            tmp_path / "out", "trainer.total_training_steps=3"]
    exit_code, out = cli("recipe", "launch", "verl", *args, "--dry-run")
    assert exit_code == 0 and not (tmp_path / "out").exists()
    words = shlex.split(out.splitlines()[1])
    assert words[0] == "env"
    shown_env = dict(w.split("=", 1) for w in words[1:3])
    seen = {}

    class FakeVerl:
        def __init__(self, cmd, env, **kwargs):
            seen.update(cmd=cmd, env=env)
            self.stdout, self.returncode = iter([]), 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(recipes.subprocess, "Popen", FakeVerl)
    assert cli("recipe", "launch", "verl", *args)[0] == 0
    assert words[3:] == seen["cmd"]
    assert shown_env == {k: v for k, v in seen["env"].items() if sys.modules["os"].environ.get(k) != v}
    assert set(shown_env) == {"VERL_FILE_LOGGER_PATH", "VERL_USE_EXTERNAL_MODULES"}
    assert json.loads((tmp_path / "out" / "dcpo_math7b" / "dcpo" / "run.json").read_text())["steps"] == 3


def test_the_trl_dry_run_needs_neither_trl_nor_deepspeed(tmp_path, monkeypatch):
    for module in ("deepspeed", "trl"):
        monkeypatch.setitem(sys.modules, module, None)  # importing either raises ImportError
    (tmp_path / "m").mkdir()
    exit_code, out = cli("recipe", "launch", "trl", "dcpo_math7b", "dcpo", "--model", tmp_path / "m", "--train",
                         tmp_path, "--out", tmp_path / "out", "--dry-run")
    assert exit_code == 0, out
    lines = out.splitlines()
    command = shlex.split(lines[1])
    assert command[:3] == ["accelerate", "launch", "--config_file"]
    assert Path(command[3]) == ROOT / "configs" / "recipes" / "dcpo_math7b" / "accelerate_zero3.yaml"
    assert command[4:9] == ["-m", "harness.cli", "recipe", "launch", "trl"]
    shipped = {k: v for k, v, _ in yaml.safe_load((ROOT / "configs/recipes/dcpo_math7b/recipe.yaml").read_text())
               ["trl"]["args"]}
    for key, value in shipped.items():  # every GRPOConfig field shown (beta: the run's own)
        assert any(line.startswith(f"#   {key} = ") for line in lines), key
    assert f"#   max_steps = {shipped['max_steps']!r}" in lines and "#   beta = 0.0" in lines
    assert not (tmp_path / "out").exists()
    assert "has no TRL variant" in one_line_error(["recipe", "launch", "trl", "dcpo_math7b", "dapo", "--model",
                                                   tmp_path / "m", "--train", tmp_path, "--dry-run"])


def test_the_trl_script_dry_runs_without_accelerates_launcher_and_names_deepspeed_when_missing(tmp_path):
    """launch_trl.sh --dry-run calls cliplab directly (accelerate's ZeRO-3 launcher needs DeepSpeed before any of
    cliplab runs); a real launch without DeepSpeed stops with one line naming it."""
    import importlib.util
    import os
    import subprocess
    script = ROOT / "configs" / "recipes" / "dcpo_math7b" / "launch_trl.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    (tmp_path / "m").mkdir()
    args = ["bash", script, "dcpo", "--model", tmp_path / "m", "--train", tmp_path, "--out", tmp_path / "out"]
    proc = subprocess.run([*map(str, args), "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shlex.split(proc.stdout.splitlines()[1])[:2] == ["accelerate", "launch"]
    if importlib.util.find_spec("deepspeed") is None:
        proc = subprocess.run(list(map(str, args)), env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "needs DeepSpeed: pip install deepspeed" \
            in proc.stderr and not (tmp_path / "out").exists()


def _rows(out: str) -> dict:
    """The cost table's rows by (run, framework): their cells."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 13 and cells[0] != "recipe" and not cells[0].startswith("---"):
            rows[(cells[1], cells[2].split(",")[0])] = cells
    return rows


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_cost_counts_dynamic_samplings_generations_and_takes_gpus_mfu_and_length():
    measured = json.loads((ROOT / "reports/sim/summaries/feature_lm_main.json").read_text())
    factor = measured["algorithms"]["dapo"]["gen_per_trained"]
    exit_code, out = cli("recipe", "cost", "dcpo_math7b")
    assert exit_code == 0 and f"{factor:.3g} responses per trained one (DAPO's measured gen_per_trained" in out
    rows = _rows(out)
    dapo, dcpo = rows[("dapo", "verl")], rows[("dcpo", "verl")]
    assert _number(dapo[3]) == pytest.approx(factor, abs=0.005) and _number(dcpo[3]) == 1
    # the same budget and no KL for either: DAPO generates F times DCPO's responses, and trains as much
    assert _number(dapo[7]) / _number(dcpo[7]) == pytest.approx(factor, rel=0.01)
    assert _number(dapo[6]) - _number(dapo[7]) == pytest.approx(_number(dcpo[6]) - _number(dcpo[7]), abs=1)

    exit_code, out = cli("recipe", "cost", "dcpo_math7b", "--gpus", "16", "--mfu", "0.2", "--response-len", "1000",
                         "--gen-factor", "2")
    assert exit_code == 0 and out.startswith("MFU 0.2; responses 1000 tokens on average; dynamic sampling "
                                             "generates 2 responses per trained one (given)")
    rows = _rows(out)
    assert {r[2] for r in rows.values()} == {"verl, 16", "TRL, 16"}
    dapo, dcpo = rows[("dapo", "verl")], rows[("dcpo", "verl")]
    assert _number(dapo[7]) / _number(dcpo[7]) == pytest.approx(2, rel=0.01)
    assert _number(dcpo[4]) == 512 * 16 * (1024 + 1000)  # tokens a step at the mean length
    assert _number(dcpo[8]) == pytest.approx(_number(dcpo[6]) / 16, abs=0.06)  # hours on 16 GPUs
    # half the MFU: twice the compute-bound hours (training), the memory-bound decoding unchanged
    b = recipe_cost.Budget(512, 16, 1024, 1000, 400)
    fast, slow = (recipe_cost.gpu_hours("Qwen2.5-Math-7B", "H200", b, mfu=m) for m in (0.4, 0.2))
    assert slow["train_h"] == pytest.approx(2 * fast["train_h"], rel=1e-12)
    twice = recipe_cost.gpu_hours("Qwen2.5-Math-7B", "H200", b, gen_factor=2)
    assert (twice["generate_h"], twice["train_h"]) == pytest.approx((2 * fast["generate_h"], fast["train_h"]))
    for args, what in ((["--mfu", "1.5"], "mfu: expected"), (["--gen-factor", "0.5"], "gen_factor: expected"),
                       (["--gpus", "0"], "gpus: expected"), (["--response-len", "0"], "response_len: expected")):
        assert what in one_line_error(["recipe", "cost", *args])


# ---- cluster reports ----------------------------------------------------------------------------------------------
def verl_log(path: Path, steps: int, overrides=None) -> Path:
    """A verl file-logger log of ``steps`` steps, ``overrides[step]`` replacing some of a step's values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for s in range(1, steps + 1):
        data = {"actor/pg_clipfrac": 0.01, "actor/entropy": 1.0, "response_length/mean": 1234.0,
                **(overrides or {}).get(s, {})}
        lines.append(json.dumps({"step": s, "data": data}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_malformed_metric_value_names_file_line_and_key(tmp_path):
    log = verl_log(tmp_path / "grpo" / "verl.jsonl", 3, {2: {"actor/entropy": "1.0x"}})
    line = one_line_error(["report", log, "--out", tmp_path / "r.md"])
    assert f"{log}: line 2: actor/entropy: expected a number, got '1.0x'" in line
    console = tmp_path / "c" / "console.log"
    console.parent.mkdir()
    console.write_text("starting\nstep:1 - actor/entropy:0.9 - timing_s/gen:fast - actor/kl_loss:None\n"
                       "step:2 - actor/pg_clipfrac:n/a\n")
    assert f"{console}: line 3: actor/pg_clipfrac: expected a number, got 'n/a'" in one_line_error(
        ["report", console, "--out", tmp_path / "r.md"])  # an unread key (timing) may hold anything; None: absent
    state = tmp_path / "t" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"global_step": 2, "max_steps": 2, "log_history": [
        {"step": 1, "entropy": 0.5}, {"step": 2, "entropy": [0.5]}]}))
    assert f"{state}: log_history[1]: entropy: expected a number, got [0.5]" in one_line_error(
        ["report", state, "--out", tmp_path / "r.md"])


def test_cluster_numbers_read_as_numbers_and_simulator_runs_stay_apart(tmp_path):
    log = verl_log(tmp_path / "grpo" / "verl.jsonl", 4)
    exit_code, out = cli("report", log, "--out", tmp_path / "r.md")
    assert exit_code == 0, out
    row = [line for line in (tmp_path / "r.md").read_text().splitlines() if line.startswith("| grpo |")][-1]
    assert "| 1,234 |" in row and "e+0" not in row
    sweep = tmp_path / "sweep"
    assert cli("sim", "--algos", "grpo", "--seeds", "1", "--steps", "2", "--workers", "1", "--out", sweep)[0] == 0
    line = one_line_error(["report", sweep, log, "--out", tmp_path / "mixed.md"])
    assert f"{sweep} hold simulator runs" in line and f"cliplab report {sweep} and cliplab report {log}" in line
    assert not (tmp_path / "mixed.md").exists()


def test_an_empty_folder_names_the_formats_report_reads(tmp_path):
    line = one_line_error(["report", tmp_path])
    assert f"no complete runs (config.json + metrics.jsonl, from cliplab sim or cliplab train) under {tmp_path}" \
        in line and f"cluster logs ({FORMATS})" in line


TOKEN_MEAN_DAPO = '''import torch
def dapo_loss(logp, old_logp, adv, mask, eps_low=0.2, eps_high=0.28):
    r = torch.exp(logp - old_logp)
    per_token = -torch.min(r * adv, torch.clamp(r, 1 - eps_low, 1 + eps_high) * adv)
    return (per_token * mask).sum() / mask.sum()
'''


def test_a_differs_ends_with_the_next_command_and_that_command_passes(tmp_path, monkeypatch, capsys):
    """A token-mean DAPO checked against DAPO's paper reference (a per-group token mean) differs; the printed next
    command that says so passes."""
    from harness.conform.engine import conform_command
    (tmp_path / "userloss.py").write_text(TOKEN_MEAN_DAPO)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not conform_command("userloss:dapo_loss", seeds=3, adapter="algorithm=dapo")["ok"]
    nexts = [line for line in capsys.readouterr().out.splitlines() if line.startswith("next: ")]
    assert nexts[0].endswith("cliplab conform userloss:dapo_loss --adapter algorithm=dapo,agg=token_mean")
    assert nexts[1].endswith("--adapter algorithm=dapo --accept agg=token_mean")
    assert "--write-baseline" in nexts[2]
    assert conform_command("userloss:dapo_loss", seeds=3, adapter="algorithm=dapo,agg=token_mean")["ok"]
    assert "next: " not in capsys.readouterr().out  # nothing to do after a pass
