"""Every derivation the papers make, checked symbolically by sympy."""
import pytest

from spec.derivations import CHECKS


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_derivation_holds(name):
    assert CHECKS[name]() is True


@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "gspo", "gspo_token", "dcpo", "sapo"])
def test_symbolic_objective_evaluates_to_the_exact_loss(name):
    """The whole objective as one symbolic Piecewise expression, evaluated at a point, equals the exact loss that
    spec.policy_loss builds branch by branch at that point."""
    import numpy as np
    import sympy as sp

    import spec
    from harness.cases import make_case
    from spec.exact import rational, symbolic_objective
    case = make_case(11, prompts=1, group_size=2, length=2, extreme=False)
    case.mask[:] = 1
    expr, syms = symbolic_objective(name, 2, 2, group_size=2, max_len=2)
    values = {}
    for key, arr in (("lp", case.logp), ("sg", case.logp), ("old", case.old_logp), ("A", case.adv),
                     ("ref", case.ref_logp)):
        for i in range(2):
            for t in range(2):
                values[syms[key][i][t]] = rational(float(arr[i, t]))
    exact, _ = spec.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask, group_size=2,
                                ref_logp=case.ref_logp, max_len=2)
    assert float(sp.N(expr.xreplace(values), 30)) == float(sp.N(exact, 30))
    assert np.isfinite(float(sp.N(exact)))
