"""The parent side of a conformance target that runs in a virtualenv of its own (``.venv-targets/NAME``, built by
``make target-NAME``): a long-lived worker process (``harness/conform/targets/workers/NAME.py``) fed JSON lines, with a
time limit per call. Whatever goes wrong inside it comes back as a ``TargetError`` naming the target. The same
workers run a user's function object, forked from the caller's process."""
from __future__ import annotations

import faulthandler
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
WORKERS = Path(__file__).resolve().parent / "workers"


#: The batch arrays a worker's policy loss reads.
POLICY_ARRAYS = ("logp", "old_logp", "adv", "mask")


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
    """One worker process of target ``name``; ``call`` starts it on first use and after a crash. The worker runs
    ``script`` under ``python`` (by default the target's environment), or, given ``handlers`` (op -> function, as
    ``_serve.serve`` takes them), is forked from this process and answers with them: a function object that cannot
    be imported by name runs this way. Either way it leads a process group of its own, stopped as a whole."""

    def __init__(self, name: str, timeout_s: float = 60.0, script: Path | None = None, python: Path | None = None,
                 handlers: dict | None = None):
        self.name, self.timeout_s, self.handlers = name, timeout_s, handlers
        if handlers is None:
            self.python = Path(python) if python else env_python(name)
            self.script = Path(script) if script else WORKERS / f"{name}.py"
        self.proc = None
        self.hung = None  # after a call times out, every later call fails at once with the same line
        self.log = tempfile.TemporaryFile(mode="w+")

    def _start(self):
        if self.handlers is not None:
            self.proc = _Forked(self.handlers, self.log)
            return
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
               "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}
        env.pop("PYTHONPATH", None)  # the target sees its own environment only
        self.proc = subprocess.Popen([str(self.python), "-u", str(self.script)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, cwd=self.script.parent, start_new_session=True)

    def call(self, op: str, kw: dict | None = None, **arrays) -> object:
        """Send one request; its ``out``, or a TargetError (the target raised, crashed, passed the limit or
        answered what is not a reply)."""
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
        reply = self._reply(op, line)
        if not reply["ok"]:
            raise TargetError(f"{self.name}: {reply['error']}")
        return reply["out"]

    def _reply(self, op: str, line: str) -> dict:
        """The parsed reply; else the worker is stopped (its channel is out of step) and a TargetError says why."""
        try:
            reply = json.loads(line)
        except ValueError as exc:
            cause = f"not JSON ({exc})"
        else:
            if isinstance(reply, dict) and (reply.get("ok") is True and "out" in reply
                                            or reply.get("ok") is False and isinstance(reply.get("error"), str)):
                return reply
            cause = 'not a reply ({"ok": true, "out": ...} or {"ok": false, "error": "..."})'
        self.close()
        raise TargetError(f"{self.name}: {op} answered a line that is {cause}: {line.strip()[:80]!r}")

    def _died(self) -> str:
        code = self.proc.wait()
        self.log.seek(0)
        lines = [s for s in self.log.read().splitlines() if s.strip()]
        self.close()
        how = (f"was killed by {signal.Signals(-code).name} (exit code {code})" if -code in signal.valid_signals()
               else f"exited with code {code}")
        return f"{self.name}: worker {how}" + (f": {lines[-1].strip()}" if lines else "")

    def versions(self) -> dict:
        return self.call("versions")

    def close(self):
        """Stop the worker and whatever its process group still runs (children of the target's code; the worker, a
        session leader, cannot leave the group)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # the group has ended
                pass
            self.proc.wait()
            self.proc = None


class _Forked:
    """A worker forked from this process, serving ``handlers`` on two pipes in a session of its own, its stderr in
    ``log``, with the parts of subprocess.Popen that Worker uses. The child never returns into the caller's code."""

    def __init__(self, handlers: dict, log):
        from harness.conform.targets.workers._serve import serve
        requests, to_child = os.pipe()
        from_child, replies = os.pipe()
        with warnings.catch_warnings():  # Python >= 3.12 warns on a fork of a threaded process (torch's pool)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.setsid()
                faulthandler.disable()  # the caller's (pytest enables one) would write a crash on the caller's stderr
                os.close(to_child)
                os.close(from_child)
                os.dup2(log.fileno(), 2)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                serve(handlers, lambda: {}, requests, replies)
                code = 0
            except BaseException:  # noqa: BLE001 (the child ends here, whatever happens)
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(requests)
        os.close(replies)
        self.stdin, self.stdout = open(to_child, "w"), open(from_child)
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


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

    def loss_run(self, op: str, kw, arrays=POLICY_ARRAYS):
        """A check's ``run``: the worker's loss ``op`` with ``kw`` (a dict, or a function of the batch that gives
        one) on the batch's ``arrays`` (its fields, or extras such as rollout_logp) -> (loss, d loss / d logp, the
        batch)."""
        def run(b):
            given = {k: b.extra[k] if k in b.extra else getattr(b, k) for k in arrays}
            value, grad = worker_loss(self.worker, op, kw(b) if callable(kw) else kw, **given)
            return value, grad, b
        return run


KL_BINDING = {"logp": "log_probs", "ref_logp": "log_probs_base", "old_logp": "log_probs_old", "mask": "loss_mask"}


def kl_checks(target: RemoteTarget, call: str, estimators: dict, note: str = "", gradient: bool = True,
              **kw) -> list:
    """The worker's ``kl`` op (``workers/_serve.kl_term``) for each of ``estimators`` (the framework's name -> the
    ``kl`` kind's estimator it claims), checked as a user callable of that kind is (``kinds.checks``: float64,
    float32 and bfloat16, typical and far_ref batches), with the clamped k3 of ``reference.capped_kl`` among the
    named candidates; ``kw`` goes to the op beside the estimator's name (``kl_estimator``). Without ``gradient``
    (a framework that uses the estimator in a reward, under no_grad) only the values are compared."""
    from harness.conform import kinds
    from harness.conform.targets import reference as ref
    out = []
    for name, kind in estimators.items():
        def run(b, dtype, name=name):
            used = kinds.rounded(b, "kl", dtype)
            reply = target.worker.call("kl", {**kw, "kl_estimator": name, "dtype": dtype}, logp=used.logp,
                                       ref_logp=used.ref_logp, old_logp=used.old_logp, mask=used.mask)
            value, grad = (np.asarray(reply[k], dtype=float) if isinstance(reply, dict) and k in reply else None
                           for k in ("value", "grad"))
            if value is None or value.shape != used.mask.shape or grad is None or grad.shape != used.mask.shape:
                raise TargetError(f"{target.name}: kl returned {type(reply).__name__}; expected values and their "
                                  f"gradient of shape {used.mask.shape}")
            return value, grad if gradient else None, used
        text = f"{call}(kl_estimator={name!r}" + "".join(f", {k}={v!r}" for k, v in kw.items()) + ")"
        for check in kinds.checks("kl", text, {"kl": kind}, KL_BINDING, run):
            check.candidates = check.candidates + ([ref.kl(kind, capped=True)] if kind == "k3" else [])
            check.note = note
            out.append(check)
    return out


def advantage_checks(target: RemoteTarget, call: str, knob: str, estimators: dict, binding: dict,
                     notes: dict | None = None) -> list:
    """The worker's ``advantage`` op (kw: estimator, group_size, dtype; arrays: rewards [B], mask; reply
    {"advantages": [B, T]}) for each of ``estimators`` (the framework's name -> the ``advantage`` kind's estimator
    and its adapter settings), checked as a user callable of that kind with parameters ``binding`` is
    (``kinds.checks``: float64, float32 and bfloat16); ``call`` and ``knob`` are formats of the framework's name,
    ``notes`` a note per name."""
    from harness.conform import kinds
    out = []
    for name, (estimator, settings) in estimators.items():
        def run(b, dtype, name=name):
            used = kinds.rounded(b, "advantage", dtype)
            reply = target.worker.call("advantage", {"estimator": name, "group_size": used.group_size,
                                                     "dtype": dtype}, rewards=kinds.rewards_of(used), mask=used.mask)
            adv = np.asarray(reply["advantages"] if isinstance(reply, dict) and "advantages" in reply else None,
                             dtype=float)
            if adv.shape != used.mask.shape:
                raise TargetError(f"{target.name}: advantage returned shape {adv.shape}; expected "
                                  f"{used.mask.shape}")
            return adv * used.mask, None, used
        adapter = {"kind": "advantage", "estimator": estimator, **settings}
        for check in kinds.checks("advantage", call.format(name), adapter, binding, run):
            check.knob = f"{knob.format(name)}, {check.knob}"
            check.note = " ".join(filter(None, ((notes or {}).get(name, ""), check.note)))
            out.append(check)
    return out


def worker_loss(worker: Worker, op: str, kw: dict, **arrays) -> tuple[float, np.ndarray | None]:
    """The worker's loss ``op`` with ``kw`` on ``arrays`` (logp among them): (loss, d loss / d logp), checked by
    ``loss_and_grad``."""
    return loss_and_grad(worker.name, worker.call(op, kw, **arrays), np.shape(arrays["logp"]))


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
