"""The answer verifier under load: a long-lived worker whose per-answer limit counts its own CPU time, not start-up
or the machine's load; hostile answers are cut at the limit and counted; the worker dies with its parent."""
import os
import signal
import subprocess
import sys
import time

import pytest

from gpu.rewards import Verifier, score

CORRECT = [(r"\frac{1}{2}", "0.5"), (r"\sqrt{4}", "2"), (r"\dfrac{6}{4}", r"\frac{3}{2}"), ("2^{3}", "8"),
           (r"\frac{\pi}{2}", r"\pi/2")]
HOSTILE = {"a 10^6-digit number": "9" * 10 ** 6,
           "\\frac nested 2,000 deep": "\\frac{1}{" * 2000 + "2" + "}" * 2000,
           "a power tower": "9^{9^{9^9}}"}


@pytest.fixture
def busy_cpu():
    """Two busy-loop processes for the duration of the test."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def test_correct_answers_score_under_load(busy_cpu):
    v = Verifier()  # the default 5 s limit; the worker starts while the CPU is busy
    try:
        for _ in range(3):
            assert all(v(pred, gold) for pred, gold in CORRECT)
        assert not v(r"\frac{1}{3}", "0.5")
        assert v.timeouts == 0 and v.crashes == 0
    finally:
        v.close()


def test_the_limit_counts_the_workers_cpu_time_not_the_load(busy_cpu):
    v = Verifier(timeout=1.5, checker="verifier_checkers:spin", wall_timeout=120)
    try:
        assert v("1.0", "x")  # 1 s of CPU fits in 1.5 s, however long the busy machine takes to give it
        t = time.perf_counter()
        assert not v("30", "x")  # 30 s of CPU does not: cut after about 1.5 s of it
        assert v.timeouts == 1 and time.perf_counter() - t < 60
        assert v("0.1", "x") and v.timeouts == 1  # the replacement worker serves the next answer
    finally:
        v.close()


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_answers_are_cut_and_counted(name):
    v = Verifier(timeout=1.0)
    try:
        v._wait_ready()  # start-up is not part of the limit
        t = time.perf_counter()
        assert v(HOSTILE[name], "3") is False
        assert time.perf_counter() - t < v.wall_timeout + 2
        assert v.timeouts == 1
        assert v(r"\frac{1}{2}", "0.5")  # and the verifier still works
    finally:
        v.close()


def test_each_completion_is_verified_once_and_rewards_follow():
    calls = []

    class Counting(Verifier):
        def __call__(self, pred, gold):
            calls.append((pred, gold))
            return super().__call__(pred, gold)

    texts = [r"\boxed{12}", "so 13", "no idea", r"\boxed{12}", "12"]
    rewards, correct = score(texts, ["12"] * 5, "dcpo", Counting())
    assert correct.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert rewards.tolist() == [1.0, 0.0, -1.0, 1.0, 1.0]  # DCPO: +1 right, 0 wrong, -1 no answer
    assert sorted(calls, key=str) == sorted({("12", "12"), ("13", "12"), (None, "12")}, key=str)


def test_the_worker_dies_with_its_parent():
    code = ("import os, sys, time; from gpu.rewards import Verifier; v = Verifier(); v._wait_ready(); "
            "print(v._proc.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(worker):
            time.sleep(0.1)
        assert not _alive(worker)
    finally:
        parent.kill()
        parent.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
