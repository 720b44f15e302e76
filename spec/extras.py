"""pyproject.toml's extras as cliplab checks them: the modules of each extra that it imports, and a one-line error
naming the extra to install when one of them is missing. The core (spec, sim, the CLI, `cliplab sim`) needs none."""
from __future__ import annotations

import importlib.util
import sys

#: The modules of each extra (pyproject.toml's [project.optional-dependencies]) that the harness imports.
MODULES = {
    "torch": ("torch",),
    "reports": ("pandas", "matplotlib"),
    "gpu": ("torch", "pandas", "matplotlib", "transformers", "tokenizers", "safetensors", "accelerate", "datasets",
            "peft", "math_verify", "gguf", "champ_dataset"),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a None in sys.modules blocks an import)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that are not installed."""
    return [m for m in MODULES[extra] if not installed(m)]


def install_hint(extra: str) -> str:
    return f"pip install 'cliplab[{extra}]'"


def require(extra: str, what: str) -> None:
    """A ValueError naming ``what`` (a command, or the part of one), the extra it needs and how to install it, when
    a module of ``extra`` is missing."""
    absent = missing(extra)
    if absent:
        raise ValueError(f"{what} needs the {extra} extra: {install_hint(extra)} (not installed: {', '.join(absent)})")
