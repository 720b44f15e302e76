"""Errors that name what and where: a full disk names the file, a linked run folder names the link, the model cache
names the variable that set it and the command that builds into it, data outside a tokenizer's alphabet names
data.source, a huge value is cut to a readable line, a byte that is not UTF-8 is named by its line, and a run
folder's edited config.json is refused on resume."""
import errno
import json
import os
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import _user_errors, app
from spec.records import write_text

ROOT = Path(__file__).resolve().parent.parent


# -- a full disk ---------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, whose writes fail with ENOSPC")
def test_a_write_past_a_full_disk_names_the_file_and_keeps_what_was_there(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("before")
    (tmp_path / "report.md.tmp").symlink_to("/dev/full")  # the temp file's writes fail as on a full disk
    with pytest.raises(OSError) as e:
        write_text(path, "after")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    assert path.read_text() == "before" and not os.path.lexists(tmp_path / "report.md.tmp")


def test_cliplab_sim_past_a_full_disk_names_where(tmp_path, monkeypatch):
    fsync = os.fsync

    def full(fd):  # the runs' metrics reach a full disk; the sweep's own files fit
        if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl.part"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)
    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sim", "--env", "bandit", "--algos", "grpo", "--seeds", "2", "--steps", "2",
                                      "--workers", "1", "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == f"error: {out / 'runs'}: No space left on device"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, whose writes fail with ENOSPC")
def test_a_report_whose_plot_meets_a_full_disk_names_the_plot(tmp_path):
    from harness.reports.rundirs import Groups, load_runs
    from harness.reports.sim import plot_curves
    from sim.sweep import run_sweep
    run_sweep("bandit", ["grpo"], 2, 2, out=str(tmp_path / "sweep"), workers=1, progress=False)
    groups = Groups(load_runs([tmp_path / "sweep"]))
    png = tmp_path / "curves.png"
    png.symlink_to("/dev/full")
    with pytest.raises(OSError) as e:
        plot_curves(groups, groups.labels(), png, panels=("reward",))
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(png)


# -- a run folder that links elsewhere -----------------------------------------------------------------------------
def test_a_sweep_refuses_a_run_folder_that_links_outside_naming_the_link_and_its_target(tmp_path):
    from sim.sweep import run_sweep
    out, outside = tmp_path / "sweep", tmp_path / "outside"
    run_sweep("bandit", ["grpo"], 2, 2, out=str(out), workers=1, progress=False)
    link = next((out / "runs").iterdir())
    link.rename(outside)
    (outside / "done.json").unlink()  # an unfinished run, so the sweep would redo it
    link.symlink_to(outside, target_is_directory=True)
    kept = sorted(p.name for p in outside.iterdir())
    with pytest.raises(ValueError) as e:
        run_sweep("bandit", ["grpo"], 2, 2, out=str(out), workers=1, progress=False)
    assert str(e.value).startswith(f"out: {link} is a symbolic link to {outside}; expected a folder of its own")
    assert sorted(p.name for p in outside.iterdir()) == kept and link.is_symlink()
    from harness.runs.ray import store  # the Ray backend's driver writes the runs its workers return
    with pytest.raises(ValueError, match=f"^out: {link} is a symbolic link to {outside}; "):
        store(out, link.name, {name: b"{}" for name in ("config.json", "metrics.jsonl", "done.json")})
    assert sorted(p.name for p in outside.iterdir()) == kept


# -- the model cache -----------------------------------------------------------------------------------------------
def test_a_model_cache_variable_naming_a_file_is_refused_naming_the_variable(tmp_path, monkeypatch):
    from gpu.config import from_dict
    from gpu.models import cache_dir
    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("CLIPLAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=rf"^CLIPLAB_CACHE: {tmp_path / 'cache'} is a file; expected a folder$"):
        cache_dir()
    with pytest.raises(ValueError, match="^CLIPLAB_CACHE: "):  # as a config asking for the cached model meets it
        from_dict({"run": {"out_dir": str(tmp_path / "run")}, "model": {"name": "tiny_char"},
                   "data": {"source": "addition", "digits": 3}})
    with pytest.raises(ValueError, match=r"^model.cache_dir: .* is a file; expected a folder"):
        cache_dir(tmp_path / "cache" / "models")


def _built_by_following(message: str, monkeypatch) -> None:
    """Run the command quoted in ``message`` as the shell would, with the pretraining itself stubbed (it writes the
    weights file only): ``make tiny-model`` as the Makefile's recipe line, a ``python -c`` call as it is."""
    from gpu import tiny_char
    words = shlex.split(re.search(r"`([^`]+)`$", message).group(1))
    assignment = re.compile(r"^[A-Z_][A-Z0-9_]*=")  # NAME=value words before the command: its environment
    env = dict(w.split("=", 1) for w in words if assignment.match(w))
    command = [w for w in words if not assignment.match(w)]
    if command == ["make", "tiny-model"]:
        recipe = re.search(r"^tiny-model:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
        command = shlex.split(recipe.replace("$(PY)", "python"))
    assert command[:2] == ["python", "-c"]
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def stub(out, spec, log_every=0):
        Path(out).mkdir(parents=True)
        (Path(out) / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(tiny_char, "pretrain", stub)
    exec(command[2], {"__name__": "__main__"})


@pytest.mark.parametrize("recipe", ["default", "another"])
def test_the_missing_tiny_char_model_names_a_command_that_builds_into_the_cache_asked_for(tmp_path, monkeypatch,
                                                                                          recipe):
    from gpu import models, tiny_char
    monkeypatch.delenv("CLIPLAB_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # a wrong command builds into this default cache
    cache = tmp_path / "my cache"
    path = tiny_char.RECIPE
    if recipe == "another":
        path = tmp_path / "recipe.yaml"
        path.write_text(tiny_char.RECIPE.read_text())
    with pytest.raises(ValueError, match=r"model.name: 'tiny_char' is not pretrained yet") as e:
        models.tiny_char_path(cache, path)
    assert ("make tiny-model" in str(e.value)) == (recipe == "default")
    _built_by_following(str(e.value), monkeypatch)
    assert models.tiny_char_path(cache, path).parent == cache  # found where it was asked for


# -- data outside the tokenizer's alphabet ------------------------------------------------------------------------
def test_data_outside_a_character_tokenizers_alphabet_is_refused_naming_data_source():
    from gpu.data import addition, arithmetic, check_alphabet
    from gpu.tiny_char import ALPHABET, char_tokenizer
    tok = char_tokenizer()
    check_alphabet(tok, addition(n=16, digits=3), "addition")  # the alphabet's own task
    problems = arithmetic(n=16)
    chars = "".join(p.question for p in problems)
    share = sum(c not in ALPHABET for c in chars) / len(chars)
    with pytest.raises(ValueError, match=rf"^data.source: 'arithmetic' has \d+ of its {len(chars)} prompt characters "
                                         rf"\({share:.0%}\) outside the model's tokenizer's alphabet"):
        check_alphabet(tok, problems, "arithmetic")


# -- huge values ---------------------------------------------------------------------------------------------------
def test_a_huge_string_metric_is_a_readable_one_line_error_naming_the_file_and_field(tmp_path):
    run = tmp_path / "runs" / "r0"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"algo": "grpo", "seed": 0, "label": "grpo", "env": "bandit"}))
    huge = "x" * 10 ** 6
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward": huge}) + "\n")
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.md")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and len(result.stderr) < 500
    assert result.stderr.startswith(f"error: {run / 'metrics.jsonl'}: record 1 (step 0), reward: expected a number")
    assert f"(cut from {len(huge) + 2} characters)" in result.stderr


def test_the_cli_cuts_any_error_and_warning_to_a_readable_line(capsys):
    import warnings
    shown = []

    def fails():
        shown.append(warnings.formatwarning("w" * 10 ** 6, UserWarning, __file__, 1))  # as the CLI prints one
        raise ValueError("e" * 10 ** 6)
    with pytest.raises(Exception):  # typer's Exit
        _user_errors(fails)
    (error,) = capsys.readouterr().err.splitlines()
    assert shown[0].startswith("warning: www") and shown[0].count("\n") == 1 and len(shown[0]) <= 1010
    assert error.startswith("error: eee") and len(error) <= 1010 and error.endswith("(cut from 1000000 characters)")


# -- a data file that is not UTF-8 ---------------------------------------------------------------------------------
def test_a_data_file_whose_second_line_is_not_utf8_is_named_at_line_2(tmp_path):
    from gpu.data import load_local
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"question": "1+1?", "answer": "#### 2"}\n{"question": "caf\xe9", "answer": "#### 3"}\n')
    with pytest.raises(ValueError, match=rf"^data.path: {path}: line 2, column 18: byte 0xe9 is not UTF-8$"):
        load_local(path, "gsm8k")
    path.write_bytes(b'{"question": "1+1?", "answer": "#### 2"}\n\n[1]\n')
    with pytest.raises(ValueError, match=r"line 3: expected a JSON object, got list"):  # lines still counted
        load_local(path, "gsm8k")


# -- resume under an edited config.json ----------------------------------------------------------------------------
def _trained_run(folder: Path, config: dict) -> Path:
    """A run folder as the trainer leaves it (checkpoint/state.json and config.json, the folder's config.json with
    its resolved settings), without training."""
    ckpt = folder / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 3, "stream": {"seed": 0, "epoch": 0, "pos": 6},
                                                 "sas": {}, "rng": {}}))
    (ckpt / "config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({**config, "resolved": {"loss": {"eps_low": 0.2}}}))
    return ckpt


def test_a_resume_refuses_a_run_folders_config_json_edited_away_from_the_checkpoints(tmp_path):
    from gpu.checkpoint import resume_config_change
    config = {"run": {"out_dir": str(tmp_path), "steps": 5}, "algo": {"name": "grpo"}, "train": {"lr": 1e-5}}
    ckpt = _trained_run(tmp_path, config)
    assert resume_config_change(ckpt, config, False) is None  # as written: resumes
    moved = {**config, "run": {"out_dir": "/elsewhere", "steps": 9}}  # free fields differ: resumes
    (tmp_path / "config.json").write_text(json.dumps(moved))
    assert resume_config_change(ckpt, config, False) is None
    (tmp_path / "config.json").write_text(json.dumps({**config, "algo": {"name": "dapo"}}))
    with pytest.raises(ValueError) as e:
        resume_config_change(ckpt, config, False)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: algo.name is 'dapo', but the checkpoint of step 3 "
                                   f"was trained with 'grpo' ({ckpt / 'config.json'}: the record a resume follows)")
    assert resume_config_change(ckpt, config, True) is None  # --allow-config-change: the given config is trained
    (tmp_path / "config.json").write_text('{"algo": {"name": "dap')  # unreadable: no field to follow
    with pytest.warns(UserWarning, match=r"not valid JSON.*; it is written again from .*checkpoint/config.json$"):
        assert resume_config_change(ckpt, config, False) is None
    assert resume_config_change(ckpt, {**config, "algo": {"name": "dapo"}}, True)["changes"] == {
        "algo.name": ["grpo", "dapo"]}
