"""Verifiable rewards: answers in \\boxed{} or a final number, checked numerically or with math-verify in a child
process that is killed when it hangs. Model output is parsed, never executed."""
from __future__ import annotations

import importlib
import multiprocessing as mp
import re
from fractions import Fraction
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


def extract_answer(text: str) -> str | None:
    """The answer a completion gives: the last \\boxed{} content, else its last number, else None."""
    boxed = last_boxed(text)
    if boxed is not None:
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


def _math_verify(pred: str, gold: str) -> bool:
    """math-verify's symbolic equivalence (runs in the child process, its own timeouts off)."""
    from math_verify import parse, verify
    return bool(verify(parse(f"${gold}$", parsing_timeout=None), parse(f"$\\boxed{{{pred}}}$", parsing_timeout=None),
                       timeout_seconds=None))


class Verifier:
    """Checks answers: exact numbers in-process; anything else with math-verify in one child process, cut off
    after ``timeout`` seconds (the child is then killed and replaced)."""

    def __init__(self, timeout: float = 5.0, checker: Callable[[str, str], bool] = _math_verify):
        if timeout <= 0:
            raise ValueError(f"timeout: expected > 0 seconds, got {timeout}")
        self.timeout, self.checker, self._pool = timeout, checker, None
        self.timeouts = 0

    def _run(self, pred, gold) -> bool:
        if self._pool is None:
            self._pool = mp.get_context("spawn").Pool(1)
        job = self._pool.apply_async(self.checker, (pred, gold))
        try:
            return bool(job.get(self.timeout))
        except mp.TimeoutError:
            self.timeouts += 1
            self.close()
            return False

    def __call__(self, pred: str | None, gold: str) -> bool:
        """True when ``pred`` equals ``gold`` (numerically, or as math-verify judges)."""
        if pred is None:
            return False
        a, b = as_number(pred), as_number(gold)
        if a is not None and b is not None:
            return a == b
        if pred.strip() == gold.strip():
            return True
        return self._run(pred, gold)

    def close(self):
        """Kill the child process (a new one starts on the next non-numeric check)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


_DEFAULT = Verifier()


def accuracy_reward(text: str, gold: str, verifier: Verifier = _DEFAULT) -> float:
    """1 if correct else 0 (the 1/0 reward of Dr.GRPO 2503.20783)."""
    return float(verifier(extract_answer(text), gold))


def dapo_reward(text: str, gold: str, verifier: Verifier = _DEFAULT) -> float:
    """+1 if correct else -1 (DAPO 2503.14476, Sec. 2.4 rule-based reward)."""
    return 1.0 if verifier(extract_answer(text), gold) else -1.0


def dcpo_format_reward(text: str, gold: str, verifier: Verifier = _DEFAULT) -> float:
    """+1 correct, 0 wrong but with an answer, -1 malformed (no \\boxed{} or number) (DCPO 2509.02333 reward rule)."""
    pred = extract_answer(text)
    if pred is None:
        return -1.0
    return 1.0 if verifier(pred, gold) else 0.0


REWARDS: dict[str, Reward] = {"accuracy": accuracy_reward, "dapo": dapo_reward, "dcpo": dcpo_format_reward}


def get_reward(name: str) -> Reward:
    """A built-in reward by name, or any callable given as 'package.module:function'."""
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
        return func
    raise ValueError(f"reward: expected one of {', '.join(REWARDS)} or 'module:function', got {name!r}")


def is_correct(texts, golds, verifier: Verifier = _DEFAULT) -> torch.Tensor:
    """1.0 where the completion's answer is right, else 0.0 (the accuracy metric, whatever the reward)."""
    return torch.tensor([float(verifier(extract_answer(t), g)) for t, g in zip(texts, golds)])


def overlong_filter_mask(truncated, mask):
    """DAPO overlong filtering (2503.14476, Sec. 3.4): truncated responses are masked out of the loss."""
    keep = 1.0 - torch.as_tensor(truncated, dtype=mask.dtype, device=mask.device)
    return mask * keep.unsqueeze(1)
