"""The out-of-process target protocol (harness.conform.targets.remote and workers/_serve.py): answers, one line naming
the target for each way outside code can go wrong, and a reply channel that the target's code cannot write to or read
from (file descriptors 0 and 1, children, forks)."""
import sys
import textwrap
import time

import numpy as np
import pytest

from harness.conform.targets.remote import WORKERS, TargetError, Worker, env_python, loss_and_grad

SCRIPT = textwrap.dedent(f"""
    import os, subprocess, sys, time
    sys.path.insert(0, {str(WORKERS)!r})
    import numpy as np
    from _serve import serve

    def ok(kw, x):
        print("a framework's own print goes to stderr")
        return {{"loss": float((kw["scale"] * x).sum()), "grad": kw["scale"] * np.ones_like(x)}}

    def boom(kw):
        raise ValueError("inside the target")

    def hang(kw):
        time.sleep(30)

    def spawn(kw):
        return subprocess.Popen(["sleep", "30"]).pid

    def die(kw):
        sys.stderr.write("segfault-like exit\\n")
        os._exit(3)

    def spoof(kw):
        line = '{{"ok": true, "out": "spoofed"}}'
        os.write(1, (line + "\\n").encode())  # as C code would
        subprocess.run(["echo", line], check=True)
        os.system(f"echo '{{line}}'")
        return {{"read from fd 0": os.read(0, 100).decode()}}

    def fork(kw):
        os.fork()  # both processes return
        return "answered"

    serve({{"ok": ok, "boom": boom, "hang": hang, "die": die, "spoof": spoof, "fork": fork,
           "spawn": spawn}},
          lambda: {{"fake": "1.0"}})
""")


@pytest.fixture
def worker(tmp_path, monkeypatch):
    env = tmp_path / "envs" / "fake"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / ".installed").touch()
    monkeypatch.setenv("CLIPLAB_TARGET_ENVS", str(tmp_path / "envs"))
    script = tmp_path / "fake.py"
    script.write_text(SCRIPT)
    w = Worker("fake", timeout_s=3, script=script)
    yield w
    w.close()


def test_answers_and_versions(worker):
    x = np.arange(6.0).reshape(2, 3)
    out = worker.call("ok", {"scale": 2.0}, x=x)
    loss, grad = loss_and_grad("fake", out, x.shape)
    assert loss == 30.0 and np.array_equal(grad, np.full((2, 3), 2.0))
    assert worker.versions() == {"fake": "1.0"}


def test_target_error_is_one_line_naming_the_target(worker):
    with pytest.raises(TargetError, match=r"^fake: ValueError: inside the target \(at fake.py:\d+\)$"):
        worker.call("boom")
    assert worker.call("ok", {"scale": 1.0}, x=[[1.0]])["loss"] == 1.0  # the worker is still up
    with pytest.raises(TargetError, match="fake: KeyError: .*unknown op 'nope'"):
        worker.call("nope")


def test_closing_a_worker_stops_the_processes_its_target_started(worker):
    pid = worker.call("spawn")
    worker.close()
    deadline = time.monotonic() + 5
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_crash_reports_exit_code_and_last_stderr_line_then_restarts(worker):
    with pytest.raises(TargetError, match="fake: worker exited with code 3: segfault-like exit"):
        worker.call("die")
    assert worker.call("ok", {"scale": 1.0}, x=[[2.0]])["loss"] == 2.0


def test_hang_is_stopped_at_the_time_limit_and_later_calls_fail_at_once(worker):
    with pytest.raises(TargetError, match="fake: hang gave no answer within 3 s"):
        worker.call("hang")
    with pytest.raises(TargetError, match="no answer"):
        worker.call("ok", {"scale": 1.0}, x=[[1.0]])


def test_what_the_target_writes_on_fd_1_or_reads_from_fd_0_does_not_touch_the_replies(worker):
    assert worker.call("spoof") == {"read from fd 0": ""}
    assert worker.call("ok", {"scale": 1.0}, x=[[3.0]])["loss"] == 3.0  # still in step
    worker.log.seek(0)
    assert worker.log.read().count('{"ok": true, "out": "spoofed"}') == 3  # on the worker's stderr


def test_a_fork_in_the_target_is_named_and_its_child_never_answers(worker):
    with pytest.raises(TargetError, match=r"^fake: forked: the call forked the worker process"):
        worker.call("fork")
    for scale in (1.0, 2.0):  # no stray answer from the child: each call gets its own
        assert worker.call("ok", {"scale": scale}, x=[[1.0]])["loss"] == scale


@pytest.mark.parametrize("line, cause", [("hello", "not JSON"), ("[1]", "not a reply"),
                                         ('{"ok": true}', "not a reply")])
def test_an_answer_that_is_not_a_reply_is_one_line_naming_the_target(tmp_path, line, cause):
    script = tmp_path / "talker.py"
    script.write_text(f"import sys\nfor _ in sys.stdin:\n    print({line!r}, flush=True)\n")
    w = Worker("talker", timeout_s=3, script=script, python=sys.executable)
    try:
        with pytest.raises(TargetError, match=f"^talker: ping answered a line that is {cause}"):
            w.call("ping")
    finally:
        w.close()


@pytest.mark.parametrize("out, match", [
    ({"loss": 1.0, "grad": [0.0, 1.0]}, r"fake: returned a gradient of shape \(2,\); expected \(1, 1\)"),
    ({"loss": "1.0"}, "fake: returned a loss of type str; expected a number"),
    ([1.0], "fake: returned list; expected a loss and its gradient"),
])
def test_bad_answers_are_named(out, match):
    with pytest.raises(TargetError, match=match):
        loss_and_grad("fake", out, (1, 1))


def test_a_nan_is_a_value_the_engine_names_not_an_error():
    loss, grad = loss_and_grad("fake", {"loss": float("nan"), "grad": [[float("nan")]]}, (1, 1))
    assert np.isnan(loss) and np.isnan(grad).all()


def test_missing_environment_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv("CLIPLAB_TARGET_ENVS", str(tmp_path))
    with pytest.raises(ValueError, match=r"target skyrl: its environment .* is missing .*`make target-skyrl`"):
        env_python("skyrl")
