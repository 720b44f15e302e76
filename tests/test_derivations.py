"""Every derivation the papers make, checked symbolically by sympy."""
import pytest

from spec.derivations import CHECKS


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_derivation_holds(name):
    assert CHECKS[name]() is True
