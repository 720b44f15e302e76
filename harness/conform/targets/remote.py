"""The parent side of a conformance target that runs in a virtualenv of its own (``.venv-targets/NAME``, built by
``make target-NAME``): a long-lived worker process (``harness/conform/targets/workers/NAME.py``) fed JSON lines, with a
time limit per call. Whatever goes wrong inside it comes back as a ``TargetError`` naming the target."""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
WORKERS = Path(__file__).resolve().parent / "workers"


class TargetError(RuntimeError):
    """An error of the outside code (or its process), not of cliplab."""


def envs_dir() -> Path:
    """Where target environments live: ``$CLIPLAB_TARGET_ENVS`` or ``.venv-targets`` beside the Makefile."""
    return Path(os.environ.get("CLIPLAB_TARGET_ENVS") or ROOT / ".venv-targets")


def env_python(name: str) -> Path:
    """The target's interpreter, or a ValueError naming the make target that builds its environment."""
    env = envs_dir() / name
    if not (env / ".installed").exists():
        raise ValueError(f"target {name}: its environment {env} is missing or unfinished; build it with "
                         f"`make target-{name}` (or `make targets` for all)")
    return env / "bin" / "python"


class Worker:
    """One worker process of target ``name``; ``call`` starts it on first use and after a crash."""

    def __init__(self, name: str, timeout_s: float = 60.0, script: Path | None = None, python: Path | None = None):
        self.name, self.timeout_s = name, timeout_s
        self.python = Path(python) if python else env_python(name)
        self.script = Path(script) if script else WORKERS / f"{name}.py"
        self.proc = None
        self.hung = None  # after a call times out, every later call fails at once with the same line
        self.log = tempfile.TemporaryFile(mode="w+")

    def _start(self):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
               "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}
        env.pop("PYTHONPATH", None)  # the target sees its own environment only
        self.proc = subprocess.Popen([str(self.python), "-u", str(self.script)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, cwd=self.script.parent)

    def call(self, op: str, kw: dict | None = None, **arrays) -> object:
        """Send one request; its ``out``, or a TargetError (the target raised, crashed or passed the limit)."""
        if self.hung:
            raise TargetError(self.hung)
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        request = {"op": op, "kw": kw or {}, "arrays": {k: np.asarray(v).tolist() for k, v in arrays.items()}}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise TargetError(self._died()) from None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(self.timeout_s)
        if not ready:
            self.close()
            self.hung = f"{self.name}: {op} gave no answer within {self.timeout_s:g} s (stopped)"
            raise TargetError(self.hung)
        line = self.proc.stdout.readline()
        if not line:
            raise TargetError(self._died())
        reply = json.loads(line)
        if not reply["ok"]:
            raise TargetError(f"{self.name}: {reply['error']}")
        return reply["out"]

    def _died(self) -> str:
        code = self.proc.wait()
        self.log.seek(0)
        lines = [s for s in self.log.read().splitlines() if s.strip()]
        self.proc = None
        how = (f"was killed by {signal.Signals(-code).name} (exit code {code})" if -code in signal.valid_signals()
               else f"exited with code {code}")
        return f"{self.name}: worker {how}" + (f": {lines[-1].strip()}" if lines else "")

    def versions(self) -> dict:
        return self.call("versions")

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None



class RemoteTarget:
    """A target whose framework runs in a worker of its own environment. The subclass sets ``name`` (the worker and
    environment), ``how`` (what it drives, for the report) and, if one call may take longer, ``timeout_s``."""

    timeout_s = 60.0

    def __init__(self, worker: Worker | None = None):
        self.worker = worker or Worker(self.name, timeout_s=self.timeout_s)
        self.versions = self.worker.versions()

    def close(self):
        """Stop the worker process (a later call starts it again)."""
        self.worker.close()

def loss_and_grad(name: str, out, shape) -> tuple[float, np.ndarray | None]:
    """A worker's ``{"loss", "grad"}`` as (float, array of ``shape``), or a TargetError saying what was wrong. A NaN
    is a value the framework returned: it passes (the engine names it)."""
    if not isinstance(out, dict) or "loss" not in out:
        raise TargetError(f"{name}: returned {type(out).__name__}; expected a loss and its gradient")
    loss = out["loss"]
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        raise TargetError(f"{name}: returned a loss of type {type(loss).__name__}; expected a number")
    grad = out.get("grad")
    if grad is None:
        return float(loss), None
    grad = np.asarray(grad, dtype=float)
    if grad.shape != tuple(shape):
        raise TargetError(f"{name}: returned a gradient of shape {grad.shape}; expected {tuple(shape)}")
    return float(loss), grad
