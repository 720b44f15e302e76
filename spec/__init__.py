"""The formal reference: the registry, and each objective as an exact sympy expression (loaded on first use)."""
from importlib import import_module

from .registry import ALGORITHMS, AGG_MODES, POLICY_ALGORITHMS, get_algorithm

_EXACT = {"policy_loss", "dpo_loss", "kl", "dcpo_bounds", "value_loss", "gae", "group_advantages", "gdpo_advantages",
          "SmoothAdvantage", "overlong_penalty", "dynamic_sampling_filter", "reinforce_pp_advantages",
          "symbolic_objective"}


def __getattr__(name):
    if name in _EXACT:
        return getattr(import_module(".exact", __name__), name)
    raise AttributeError(f"module 'spec' has no attribute {name!r}")


__all__ = ["ALGORITHMS", "AGG_MODES", "POLICY_ALGORITHMS", "get_algorithm", *sorted(_EXACT)]
