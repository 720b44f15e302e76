"""Hypothesis-generated batches: loss and gradient of spec (exact), sim and gpu agree for every algorithm and mode."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cases import make_case
from harness.verify import TOLERANCE, dpo_case, parts_case, policy_case
from spec.registry import AGG_MODES, POLICY_ALGORITHMS

cases = st.builds(make_case, seed=st.integers(0, 2**31 - 1), prompts=st.integers(1, 3),
                  group_size=st.integers(1, 4), length=st.integers(1, 5), extreme=st.booleans(),
                  small_q=st.booleans(), seq_adv=st.booleans())


def assert_agree(results):
    for pair, (d_loss, d_grad) in results.items():
        assert d_loss <= TOLERANCE[pair], (pair, "loss", d_loss)
        assert d_grad <= TOLERANCE[pair], (pair, "grad", d_grad)


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
@settings(max_examples=25)
@given(case=cases, agg=st.sampled_from([None, *AGG_MODES]))
def test_layers_agree(name, case, agg):
    assert_agree(policy_case(name, case, **({} if agg is None else {"agg": agg})))


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
@settings(max_examples=25)
@given(case=cases, agg=st.sampled_from(list(AGG_MODES)), dual=st.sampled_from([None, 1.5, 3.0]))
def test_sim_and_gpu_agree_with_knobs(name, case, agg, dual):
    """The cheaper float pairs on more examples, with dual clip and KL variants."""
    results = policy_case(name, case, exact=False, agg=agg, dual_clip=dual, beta=0.05, kl="k2")
    assert_agree(results)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**31 - 1))
def test_dpo_agrees(seed):
    assert_agree(dpo_case(seed))


@settings(max_examples=6)
@given(seed=st.integers(0, 2**31 - 1))
def test_parts_agree(seed):
    for results in parts_case(seed).values():
        assert_agree(results)
