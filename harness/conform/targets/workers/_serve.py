"""The worker side of a conformance target that runs in a process of its own: one JSON request per line on stdin,
one JSON reply per line on stdout (or on the pipes of a worker forked by cliplab). Imports only the standard library
and numpy (every target's venv has both)."""
from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np


def plain(x):
    """Numbers, arrays and tensors as JSON values (NaN and infinities kept: json writes them as NaN / Infinity)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    return x


def leave_own_folder(worker_file: str) -> None:
    """Take a worker's folder off the import path: a worker file is named like its framework, which it imports."""
    folder = os.path.dirname(os.path.abspath(worker_file))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != folder]


def bare_packages(top: str, names) -> str:
    """Register each package of ``names`` (``top`` or below it) as an empty module on its folder, so that the
    modules under it import without running the package ``__init__`` files on the way (which import what the
    target's environment does not install); returns ``top``'s folder."""
    import importlib.util
    import types
    root = os.path.dirname(importlib.util.find_spec(top).origin)
    for name in names:
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, *name.split(".")[1:])]
        sys.modules[name] = module
    return root


def kl_term(compute, kw, logp, ref_logp, mask, old_logp=None):
    """A framework's per-token KL estimator as a loss term, for the ``kl`` op of a worker: ``compute(logp, ref_logp,
    old_logp)`` on tensors in ``kw["dtype"]`` (logp a leaf), its values on the mask (0 off it) and d sum(values) /
    d logp, as the ``kl`` kind of ``harness.conform.kinds`` reads a callable's."""
    import torch
    dtype = getattr(torch, kw["dtype"])
    cast = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64)).to(dtype)  # noqa: E731
    leaf, on = cast(logp).requires_grad_(True), torch.as_tensor(np.asarray(mask)) > 0
    values = compute(leaf, cast(ref_logp), None if old_logp is None else cast(old_logp))
    values = torch.where(on, values, torch.zeros((), dtype=values.dtype))
    if values.requires_grad:
        values.sum().backward()
    return {"value": values, "grad": leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)}


def last_line(exc: BaseException) -> str:
    """``Type: message`` and where it was raised, on one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[-1] if message else ''}{where}"


def serve(handlers: dict, versions, requests: int = 0, replies: int = 1) -> None:
    """Answer requests ``{"op", "kw", "arrays"}`` read from file descriptor ``requests`` with ``{"ok": true, "out"}``
    or ``{"ok": false, "error"}`` written to ``replies``. ``op == "versions"`` calls ``versions()``; any other op
    calls ``handlers[op](kw, **arrays)``.

    The target's code cannot reach either channel: they move to descriptors of their own that no child process
    inherits, fd 0 reads /dev/null and fd 1 writes to stderr, for the whole life of the process, so that a print
    from C code or a child process goes to stderr. A call that forks answers "forked" (the answers of two processes
    would interleave on one channel), and a forked child that returns here exits without answering."""
    requests, replies = _private(requests, replies)
    pid, forks = os.getpid(), []
    os.register_at_fork(after_in_parent=lambda: forks.append(1))
    for line in requests:
        forks.clear()
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "versions":
                out = versions()
            elif op not in handlers:
                raise KeyError(f"unknown op {op!r}; this worker answers {', '.join(sorted(handlers))}")
            else:
                arrays = {k: np.asarray(v) for k, v in request.get("arrays", {}).items()}
                out = handlers[op](request.get("kw", {}), **arrays)
            reply = {"ok": True, "out": plain(out)}
        except Exception as exc:  # noqa: BLE001 (reported to the parent as the target's error)
            reply = {"ok": False, "error": last_line(exc)}
        if os.getpid() != pid:
            os._exit(0)
        if forks:
            reply = {"ok": False, "error": "forked: the call forked the worker process (its child exits without "
                                           "answering)"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _private(requests: int, replies: int):
    """The two channels as text files on new descriptors, not inherited by child processes (os.dup makes them so);
    fd 0 then reads /dev/null and fd 1 writes to fd 2, and Python's own stdout is stderr."""
    channels = open(os.dup(requests)), open(os.dup(replies), "w")
    for fd in {requests, replies} - {0, 1}:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channels
