"""cliplab's public API, for use as a library: the policy loss of each layer, the registry of names and defaults,
and conformance of your own loss against the reference.

    import cliplab
    loss, grad = cliplab.exact_policy_loss("grpo", logp, old_logp, adv, mask, group_size=4)      # spec (sympy)
    loss, grad, stats = cliplab.numpy_policy_loss("grpo", logp, old_logp, adv, mask, group_size=4)  # sim
    loss, stats = cliplab.torch_policy_loss("grpo", logp_t, old_t, adv_t, mask_t, group_size=4)     # gpu
    cliplab.assert_conforms(my_loss, "grpo", beta=0)          # AssertionError with a minimal input
    report = cliplab.conform("mypkg.losses:my_loss", adapter="algorithm=grpo,beta=0")

Names are imported on first use, so ``import cliplab`` stays light (torch loads with the torch layer or
conformance). Hypothesis strategies for batches: ``cliplab.strategies``; the pytest plugin: ``cliplab.pytest_plugin``
(registered through the ``pytest11`` entry point)."""
from __future__ import annotations

import importlib

#: public name -> (module, attribute); None: the module itself
_EXPORTS = {
    "exact_policy_loss": ("spec", "policy_loss"),
    "numpy_policy_loss": ("sim", "policy_loss"),
    "torch_policy_loss": ("gpu", "policy_loss"),
    "registry": ("spec.registry", None),
    "ALGORITHMS": ("spec.registry", "ALGORITHMS"),
    "POLICY_ALGORITHMS": ("spec.registry", "POLICY_ALGORITHMS"),
    "AGG_MODES": ("spec.registry", "AGG_MODES"),
    "HPARAMS": ("spec.registry", "HPARAMS"),
    "conform": ("harness.conform.engine", "conform"),
    "assert_conforms": ("harness.conform.engine", "assert_conforms"),
    "Batch": ("harness.conform.cases", "Batch"),
}
__all__ = sorted(_EXPORTS)
#: The exports that need an extra (pyproject.toml), named in an ImportError when it is missing.
_NEEDS = {"torch_policy_loss": "torch", "conform": "torch", "assert_conforms": "torch", "Batch": "torch"}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cliplab' has no attribute {name!r}; it exports {', '.join(__all__)}")
    module, attr = _EXPORTS[name]
    if name in _NEEDS:
        from spec.extras import require
        try:
            require(_NEEDS[name], f"cliplab.{name}")
        except ValueError as exc:
            raise ImportError(str(exc)) from None
    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
