"""The worker side of a conformance target that runs in its own virtualenv: one JSON request per line on stdin,
one JSON reply per line on stdout. Imports only the standard library and numpy (the target's venv has both)."""
from __future__ import annotations

import json
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


def last_line(exc: BaseException) -> str:
    """``Type: message`` and where it was raised, on one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[-1] if message else ''}{where}"


def serve(handlers: dict, versions) -> None:
    """Answer requests ``{"op", "kw", "arrays"}`` with ``{"ok": true, "out"}`` or ``{"ok": false, "error"}``.
    ``op == "versions"`` calls ``versions()``; any other op calls ``handlers[op](kw, **arrays)``."""
    replies = sys.stdout
    sys.stdout = sys.stderr  # the framework's own prints must not reach the reply stream
    for line in sys.stdin:
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
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
