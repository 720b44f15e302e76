"""Every derivation the papers make, checked symbolically by sympy on the implementation's own formulas."""
import numpy as np
import pytest
import sympy as sp

import sim
from harness.verify.cases import make_case
from spec.derivations import CHECKS
from spec.exact import rational, symbolic_objective
from spec.registry import POLICY_ALGORITHMS, get_algorithm


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_derivation_holds(name):
    assert CHECKS[name]() is True


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_symbolic_objective_matches_an_independent_layer(name):
    """The whole objective as one symbolic Piecewise expression, evaluated at a point, and its derivative taken
    symbolically through every branch, equal sim's loss and analytic gradient (NumPy code that shares none of
    spec's). For GSPO-token the stop-gradient copies sg are held while differentiating, then set to logp. GRPO's
    defaults include its k3 penalty (beta 0.04). Clip-Cov and KL-Cov get the same token selection in both."""
    case = make_case(11, prompts=1, group_size=2, length=2, extreme=False, small_q=False)
    case.mask[:] = 1
    select = {"cov_select": np.array([[0, 1], [1, 0]])} if get_algorithm(name).select else {}
    expr, syms = symbolic_objective(name, 2, 2, group_size=2, max_len=2, **select)
    values = {}
    for key, arr in (("lp", case.logp), ("sg", case.logp), ("old", case.old_logp), ("A", case.adv),
                     ("ref", case.ref_logp)):
        for i in range(2):
            for t in range(2):
                values[syms[key][i][t]] = rational(float(arr[i, t]))
    at = lambda e: float(e.evalf(30, subs=values))  # noqa: E731
    grad = [[at(sp.diff(expr, syms["lp"][i][t])) for t in range(2)] for i in range(2)]
    loss, want_grad, _ = sim.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask, group_size=2,
                                         ref_logp=case.ref_logp, max_len=2, **select)
    assert at(expr) == pytest.approx(loss, rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-14)
    assert np.abs(want_grad).max() > 0  # the point is not one where every branch is flat
