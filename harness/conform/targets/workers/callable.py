"""Worker of a ``module:function`` conformance target, run by cliplab's own python: it imports the user's module
and calls the function, so that whatever that code does (print, exit, change directory, hang, crash) stays in
this process; the parent holds each call to a time limit. Ops: ``load`` (``kw``: target, the parent's sys.path and
working directory) answers the function's parameters; ``call`` (``kw``: how to call, arrays: the batch) answers
``harness.conform.targets.callable.evaluate``'s result."""
from __future__ import annotations

import os
import sys

from _serve import serve

STATE = {}


def load(kw):
    """Import the target from the parent's import path and working directory; its parameters, or an error line."""
    sys.path[:] = kw["path"]  # the parent's path: cliplab's harness and the user's modules, not this folder
    os.chdir(kw["cwd"])
    from harness.conform.targets import callable as target
    try:
        STATE["fn"], STATE["target"] = target.load_callable(kw["target"]), target
    except ValueError as exc:
        return {"error": str(exc)}
    return target.signature_of(STATE["fn"])


def call(kw, **arrays):
    return STATE["target"].evaluate(STATE["fn"], kw, arrays)


serve({"load": load, "call": call}, lambda: {})
