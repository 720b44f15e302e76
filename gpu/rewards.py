"""Verifiable rewards: answers in \\boxed{} or a final number, checked numerically or with math-verify in a long-lived
worker process that is killed and replaced when an answer runs past its time limit. Model output is parsed, never
executed."""
from __future__ import annotations

import importlib
import inspect
import json
import math
import numbers
import os
import re
import select
import subprocess
import sys
import time
import weakref
from fractions import Fraction
from pathlib import Path
from typing import Callable

import torch

Reward = Callable[[str, str], float]  # (completion text, gold answer) -> reward

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def extract_answer(text: str, boxed_only: bool = False) -> str | None:
    """The answer a completion gives: the last \\boxed{} content, else (unless ``boxed_only``) its last number, else
    None."""
    boxed = last_boxed(text)
    if boxed is not None or boxed_only:
        return boxed
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def as_number(s: str) -> Fraction | None:
    """A plain integer, decimal or a/b fraction as an exact Fraction (commas and $ ignored), else None."""
    s = s.strip().strip("$").replace(",", "").replace(" ", "")
    if not re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", s or "x"):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


class Verifier:
    """Checks answers: exact numbers in-process; anything else in a long-lived worker process (``verify_worker``),
    started once and reused. Each answer may use ``timeout`` seconds of the worker's CPU time (the machine's load
    does not count), and at most ``wall_timeout`` seconds of wall time (default 3x ``timeout``: a worker that hangs
    without computing); past either, the worker is killed, replaced, and the answer counts as wrong and as a timeout.
    Start-up is not counted. ``checker`` is a 'module:function' (pred, gold) -> bool run in the worker (default:
    math-verify). Not thread-safe: one Verifier per thread."""

    def __init__(self, timeout: float = 5.0, checker: str | None = None, wall_timeout: float | None = None,
                 start_timeout: float = 300.0):
        for name, v in (("timeout", timeout), ("wall_timeout", wall_timeout), ("start_timeout", start_timeout)):
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: expected a finite number of seconds > 0, got {v!r}")
        self.timeout, self.checker, self.start_timeout = timeout, checker, start_timeout
        self.wall_timeout = 3 * timeout if wall_timeout is None else wall_timeout
        self.timeouts = 0  # answers cut off at the time limit
        self.crashes = 0  # answers whose worker died (counted wrong)
        self._proc, self._buf, self._ready = None, b"", False

    # -- the worker -------------------------------------------------------------------------------------------
    def _start(self):
        self._proc = subprocess.Popen([sys.executable, "-I", str(Path(__file__).with_name("verify_worker.py"))],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._buf, self._ready = b"", False
        self._stop = weakref.finalize(self, _kill, self._proc)  # also at exit
        self._send({"ppid": os.getpid(), "path": sys.path, "checker": self.checker,
                    "warmup": None if self.checker else ["x+1", "1+x"]})

    def _send(self, obj) -> bool:
        try:
            self._proc.stdin.write(json.dumps(obj).encode() + b"\n")
            self._proc.stdin.flush()
            return True
        except OSError:  # the worker is gone
            return False

    def _line(self, wait: float):
        """The worker's next reply line (bytes), None if none within ``wait`` s; raises EOFError if it died."""
        fd = self._proc.stdout.fileno()
        end = time.monotonic() + wait
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _wait_ready(self):
        if self._proc is None:
            self._start()
        if self._ready:
            return
        try:
            line = self._line(self.start_timeout)
        except EOFError:
            line = None
        if line is None:
            self.close()
            raise RuntimeError("verifier: the answer-checking worker did not start (is math-verify installed? "
                               "pip install math-verify==0.9.0); see its messages above")
        self._ready = True

    def _restart(self):
        self.close()
        self._start()  # its start-up overlaps whatever the caller does next

    def _check(self, pred: str, gold: str) -> bool:
        self._wait_ready()
        t0, cpu0 = time.monotonic(), _cpu_seconds(self._proc.pid)
        if not self._send([pred, gold]):
            self.crashes += 1
            self._restart()
            return False
        while True:
            try:
                line = self._line(0.05)
            except EOFError:
                self.crashes += 1
                self._restart()
                return False
            if line is not None:
                return bool(json.loads(line)["ok"])
            wall = time.monotonic() - t0
            cpu = _cpu_seconds(self._proc.pid)
            used = wall if cpu is None or cpu0 is None else cpu - cpu0
            if used > self.timeout or wall > self.wall_timeout:
                self.timeouts += 1
                self._restart()
                return False

    # -- public -----------------------------------------------------------------------------------------------
    def __call__(self, pred: str | None, gold: str) -> bool:
        """True when ``pred`` equals ``gold`` (numerically, or as the checker judges)."""
        if pred is None:
            return False
        a, b = as_number(pred), as_number(gold)
        if a is not None and b is not None:
            return a == b
        if pred.strip() == gold.strip():
            return True
        return self._check(pred, gold)

    def many(self, preds, golds) -> list[bool]:
        """``self(pred, gold)`` for each pair; a pair repeated in the batch is checked once."""
        seen: dict = {}
        for pair in zip(preds, golds):
            if pair not in seen:
                seen[pair] = self(*pair)
        return [seen[pair] for pair in zip(preds, golds)]

    def close(self):
        """Kill the worker (a new one starts on the next non-numeric check)."""
        if self._proc is not None:
            self._stop()
            self._proc = None


def _kill(proc) -> None:
    proc.kill()
    proc.wait()
    proc.stdin.close()
    proc.stdout.close()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds used so far by process ``pid`` (Linux /proc), None where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
VERIFIER = Verifier()  # the process's shared verifier; its worker starts on the first non-numeric answer
OUTCOMES = {  # reward of (correct, wrong, no answer) for each built-in reward
    "accuracy": (1.0, 0.0, 0.0),  # Dr.GRPO 2503.20783: 1 / 0
    "dapo": (1.0, -1.0, -1.0),  # DAPO 2503.14476, Sec. 2.4: +1 / -1
    "dcpo": (1.0, 0.0, -1.0),  # DCPO 2509.02333: +1 correct, 0 wrong but with an answer, -1 malformed
}


def _outcome_reward(name: str, pred: str | None, correct: bool) -> float:
    good, wrong, missing = OUTCOMES[name]
    return good if correct else missing if pred is None else wrong


def accuracy_reward(text: str, gold: str, verifier: Verifier = VERIFIER) -> float:
    """1 if correct else 0 (the 1/0 reward of Dr.GRPO 2503.20783)."""
    pred = extract_answer(text)
    return _outcome_reward("accuracy", pred, verifier(pred, gold))


def dapo_reward(text: str, gold: str, verifier: Verifier = VERIFIER) -> float:
    """+1 if correct else -1 (DAPO 2503.14476, Sec. 2.4 rule-based reward)."""
    pred = extract_answer(text)
    return _outcome_reward("dapo", pred, verifier(pred, gold))


def dcpo_format_reward(text: str, gold: str, verifier: Verifier = VERIFIER) -> float:
    """+1 correct, 0 wrong but with an answer, -1 malformed (no \\boxed{} or number) (DCPO 2509.02333 reward rule)."""
    pred = extract_answer(text)
    return _outcome_reward("dcpo", pred, verifier(pred, gold))


REWARDS: dict[str, Reward] = {"accuracy": accuracy_reward, "dapo": dapo_reward, "dcpo": dcpo_format_reward}


def get_reward(name: str) -> Reward:
    """A built-in reward by name, or any callable given as 'package.module:function' that can be called as
    ``f(completion text, gold answer)``."""
    if name in REWARDS:
        return REWARDS[name]
    if ":" in name:
        mod, _, fn = name.partition(":")
        try:
            func = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"reward: cannot import {name!r}: {e}") from None
        if not callable(func):
            raise ValueError(f"reward: {name!r} is not callable")
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):  # a builtin without one: checked by its first call
            return func
        try:
            signature.bind("text", "gold")
        except TypeError:
            raise ValueError(f"reward: {name!r} takes {signature}; expected a function of two arguments "
                             "(completion text, gold answer) returning a number") from None
        return func
    raise ValueError(f"reward: expected one of {', '.join(REWARDS)} or 'module:function', got {name!r}")


def _user_reward(name: str, fn: Reward, text: str, gold: str) -> float:
    """``fn(text, gold)`` as a finite float; a raise or another value is a ValueError naming ``algo.reward``."""
    try:
        value = fn(text, gold)
    except Exception as exc:  # noqa: BLE001 (user code: whatever it raises is reported in one line)
        raise ValueError(f"algo.reward: {name!r} raised {type(exc).__name__}: {' '.join(str(exc).split())}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"algo.reward: {name!r} returned {value!r} for a completion; expected a finite number")
    return float(value)


def score(texts, golds, reward: str = "accuracy", verifier: Verifier = VERIFIER, boxed_only: bool = False):
    """(rewards, correct) of each completion, each verified once: ``correct`` (1.0/0.0, the accuracy metric) and,
    for a built-in reward, the reward from it; a 'module:function' reward is called on (text, gold). With
    ``boxed_only`` an answer counts only in \\boxed{}."""
    preds = [extract_answer(t, boxed_only) for t in texts]
    ok = verifier.many(preds, golds)
    if reward in OUTCOMES:
        rewards = [_outcome_reward(reward, p, c) for p, c in zip(preds, ok)]
    else:
        fn = get_reward(reward)
        rewards = [_user_reward(reward, fn, t, g) for t, g in zip(texts, golds)]
    return torch.tensor(rewards, dtype=torch.float32), torch.tensor(ok, dtype=torch.float32)


def is_correct(texts, golds, verifier: Verifier = VERIFIER) -> torch.Tensor:
    """1.0 where the completion's answer is right, else 0.0 (the accuracy metric, whatever the reward)."""
    return torch.tensor(verifier.many([extract_answer(t) for t in texts], golds), dtype=torch.float32)


def overlong_filter_mask(truncated, mask):
    """DAPO overlong filtering (2503.14476, Sec. 3.4): truncated responses are masked out of the loss."""
    keep = 1.0 - torch.as_tensor(truncated, dtype=mask.dtype, device=mask.device)
    return mask * keep.unsqueeze(1)
