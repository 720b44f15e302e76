"""Rewards: answer extraction, exact numbers, math-verify equivalence, the hang cut-off, DCPO/DAPO shaping."""
import time

import pytest
import torch

import gpu
from gpu.rewards import (Verifier, accuracy_reward, as_number, dapo_reward, dcpo_format_reward, extract_answer,
                         get_reward, is_correct, last_boxed, overlong_filter_mask)


def test_extraction_prefers_the_last_boxed_then_the_last_number():
    assert last_boxed(r"a \boxed{1} b \boxed{\frac{1}{2}} c") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert extract_answer("7 + 5 = 12, so 12.") == "12"
    assert extract_answer(r"it is \boxed{42} not 41") == "42"
    assert extract_answer("no answer here") is None
    assert as_number("1,234") == 1234 and as_number("0.5") == as_number("1/2") and as_number("x+1") is None


def test_reward_schemes():
    assert accuracy_reward(r"so \boxed{12}", "12") == 1.0 and accuracy_reward("13", "12") == 0.0
    assert dapo_reward("the answer is 12", "12") == 1.0 and dapo_reward("13", "12") == -1.0
    assert [dcpo_format_reward(t, "12") for t in (r"\boxed{12}", r"\boxed{13}", "no idea")] == [1.0, 0.0, -1.0]
    assert is_correct(["12", "x", r"\boxed{-3}"], ["12", "12", "-3"]).tolist() == [1.0, 0.0, 1.0]


def test_math_verify_judges_symbolic_answers():
    v = Verifier(timeout=30)
    try:
        assert v(r"\frac{1}{2}", "0.5")
        assert not v(r"\frac{1}{3}", "0.5")
    finally:
        v.close()


def test_a_hanging_verification_is_cut_off():
    v = Verifier(timeout=0.5, checker="verifier_checkers:hang")  # a worker that imports no torch starts fast
    t = time.perf_counter()
    try:
        assert v("x^2", "y") is False  # not a plain number: goes to the (hanging) checker
        assert v("3", "3") is True  # numbers never reach the checker
    finally:
        v.close()
    assert v.timeouts == 1 and time.perf_counter() - t < 20


def test_pluggable_rewards_and_errors():
    assert get_reward("dcpo") is dcpo_format_reward
    assert get_reward("gpu.rewards:accuracy_reward") is accuracy_reward
    with pytest.raises(ValueError, match="reward"):
        get_reward("nope")
    with pytest.raises(ValueError, match="reward: cannot import"):
        get_reward("no_such_module:f")
    with pytest.raises(ValueError, match="timeout"):
        Verifier(timeout=0)


def test_overlong_shaping_and_filtering():
    pen = gpu.overlong_penalty(torch.tensor([10.0, 18.0, 24.0, 30.0]), max_len=24, cache_len=8)
    assert torch.allclose(pen, torch.tensor([0.0, -0.25, -1.0, -1.0]))
    mask = torch.ones(3, 4)
    out = overlong_filter_mask([False, True, False], mask)
    assert out.sum(1).tolist() == [4.0, 0.0, 4.0]
