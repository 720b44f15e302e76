"""Conformance targets: one module per framework (each exposes ``Target``), or ``module:function``. Frameworks
whose pins conflict with cliplab's run in a virtualenv of their own through ``remote`` (workers in ``workers/``)."""
from __future__ import annotations

import importlib
import pkgutil

from spec.schema import did_you_mean

NOT_TARGETS = ("callable", "reference", "remote")
BUILTIN = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg and m.name not in NOT_TARGETS))


def load_target(target: str, adapter: str | None = None):
    """The target object for ``target``, or a ValueError saying what was expected."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"target: expected one of {', '.join(BUILTIN)} or module:function, got {target!r}")
    if ":" in target:
        from harness.conform.targets.callable import CallableTarget
        return CallableTarget(target, adapter)
    check_target_name(target)
    if adapter is not None:
        raise ValueError("adapter: only a module:function target takes an adapter description")
    return importlib.import_module(f"{__name__}.{target}").Target()


def check_target_name(target: str, also=()) -> None:
    """A ValueError, with the closest names, unless ``target`` is a built-in target, one of ``also`` or a
    module:function."""
    if ":" not in target and target not in (*BUILTIN, *also):
        raise ValueError(f"target: unknown target {target!r}{did_you_mean(target, (*BUILTIN, *also))}; expected one "
                         f"of {', '.join((*BUILTIN, *also))}, or module:function (your loss)")


def require(module: str, install: str):
    """Import ``module`` or raise a ValueError naming the install line."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 (outside packages fail to import in many ways: OSError, ...)
        raise ValueError(f"target: cannot import {module} ({type(exc).__name__}: {exc}); install it with: "
                         f"{install}") from None
