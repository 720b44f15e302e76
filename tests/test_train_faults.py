"""Faults of a training run (the tiny random model): a kill at each file-system event of a 3-step run, or a torn
write there, resumes to the same bytes; a run folder has one live owner; starting over supersedes the old
checkpoint and is recorded; a moved run resumes; damaged checkpoints, over-long prompts, bad reward callables and
a file size limit give one-line errors that name the file or the field."""
import json
import multiprocessing
import os
import re
import resource
import shutil
import signal
import stat
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import gpu.train
from conftest import importable_module
from gpu.config import from_dict
from gpu.data import Problem, prompt_ids
from gpu.rewards import score
from gpu.rollout import HFEngine
from gpu.train import TIMING_METRICS, Trainer
from gpu_helpers import EvenVerifier, tiny_config, tiny_path  # noqa: F401  (fixture)
from harness.cli import app
from spec.records import read_jsonl

TIMINGS = set(TIMING_METRICS)
FS_EVENTS = [(os, "replace"), (os, "rename"), (os, "fsync"), (os, "mkdir"), (os, "unlink"), (os, "rmdir"),
             (shutil, "rmtree")]


@pytest.fixture(autouse=True)
def no_verifier_worker(monkeypatch):
    """Correctness without the answer-checking worker process (a forked run must not share its pipes)."""
    monkeypatch.setattr(gpu.train, "VERIFIER", EvenVerifier())


def small(out, steps: int = 3, **sections) -> dict:
    """A run of one prompt x 2 samples a step, a checkpoint every step, resuming by default."""
    base = {"run": {"save_every": 1, "threads": 1, "resume": True},
            "rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 4}}
    for name, fields in sections.items():
        base.setdefault(name, {}).update(fields)
    return tiny_config(out, "grpo", steps=steps, **base)


def outcome(run: Path) -> dict:
    """What a finished run leaves: the checkpoint's bytes, its config without the folder's name, the metrics
    without their timings, and the folder's files."""
    c = Path(run) / "checkpoint"
    config = json.loads((c / "config.json").read_text())
    config["run"].pop("out_dir")
    return {"policy": (c / "policy.safetensors").read_bytes(), "state": (c / "state.json").read_bytes(),
            "optim": torch.load(c / "optim.pt", weights_only=True), "config": config,
            "metrics": [{k: v for k, v in r.items() if k not in TIMINGS} for r in read_jsonl(run / "metrics.jsonl")],
            "files": sorted(p.name for p in Path(run).iterdir() if p.name != "config_history.jsonl")}


def same(a: dict, b: dict) -> list[str]:
    """The parts of two outcomes that differ (tensors compared exactly)."""
    def equal(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(equal, x, y))
        return x == y
    return [k for k in a if not equal(a[k], b[k])]


def errors(output: str) -> list[str]:
    """The CLI's error lines (transformers draws its loading bars on stderr too)."""
    return [line for line in output.splitlines() if line.startswith("error:")]


def _path(name: str, arg) -> str:
    return os.readlink(f"/proc/self/fd/{arg}") if name == "fsync" else os.fspath(arg)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def census(raw: dict) -> list[tuple[str, str, bool]]:
    """Train ``raw`` here, listing its file-system events on its folder: (call, path, a regular file's fsync)."""
    folder, events = str(Path(raw["run"]["out_dir"]).resolve()), []
    with pytest.MonkeyPatch.context() as mp:
        for module, name in FS_EVENTS:
            def call(*args, _fn=getattr(module, name), _name=name, **kwargs):
                path = _path(_name, args[0])
                if _inside(path, folder):
                    events.append((_name, path, _name == "fsync" and stat.S_ISREG(os.fstat(args[0]).st_mode)))
                return _fn(*args, **kwargs)
            mp.setattr(module, name, call)
        Trainer(from_dict(raw)).fit()
    return events


def kill_at(raw: dict, event: int, torn: bool) -> bool:
    """Train ``raw`` in a forked child that SIGKILLs itself at its ``event``-th file-system event on the run folder
    (after cutting the last 5 bytes off the file it was about to fsync, when ``torn``). False if the run ended
    first. Called in ``clean_process``."""
    folder = str(Path(raw["run"]["out_dir"]).resolve())
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller
        code = 0
        try:
            seen, cut, kill = [0], os.ftruncate, os.kill

            def hooked(name, fn):
                def call(*args, **kwargs):
                    if _inside(_path(name, args[0]), folder):
                        seen[0] += 1
                        if seen[0] == event:
                            if torn:
                                cut(args[0], max(0, os.fstat(args[0]).st_size - 5))
                            kill(os.getpid(), signal.SIGKILL)
                    return fn(*args, **kwargs)
                return call
            for module, name in FS_EVENTS:
                setattr(module, name, hooked(name, getattr(module, name)))
            Trainer(from_dict(raw)).fit()
        except BaseException:  # noqa: BLE001 (reported by the exit code)
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status):
        assert os.WEXITSTATUS(status) == 0, "the run failed before the kill"
        return False
    assert os.WTERMSIG(status) == signal.SIGKILL, f"the run died of signal {os.WTERMSIG(status)}"
    return True


def rerun(raw: dict) -> list[str]:
    """Run ``raw`` again (it resumes), in ``clean_process``; the warnings it gave, but the expected one about a
    half-written last metrics line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(from_dict(raw)).fit()
    return [str(w.message) for w in caught if "dropped a half-written last line" not in str(w.message)]


def single_threaded() -> None:
    """Set up a clean process as the autouse fixture sets up pytest's: torch on one thread, the stand-in verifier."""
    torch.set_num_threads(1)
    gpu.train.VERIFIER = EvenVerifier()


def clean_process() -> ProcessPoolExecutor:
    """One freshly spawned process without pytest's threads, running torch on one thread: each fork it makes
    (``kill_at``) copies a single-threaded process (a fork of pytest's own process can crash, SIGSEGV), and what
    it trains does not depend on the global state earlier tests left in pytest's process (a log-prob gap metric
    differed in its last bits)."""
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=single_threaded)


def durable_commits(events, folder: str) -> None:
    """Each checkpoint is on disk before it is renamed into place (its four files and its folder fsynced), and
    each rename is on disk (the run folder fsynced) before the next step."""
    tmp, files = os.path.join(folder, "checkpoint.tmp"), ("policy.safetensors", "optim.pt", "state.json", "config.json")
    commits = [i for i, (call, path, _) in enumerate(events) if call == "replace" and path == tmp]
    assert len(commits) == 3
    current, old = os.path.join(folder, "checkpoint"), os.path.join(folder, "checkpoint.old")
    for n, i in enumerate(commits):
        start = max(j for j, (call, path, _) in enumerate(events[:i]) if call == "mkdir" and path == tmp)
        synced = [path for call, path, _ in events[start:i] if call == "fsync"]
        assert synced[:5] == [os.path.join(tmp, f) for f in files] + [tmp], synced
        if n:  # the previous checkpoint is set aside (on disk) first, and deleted only once the new one is
            assert [e[:2] for e in events[i - 2:i]] == [("replace", current), ("fsync", folder)]
        assert [e[:2] for e in events[i + 1:i + 3]] == [("fsync", folder), ("rmtree", old)]


def test_a_kill_or_a_torn_write_at_each_file_system_event_resumes_to_the_same_bytes(tmp_path, tiny_path):
    """Every rename, fsync, mkdir and delete of a 3-step run (a checkpoint each step) is a kill point; at each
    fsync of a file, also a torn write (its last bytes lost). The rerun of the same config resumes, and the run
    ends with the bytes of a run never stopped."""
    ref = tmp_path / "ref"
    with clean_process() as clean:  # the reference, the kills and the reruns all train there, as a new process would
        events = clean.submit(census, small(ref)).result()  # which also warms the process up for its forks
        assert 40 <= len(events) and sum(torn for *_, torn in events) >= 15, events
        trials = [(k, False) for k in range(1, len(events) + 1)] + [(k, True) for k, e in enumerate(events, 1) if e[2]]
        raws = [small(tmp_path / f"kill{k}{'torn' if torn else ''}") for k, torn in trials]
        killed = list(clean.map(kill_at, raws, *zip(*trials)))
        assert all(killed), f"events not reached: {[k for (k, _), hit in zip(trials, killed) if not hit]}"
        notes = list(clean.map(rerun, raws))  # the kill left no stale lock
    expected = outcome(ref)
    durable_commits(events, str(ref.resolve()))
    failures = []
    for (k, torn), raw, note in zip(trials, raws, notes):
        out = Path(raw["run"]["out_dir"])
        differs = same(outcome(out), expected)
        history = out / "config_history.jsonl"
        if history.exists() and any(h["event"] != "start_over" for h in read_jsonl(history)):
            differs.append("history")
        if differs or note:
            failures.append(f"event {k} {events[k - 1][:2]}{' torn' if torn else ''}: {differs} {note}")
    assert not failures, f"{len(failures)} of {len(trials)} kills did not resume to the same bytes: {failures}"


def test_starting_over_supersedes_the_old_checkpoint_and_is_recorded(tmp_path, tiny_path):
    """The issue's case: A trains 3 steps; B (another lr) starts over in its folder and is killed after 2 steps; a
    normal rerun of B then trains B from step 0 (the run B alone would), and the history tells both starts."""
    run = tmp_path / "run"
    a = small(run, steps=3, run={"save_every": 3})
    b = small(run, steps=5, run={"save_every": 3}, train={"lr": 2e-3})
    Trainer(from_dict(a)).fit()
    with pytest.raises(ValueError, match=r"train.lr: 0.001 -> 0.002\); .*set run.resume=false to start over"):
        Trainer(from_dict(b))
    killed = Trainer(from_dict({**b, "run": {**b["run"], "resume": False}}))
    assert not (run / "checkpoint").exists() and (run / "metrics.jsonl").read_text() == ""
    killed.train_step()
    killed.train_step()
    killed.close()  # as a kill after step 2 leaves the folder: no checkpoint of B yet
    Trainer(from_dict(b)).fit()
    clean = tmp_path / "clean"
    Trainer(from_dict(small(clean, steps=5, run={"save_every": 3}, train={"lr": 2e-3}))).fit()
    assert same(outcome(run), outcome(clean)) == []
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    first, second = read_jsonl(run / "config_history.jsonl")
    assert first["event"] == second["event"] == "start_over"
    assert (first["previous"]["train"]["lr"], first["previous_checkpoint_step"], first["previous_metric_lines"]) \
        == (1e-3, 3, 3)
    assert (second["previous"]["train"]["lr"], second["previous_checkpoint_step"],
            second["previous_metric_lines"]) == (2e-3, None, 2)


def test_one_live_run_owns_its_folder(tmp_path, tiny_path):
    raw = small(tmp_path / "run", steps=1)
    first = Trainer(from_dict(raw))
    folder = re.escape(str(tmp_path / "run"))
    message = rf"run.out_dir: {folder} is in use by another training run \(pid {os.getpid()}\)"
    with pytest.raises(ValueError, match=f"^{message}"):
        Trainer(from_dict(raw))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["train", "--config", str(config)])
    (line,) = errors(res.output)
    assert res.exit_code == 2 and re.fullmatch(f"error: {message}; .*", line), res.output
    first.fit()
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1]
    Trainer(from_dict(raw)).fit()  # free once the first has ended; nothing left to train
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1]


def hold_folder(raw: dict, ready) -> None:
    """In a spawned process: open the run ``raw`` (taking its folder), say so, and wait to be killed."""
    single_threaded()
    owner = Trainer(from_dict(raw))  # noqa: F841 (holds the lock until the process dies)
    ready.set()
    signal.pause()


def test_a_run_in_another_process_owns_its_folder_until_it_is_killed(tmp_path, tiny_path):
    raw = small(tmp_path / "run", steps=1)
    ctx = multiprocessing.get_context("spawn")  # not a fork of pytest's threaded process
    ready = ctx.Event()
    holder = ctx.Process(target=hold_folder, args=(raw, ready))
    holder.start()
    try:
        assert ready.wait(120), f"the holding process did not start (exit code {holder.exitcode})"
        in_use = rf"^run.out_dir: .* is in use by another training run \(pid {holder.pid}\)"
        with pytest.raises(ValueError, match=in_use):
            Trainer(from_dict(raw))
    finally:
        holder.kill()
        holder.join()
    Trainer(from_dict(raw)).fit()  # the kernel dropped the killed run's lock
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1]


def test_a_lock_file_that_is_a_symbolic_link_is_not_followed(tmp_path, tiny_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"^run.out_dir: cannot use .*train.lock as the run's lock \(it is a symbolic "
                                         r"link\); remove it$"):
        Trainer(from_dict(small(tmp_path / "run")))
    assert not (tmp_path / "elsewhere").exists()


def test_a_copied_or_moved_run_resumes_to_the_same_result(tmp_path, tiny_path):
    Trainer(from_dict(small(tmp_path / "a", steps=2))).fit()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "a").rename(tmp_path / "moved")
    for folder in ("b", "moved"):
        tr = Trainer(from_dict(small(tmp_path / folder, steps=3)))
        assert tr.step == 2
        tr.fit()
    Trainer(from_dict(small(tmp_path / "ref", steps=3))).fit()
    for folder in ("b", "moved"):
        assert same(outcome(tmp_path / folder), outcome(tmp_path / "ref")) == []
        assert not (tmp_path / folder / "config_history.jsonl").exists()


def test_the_config_guard_reads_the_checkpoint_not_the_runs_config_json(tmp_path, tiny_path):
    """Deleting config.json does not let the run resume as DAPO at lr 0.5; a checkpoint without its own config
    resumes only when the change is allowed; malformed values in it are named as changes."""
    run = tmp_path / "run"
    Trainer(from_dict(small(run, steps=1))).fit()
    (run / "config.json").unlink()
    dapo = small(run, steps=2, algo={"name": "dapo"}, train={"lr": 0.5})
    with pytest.raises(ValueError, match=r"^run.out_dir: .* step 1 .*algo.name: 'grpo' -> 'dapo'.*train.lr: "
                                         r"0.001 -> 0.5\); pass --allow-config-change"):
        Trainer(from_dict(dapo))
    stored = run / "checkpoint" / "config.json"
    good = stored.read_text()
    (run / "config.json").write_text('{"train": {"lr": "fast"')  # unreadable: no field to follow, written again
    tr = Trainer(from_dict(small(run, steps=1)))
    tr.close()
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 1e-3
    stored.write_text(good.replace('"lr": 0.001', '"lr": "fast"'))
    with pytest.raises(ValueError, match=r"^run.out_dir: .*\(train.lr: 'fast' -> 0.001\)"):
        Trainer(from_dict(small(run, steps=2)))
    stored.write_text("[1, 2]")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(stored))}: expected a JSON object, got list$"):
        Trainer(from_dict(small(run, steps=2)))
    stored.unlink()
    with pytest.raises(ValueError, match=rf"^run.out_dir: {re.escape(str(stored))} is missing, so the config that "
                                         r"trained its 1 steps is unknown; pass --allow-config-change"):
        Trainer(from_dict(small(run, steps=2)))
    Trainer(from_dict(small(run, steps=2)), allow_config_change=True).fit()
    (change,) = read_jsonl(run / "config_history.jsonl")
    assert change == {"event": "config_change", "from_step": 1, "changes": None, "previous": None}
    assert json.loads(stored.read_text())["train"]["lr"] == 1e-3  # the next checkpoint carries its config


@pytest.fixture(scope="module")
def one_step(tmp_path_factory, tiny_path):
    """A finished 1-step run, to copy and damage."""
    run = tmp_path_factory.mktemp("one") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu.train, "VERIFIER", EvenVerifier())
        Trainer(from_dict(small(run, steps=1))).fit()
    return run


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_state(**fields):
    def edit(path: Path) -> None:
        state = json.loads(path.read_text())
        for dotted, value in fields.items():
            node, *keys = state, *dotted.split("__")
            for k in keys[:-1]:
                node = node[k]
            node[keys[-1]] = value
        path.write_text(json.dumps(state))
    return edit


@pytest.mark.parametrize("name, damage, message", [
    ("policy.safetensors", _truncate, r"cannot restore the policy weights from it \(SafetensorError: .*\); truncated"),
    ("optim.pt", _truncate, r"cannot restore the optimiser and RNG state from it \(.*\); truncated"),
    ("state.json", _truncate, r"not valid JSON \(.*\); truncated\?"),
    ("state.json", _edit_state(step="1"), r"step: expected an integer >= 1, got '1'"),
    ("state.json", _edit_state(stream__pos=1.5), r"stream.pos: expected an integer >= 0, got 1.5"),
    ("state.json", _edit_state(stream__pos=10 ** 9), r"stream.pos: expected 0 to 256 \(the problems\), got 10+"),
    ("state.json", _edit_state(sas__history=[1]), r"sas: expected \{'history': .*\}"),
    ("state.json", _edit_state(rng__python="x"), r"cannot restore the field 'rng' from it"),
])
def test_a_damaged_checkpoint_is_named_in_one_line(one_step, tmp_path, name, damage, message):
    run = tmp_path / "run"
    shutil.copytree(one_step, run)
    path = run / "checkpoint" / name
    damage(path)
    with pytest.raises(ValueError) as e:
        Trainer(from_dict(small(run, steps=2)))
    assert re.match(rf"{re.escape(str(path))}: {message}", str(e.value)) and "\n" not in str(e.value), str(e.value)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(small(run, steps=2)))
    res = CliRunner().invoke(app, ["train", "--config", str(config)])
    assert res.exit_code == 2 and errors(res.output) == [f"error: {e.value}"] and "Traceback" not in res.output


def test_mixed_or_lost_metric_lines_are_refused_on_resume(one_step, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(one_step, run)
    metrics = run / "metrics.jsonl"
    line = metrics.read_text()
    metrics.write_text(line + line)  # two writers of step 1
    with pytest.raises(ValueError, match=rf"^{re.escape(str(metrics))}: expected steps 1 to 1 \(the checkpoint's\), "
                                         r"each once; record 2 should be step 2, found step 1"):
        Trainer(from_dict(small(run, steps=2)))
    metrics.write_text("")
    with pytest.raises(ValueError, match=r"record 1 should be step 1, found the end of the file"):
        Trainer(from_dict(small(run, steps=2)))


def test_an_over_long_prompt_is_refused_before_the_run_changes_anything(tmp_path, tiny_path, monkeypatch):
    """A 200,000-word question: a one-line error naming the field and the limit (the tiny model's 512 positions
    less 4 new tokens), before any sampling; the folder's earlier checkpoint is untouched."""
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n"
                    + json.dumps({"question": "word " * 200_000 + "?", "answer": "#### 3"}) + "\n")
    run = tmp_path / "run"
    Trainer(from_dict(small(run, steps=1))).fit()
    before = outcome(run)
    monkeypatch.setattr(HFEngine, "generate", lambda *a, **k: pytest.fail("sampled"))
    long_data = small(run, run={"resume": False}, data={"source": "gsm8k", "path": str(data)})
    with pytest.raises(ValueError, match=r"^data.max_prompt_tokens: problem 'long-1' is \d{6,} tokens long as a "
                                         r"prompt; expected at most 508 \(remove it from the data, or shorten "
                                         r"data.system\)$"):
        Trainer(from_dict(long_data))
    with pytest.raises(ValueError, match=r"^data.max_prompt_tokens: expected at most 508 \(a context of 512 tokens "
                                         r"less rollout.max_new_tokens\), got 600$"):
        Trainer(from_dict(small(run, run={"resume": False}, data={"max_prompt_tokens": 600})))
    assert same(outcome(run), before) == []
    with pytest.raises(ValueError, match=r"^data.max_prompt_tokens: problem 'p' is \d+ tokens long as a prompt; "
                                         r"expected at most 3 "):
        prompt_ids(Trainer(from_dict(small(tmp_path / "other", steps=1))).tok, Problem("p", "What is 1 + 1?", "2"),
                   None, 3)


SIGNATURES = """
def one(text):
    return 1.0


def keyword(text, *, gold):
    return 1.0


def three(text, gold, extra):
    return 1.0


def extra(text, gold, scale=1.0):
    return 1.0


def star(*args):
    return 1.0


def nan(text, gold):
    return float('nan')


def word(text, gold):
    return 'good'


def boom(text, gold):
    raise KeyError('gold')
"""


def test_reward_callables_of_the_wrong_signature_or_value_are_named(tmp_path):
    from gpu.config import validate
    with importable_module(tmp_path, "cliplab_rewards", SIGNATURES):
        for fn, sig in (("one", r"\(text\)"), ("keyword", r"\(text, \*, gold\)"), ("three", r"\(text, gold, extra\)")):
            with pytest.raises(ValueError, match=rf"^algo.reward: 'cliplab_rewards:{fn}' takes {sig}; expected a "
                                                 r"function of two arguments \(completion text, gold answer\)"):
                validate(from_dict({"algo": {"reward": f"cliplab_rewards:{fn}"}}))
        for fn in ("extra", "star"):
            validate(from_dict({"algo": {"reward": f"cliplab_rewards:{fn}"}}))
            assert score(["12"], ["12"], f"cliplab_rewards:{fn}", EvenVerifier())[0].tolist() == [1.0]
        for fn, message in (("nan", "returned nan for a completion; expected a finite number"),
                            ("word", "returned 'good' for a completion; expected a finite number"),
                            ("boom", "raised KeyError: 'gold'")):
            with pytest.raises(ValueError, match=rf"^algo.reward: 'cliplab_rewards:{fn}' {message}$"):
                score(["12"], ["12"], f"cliplab_rewards:{fn}", EvenVerifier())


@pytest.fixture
def file_size_limit():
    """Set the process's file size limit (``ulimit -f``) for the test; restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    yield lambda size: resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_file_too_large_is_named_and_the_previous_checkpoint_kept(tmp_path, tiny_path, file_size_limit):
    """EFBIG while writing step 2's checkpoint names the file and keeps step 1's, from which the rerun ends as a
    run never stopped; EFBIG on metrics.jsonl names it."""
    run = tmp_path / "run"
    Trainer(from_dict(small(run, steps=1))).fit()
    tr = Trainer(from_dict(small(run, steps=2)))
    file_size_limit((run / "checkpoint" / "policy.safetensors").stat().st_size // 2)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(run))}/checkpoint.tmp/policy.safetensors: cannot write the "
                                         r"checkpoint of step 2 \(File too large\); the previous checkpoint is kept$"):
        tr.fit()
    file_size_limit(resource.RLIM_INFINITY)
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 1
    assert not (run / "checkpoint.tmp").exists()
    Trainer(from_dict(small(run, steps=2))).fit()
    Trainer(from_dict(small(tmp_path / "ref", steps=2))).fit()
    assert same(outcome(run), outcome(tmp_path / "ref")) == []
    tr = Trainer(from_dict(small(run, steps=3)))
    file_size_limit((run / "metrics.jsonl").stat().st_size + 5)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(run))}/metrics.jsonl: cannot write it \(File too large\)$"):
        tr.fit()
