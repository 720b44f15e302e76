"""Hypothesis-generated batches: spec (exact), sim and gpu agree elementwise for every algorithm and option."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.verify.cases import make_case
from harness.verify.layers import OPTIONS, TOLERANCE, dpo_case, excess, parts_case, policy_case, scaled_diff
from spec.registry import AGG_MODES, KL_KINDS, POLICY_ALGORITHMS, get_algorithm

cases = st.builds(make_case, seed=st.integers(0, 2**31 - 1), prompts=st.integers(1, 3),
                  group_size=st.integers(1, 4), length=st.integers(1, 5), extreme=st.booleans(),
                  small_q=st.booleans(), seq_adv=st.booleans())


def assert_agree(results):
    for pair, (d_value, d_grad) in results.items():
        assert d_value <= 1, (pair, "value", d_value)
        assert d_grad is None or d_grad <= 1, (pair, "grad", d_grad)


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
@settings(max_examples=25)
@given(case=cases, option=st.sampled_from(OPTIONS))
def test_layers_agree(name, case, option):
    assert_agree(policy_case(name, case, **(option.hp if option.applies(name) else {})))


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
@settings(max_examples=25)
@given(case=cases, agg=st.sampled_from(list(AGG_MODES)), dual=st.sampled_from([None, 1.5, 3.0]),
       kl=st.sampled_from(KL_KINDS))
def test_sim_and_gpu_agree_with_knobs(name, case, agg, dual, kl):
    """The cheaper float pairs on more examples, with dual clip (where the loss has PPO's clip) and KL penalties
    together."""
    dual = dual if get_algorithm(name).clip in ("fixed", "dynamic") else None
    assert_agree(policy_case(name, case, exact=False, agg=agg, dual_clip=dual, beta=0.05, kl=kl))


@settings(max_examples=10)
@given(seed=st.integers(0, 2**31 - 1))
def test_dpo_agrees(seed):
    assert_agree(dpo_case(seed))


@settings(max_examples=6)
@given(seed=st.integers(0, 2**31 - 1))
def test_parts_agree(seed):
    results = parts_case(seed)
    for part, by_pair in results.items():
        assert set(by_pair) == set(TOLERANCE), part  # every part in every pair, float32 included
        assert_agree(by_pair)
    assert all(results["value_loss"][pair][1] is not None for pair in TOLERANCE)  # its gradient is measured
    assert all(results["gae"][pair][1] is None for pair in TOLERANCE)  # no gradient: n/a, not 0.0


def test_every_option_applies_to_some_algorithm():
    assert all(any(opt.applies(name) for name in POLICY_ALGORITHMS) for opt in OPTIONS)
    assert len({opt.label for opt in OPTIONS}) == len(OPTIONS)


@pytest.mark.parametrize("pair", list(TOLERANCE))
def test_an_ordinary_element_is_held_to_its_own_scale(pair):
    """A 1e-3 relative error on an O(1) gradient element fails every pair even next to a 1e7 element (the old
    max(1, max|ref|) scaling let it through: 1.4e-11 of the largest element)."""
    ref = np.array([3.6e7, 0.5, -0.02])
    bad = ref * np.array([1.0, 1.0 + 1e-3, 1.0])
    assert excess(bad, ref, pair) > 1
    assert scaled_diff(bad, ref) < 1e-9  # what the old rule saw, under its float64 tolerance
    assert excess(ref * (1 + TOLERANCE[pair]["rtol"] / 2), ref, pair) <= 1  # within rtol on every element


def test_excess_treats_nan_and_infinity():
    assert excess([np.nan], [1.0], "spec~sim") == np.inf
    assert excess([np.inf], [1.0], "spec~sim") == np.inf
    assert excess([np.inf, 1.0], [np.inf, 1.0], "spec~sim") == 0.0
