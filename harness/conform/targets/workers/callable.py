"""Worker of a ``module:function`` conformance target in a fresh process of cliplab's own python (the caller has
initialised CUDA, which a forked worker cannot use): ``harness.conform.targets.callable.worker_ops`` answered here,
so that whatever the user's code does (print, exit, change directory, hang, crash) stays in this process; the parent
holds each call to a time limit. Ops: ``load`` (``kw``: target, the parent's sys.path and working directory) answers
the function's parameters; ``call`` (``kw``: how to call, arrays: the batch) answers ``evaluate``'s result."""
from __future__ import annotations

import sys

from _serve import serve

OPS = {}


def load(kw):
    """Take the parent's import path (cliplab's harness and the user's modules, not this folder), then load."""
    sys.path[:] = kw["path"]
    from harness.conform.targets.callable import worker_ops
    OPS.update(worker_ops(kw["target"]))
    return OPS["load"](kw)


serve({"load": load, "call": lambda how, **arrays: OPS["call"](how, **arrays)}, lambda: {})
