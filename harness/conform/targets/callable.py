"""A user callable computing a policy loss from torch tensors, called in a child process, each call within a time
limit, so that whatever the code does (print, exit, change directory or grad mode, fork, hang or crash) stays there:
``module:function`` (``cliplab conform``) is imported, and a function object (``assert_conforms``) runs, in a fork of
the caller's process (``module:function`` in a fresh process once the caller has initialised CUDA).
An adapter maps the callable's parameters and names what it claims to implement, e.g.
``algorithm=dapo,agg=token_mean,logp=log_prob,old_logp=old_log_prob,adv=advantages,mask=response_mask,returns=0``.
Parameters named like verl's, TRL's or OpenRLHF's are recognised without an adapter. ``kind=advantage``,
``kind=kl`` or ``kind=rollout_correction`` in the adapter makes it an advantage estimator, a KL term or a rollout
correction's weights instead (``harness.conform.kinds``)."""
from __future__ import annotations

import builtins
import importlib
import inspect
import os
import sys
import traceback
import weakref
from functools import partial

import numpy as np
import torch

from spec.contract import resolve_hparams
from spec.registry import AGG_MODES, GROUP_AGG_MODES, HPARAMS, POLICY_ALGORITHMS, get_algorithm
from spec.schema import did_you_mean

from harness.conform import kinds
from harness.conform.cases import TOLERANCE, Check, batch_of, bind_params
from harness.verify.layers import scaled_diff
from harness.conform.targets import reference as ref
from harness.conform.targets.remote import WORKERS, TargetError, Worker

ALIASES = {
    "logp": ("logp", "log_prob", "log_probs", "logprobs", "per_token_logps"),
    "old_logp": ("old_logp", "old_log_prob", "old_log_probs", "old_per_token_logps"),
    "adv": ("adv", "advantages", "advantage"),
    "mask": ("mask", "response_mask", "action_mask", "completion_mask", "loss_mask"),
    "ref_logp": ("ref_logp", "ref_log_prob", "ref_log_probs", "ref_per_token_logps"),
    "group_size": ("group_size", "num_generations"),
}
#: Adapter keys that say how to call the callable (beside algorithm, the parameter names and hyper-parameters).
CALL_OPTIONS = {
    "returns": "which item of a returned tuple is the loss (default 0)",
    "adv_shape": "token: advantages of shape [B, T] (default); seq: one per sequence, shape [B]",
    "timeout_s": "seconds each call of a module:function may take (default 60)",
}
ADV_SHAPES = ("token", "seq")
TIMEOUT_S = 60.0
LOAD_TIMEOUT_S = 300.0  # importing a module:function (and what it imports) on a loaded machine
EXPECTED = ("a callable f(logp, old_logp, adv, mask[, ref_logp][, group_size]) -> loss (a 0-d torch tensor "
            "differentiable in logp, or a tuple whose item `returns` is one); [B, T] float64 tensors")


class BadReturn(TypeError):
    """The callable returned something that is not a loss."""


def parse_adapter(adapter: str | dict | None) -> dict:
    """``key=value,...`` (or a dict of the same) -> dict; keys are algorithm, CALL_OPTIONS, our argument names (the
    callable's parameter name as value) and hyper-parameters."""
    if isinstance(adapter, dict):
        items = list(adapter.items())
    else:
        items = []
        for item in filter(None, (p.strip() for p in (adapter or "").split(","))):
            key, sep, value = (s.strip() for s in item.partition("="))
            if not sep or not value:
                raise ValueError(f"adapter: expected key=value items separated by commas, got {item!r}")
            items.append((key, _number(value) if key in HPARAMS or key in CALL_OPTIONS else value))
    kind = dict(items).get("kind", "policy")
    if kind == "step":
        raise ValueError("adapter: kind=step is checked with --level step (the callable's loss driven through one "
                         "optimisation step, harness.conform.kinds_step)")
    if kind not in kinds.KINDS:
        raise ValueError(f"adapter: unknown kind {kind!r}{did_you_mean(str(kind), kinds.KINDS)}; expected one of "
                         f"{', '.join(kinds.KINDS)}")
    if kind != "policy":
        common = {k: v for k, v in items if k in ("returns", "timeout_s")}
        _check_call_options(common)
        return kinds.parse(kind, items, common)
    out = {}
    for key, value in items:
        if key == "kind":
            continue
        if key not in ("algorithm", *CALL_OPTIONS, *ALIASES, *HPARAMS):
            close = did_you_mean(key, ("algorithm", *CALL_OPTIONS, *ALIASES, *HPARAMS))
            raise ValueError(f"adapter: unknown key {key!r}{close}; expected algorithm, {', '.join(CALL_OPTIONS)}, "
                             f"one of {', '.join(ALIASES)} (= the callable's parameter name) or a hyper-parameter "
                             f"({', '.join(HPARAMS)})")
        out[key] = value
    if "algorithm" in out and out["algorithm"] not in POLICY_ALGORITHMS:
        raise ValueError(f"adapter: unknown algorithm {out['algorithm']!r}"
                         f"{did_you_mean(out['algorithm'], POLICY_ALGORITHMS)}; expected one of "
                         f"{', '.join(POLICY_ALGORITHMS)}")
    if "agg" in out and out["agg"] not in AGG_MODES:
        raise ValueError(f"adapter: unknown aggregation mode {out['agg']!r}{did_you_mean(out['agg'], AGG_MODES)}; "
                         f"expected one of {', '.join(AGG_MODES)}")
    if out.get("adv_shape", "token") not in ADV_SHAPES:
        raise ValueError(f"adapter: adv_shape={out['adv_shape']!r}; expected token ([B, T]) or seq ([B])")
    _check_call_options(out)
    return out


def _check_call_options(out: dict) -> None:
    """returns (an index) and timeout_s (seconds), as every kind of callable takes them."""
    returns = out.get("returns", 0)
    if isinstance(returns, bool) or not isinstance(returns, int) or returns < 0:
        raise ValueError(f"adapter: returns={returns!r}; expected an index >= 0 into the returned tuple")
    timeout = out.get("timeout_s", TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"adapter: timeout_s={timeout!r}; expected a number of seconds > 0")


def _number(text):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return None if text == "None" else text


def load_callable(target: str):
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target: expected module:function, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # an outside module may fail in any way while importing
        raise ValueError(f"target: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"target: {module_name!r} has no callable {attr!r}; expected {EXPECTED}")
    return fn


def signature_of(fn) -> dict:
    """The callable's parameters as plain data: {"text": "f(a, b=1)", "params": [[name, required], ...]} (only
    those that can be passed by keyword), or {"error": ...}."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {"error": f"target: cannot read the signature of {fn!r}; expected {EXPECTED}"}
    params = [[n, p.default is p.empty] for n, p in sig.parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unfillable = [n for n, p in sig.parameters.items() if p.kind == p.POSITIONAL_ONLY and p.default is p.empty]
    return {"text": f"{getattr(fn, '__name__', 'f')}{sig}", "params": params, "positional_only": unfillable}


def bind(signature: dict, adapter: dict) -> dict:
    """Our argument name -> the callable's parameter name; a ValueError naming the parameters left unmapped and the
    adapter keys that map them."""
    binding = bind_params(signature, adapter, ALIASES)
    missing = [ours for ours in ("logp", "old_logp", "adv", "mask") if ours not in binding]
    unmapped = [n for n, required in signature["params"] if required and n not in binding.values()]
    unmapped += signature["positional_only"]
    if missing or unmapped:
        hint = ",".join(f"{ours}={name}" for ours, name in zip(missing, unmapped))
        raise ValueError(f"target: wrong signature {signature['text']}: "
                         + "; ".join(filter(None, [
                             f"no parameter for {', '.join(missing)}" if missing else "",
                             f"cannot map its parameters {', '.join(unmapped)}" if unmapped else ""]))
                         + f"; map them with the adapter keys {', '.join(ALIASES)}"
                         + (f" (e.g. --adapter {hint}, or assert_conforms(..., "
                            + ", ".join(f"{h.split('=')[0]}={h.split('=')[1]!r}" for h in hint.split(",")) + "))"
                            if hint else "")
                         + f"; expected {EXPECTED}")
    return binding


def evaluate(fn, how: dict, arrays: dict) -> dict:
    """Call ``fn`` with tensors of ``arrays`` (our names; float64, or ``how["dtype"]``) bound as ``how["binding"]``,
    ``how["group_size"]`` and a training step's ``how["counts"]`` (``kinds_step``); advantages [B] if
    ``how["adv_shape"]`` is seq. Returns {"loss", "grad"} (d loss / d logp),
    {"bad": what is wrong with the result}, or {"raised": [exception type, message, file:line]} when the callable
    raised, exited, or changed an input in place. Runs in the worker, with grad mode on whatever the caller's or
    an earlier call's was. A callable of another kind (advantage, kl) is called by ``kinds.evaluate``."""
    if how.get("kind", "policy") != "policy":
        try:
            return kinds.evaluate(fn, how, arrays)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 (user code may raise anything: the target's verdict)
            return _raised(exc)
    dtype = getattr(torch, how.get("dtype", "float64"))  # a training step's checks run in each of kinds.DTYPES
    tensors = {k: torch.tensor(np.asarray(v, dtype=np.float64)).to(dtype) for k, v in arrays.items()}
    if how.get("adv_shape") == "seq":
        tensors["adv"] = tensors["adv"][:, 0].contiguous()
    before = {k: t.clone() for k, t in tensors.items()}
    logp = tensors["logp"].requires_grad_(True)
    given = {**tensors, "group_size": how["group_size"]}
    counts = {param: torch.tensor(value, dtype=torch.float64) if ours == "num_items_in_batch" else value
              for ours, (param, value) in how.get("counts", {}).items()}  # a step's (harness.conform.kinds_step)
    try:
        with torch.enable_grad():
            out = fn(**{param: given[ours] for ours, param in how["binding"].items()}, **counts)
        changed = [how["binding"][k] for k, t in tensors.items() if not kinds.unchanged(t.detach(), before[k])]
        if changed:
            raise RuntimeError(f"the callable changed its input {', '.join(changed)} in place")
        loss = _loss(out, how.get("returns", 0))
        if isinstance(loss, str):
            return {"bad": loss}
        if loss.requires_grad:
            loss.reshape(()).backward()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 (user code may raise anything: it is the target's verdict)
        return _raised(exc)
    grad = logp.grad if logp.grad is not None else torch.zeros_like(logp)
    return {"loss": float(loss.detach().cpu().double()), "grad": grad.double().numpy(),
            "dtype": str(loss.dtype).removeprefix("torch.")}


def _loss(out, returns: int):
    """The returned loss tensor, or a string saying what was returned instead."""
    if isinstance(out, (tuple, list)):
        if returns >= len(out):
            return f"returned a {type(out).__name__} of {len(out)} items (returns={returns} is out of range)"
        out = out[returns]
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a one-element tensor"
    if out.is_meta:
        return "returned a tensor on the meta device (it has no values)"
    if out.is_complex():
        return f"returned a complex tensor ({out.dtype})"
    if out.numel() != 1:
        return f"returned a tensor of shape {list(out.shape)}, not a one-element tensor"
    return out


def _raised(exc: BaseException) -> dict:
    """{"raised": [exception type, first line of its message, file:line]} of what a callable raised or exited with."""
    if isinstance(exc, SystemExit):
        return {"raised": ["SystemExit", f"the callable called sys.exit({exc.code!r})", _place(exc)]}
    return {"raised": [type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:300], _place(exc)]}


def _place(exc: BaseException) -> str:
    """``file:line`` where the exception was raised (its innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""


def _rebuilt(kind: str, message: str, place: str = "") -> Exception:
    """The callable's exception as raised (builtin types), else a RuntimeError naming its type; ``where`` keeps the
    place in the callable's own code (the conformance engine names it)."""
    cls = getattr(builtins, kind, None)
    exc = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except TypeError:  # a builtin type whose constructor takes other arguments
            pass
    exc = exc or RuntimeError(f"{kind}: {message}")
    exc.where = place
    return exc


class _Child:
    """The callable in a worker process, a time limit per call: a child forked from this process, where
    ``module:function`` is imported from this process's import path and working directory (torch is imported
    already: a fresh interpreter would import it again, seconds of CPU) and a function object (which may not be
    importable by name) is taken as it is; but ``module:function`` is imported by a fresh process of cliplab's own
    python once this process has initialised CUDA, which a fork cannot use. After the worker crashes or passes the
    limit, every later call fails at once with the same line; after ``close``, a call starts it again."""

    def __init__(self, target, name: str, timeout_s: float):
        self.timeout_s = float(timeout_s)
        self.load_timeout_s = max(LOAD_TIMEOUT_S, self.timeout_s) if isinstance(target, str) else self.timeout_s
        if isinstance(target, str) and torch.cuda.is_initialized():
            self.worker = Worker(name, script=WORKERS / "callable.py", python=sys.executable)
        else:
            self.worker = Worker(name, handlers=worker_ops(target))
        self.stopped = None
        weakref.finalize(self, self.worker.close)

    def load(self) -> dict:
        self.worker.timeout_s = self.load_timeout_s
        try:
            out = self.worker.call("load", {"target": self.worker.name, "path": [*sys.path, os.getcwd()],
                                            "cwd": os.getcwd()})  # the user's modules, as `python -m` finds them
        except TargetError as exc:
            raise ValueError(f"target: loading {exc}") from None
        self.worker.timeout_s = self.timeout_s
        return out

    def call(self, how, arrays) -> dict:
        if self.stopped:
            raise TargetError(self.stopped)
        if self.worker.proc is None:  # closed
            self.load()
        try:
            return self.worker.call("call", how, **arrays)
        except TargetError as exc:
            if self.worker.proc is None:  # crashed or stopped: it would fail the same way on every call
                self.stopped = str(exc)
            raise

    def close(self):
        self.worker.close()


def worker_ops(target) -> dict:
    """A worker's ops for ``target`` (forked, or in a fresh process: workers/callable.py): ``load`` (kw: the
    caller's import path and working directory) imports ``module:function`` (or takes the function object) and
    answers its parameters, or an error line; ``call`` (kw: how to call, arrays: the batch) answers ``evaluate``'s
    result."""
    state = {}

    def load(kw):
        torch.set_num_threads(1)  # a fork's copy of torch's thread pool is not safe to use; tiny tensors need none
        if isinstance(target, str):
            sys.path[:] = kw["path"]
            os.chdir(kw["cwd"])
            try:
                state["fn"] = load_callable(target)
            except ValueError as exc:
                return {"error": str(exc)}
        else:
            state["fn"] = target
        return signature_of(state["fn"])
    return {"load": load, "call": lambda how, **arrays: evaluate(state["fn"], how, arrays)}


class CallableTarget:
    def __init__(self, target, adapter: str | dict | None = None):
        self.adapter = parse_adapter(adapter)
        self.kind = self.adapter.get("kind", "policy")
        self.algorithm = self.adapter.get("algorithm")
        self.hp = {k: v for k, v in self.adapter.items() if k in HPARAMS and self.kind == "policy"}
        if self.algorithm is not None:
            resolve_hparams(self.algorithm, self.hp)  # a bad claimed hyper-parameter fails here, with its name
        elif self.hp:
            raise ValueError("adapter: hyper-parameters need algorithm=NAME (what the callable implements)")
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            if not module or not attr:
                raise ValueError(f"target: expected module:function, got {target!r}")
            self.name = target
        elif callable(target):
            self.name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
        else:
            raise ValueError(f"target: expected module:function or a callable, got {target!r}")
        self.runner = _Child(target, self.name, self.adapter.get("timeout_s", TIMEOUT_S))
        signature = self.runner.load()
        if "error" in signature:
            raise ValueError(signature["error"])
        self.versions = {"callable": self.name, "torch": torch.__version__.split("+")[0]}
        if self.kind != "policy":
            self._init_kind(signature)
            return
        self.binding = bind(signature, self.adapter)
        self.how = (f"`{self.name}` is called in a child process with float64 tensors bound as {self.binding} "
                    "(advantages "
                    f"{'[B]' if self.adapter.get('adv_shape') == 'seq' else '[B, T]'}); the gradient is "
                    "d loss / d logp by autograd.")
        self._checks, self.dtype = None, "float64"  # the dtype it computes in: its loss's, seen by the probe
        self._probe()

    def _init_kind(self, signature: dict):
        """A callable of kind advantage or kl: its binding, what the report says of the call, its checks (one per
        dtype), and a probe call so that a result of the wrong shape fails at once."""
        self.binding = kinds.bind(self.kind, signature, self.adapter)
        self.how = (f"`{self.name}` ({self.kind}) is called in a child process with tensors bound as {self.binding} "
                    f"in float64, float32 and bfloat16 (one check each); {kinds.EXPECTED[self.kind]}.")
        self.dtype = "float64"
        self._checks = kinds.checks(self.kind, self.name, self.adapter, self.binding, self.run_kind)
        try:
            self._checks[0].run(self._checks[0].batch(0, self._checks[0].families[0]))
        except BadReturn as exc:
            raise ValueError(f"target: {exc}") from None
        except Exception:  # noqa: BLE001 (reported by every check)
            pass

    def run_kind(self, b, dtype: str):
        """Call a callable of another kind than policy on ``b`` with its inputs in ``dtype``: (values [B, T],
        gradient in its differentiated input (kinds.DIFFERENTIATED) or None, the batch as the callable saw it)."""
        used = kinds.rounded(b, self.kind, dtype)
        how = {"kind": self.kind, "binding": self.binding, "group_size": used.group_size, "dtype": dtype,
               "returns": self.adapter.get("returns", 0), "reward_shape": self.adapter.get("reward_shape", "seq"),
               "group_index_as": self.adapter.get("group_index_as", "tensor"), "kept": self.adapter.get("kept")}
        out = self.runner.call(how, kinds.arrays_of(self.kind, used))
        if "bad" in out:
            raise BadReturn(f"{self.name} {out['bad']}; expected {kinds.EXPECTED[self.kind]}")
        if "raised" in out:
            raise _rebuilt(*out["raised"])
        grad = out.get("grad")
        return np.asarray(out["value"], dtype=float), None if grad is None else np.asarray(grad, dtype=float), used

    def _probe(self):
        """Call once on a small batch so that a result that is not a loss fails with what was expected; an error
        inside the callable is left to the checks, which report it."""
        try:
            self.run(batch_of(0, "typical"))
        except BadReturn as exc:
            raise ValueError(f"target: {exc}") from None
        except Exception:  # noqa: BLE001 (reported by every check)
            pass

    def run(self, b, adv_shape: str | None = None):
        arrays = {"logp": b.logp, "old_logp": b.old_logp, "adv": b.adv, "mask": b.mask, "ref_logp": b.ref_logp}
        how = {"binding": self.binding, "group_size": b.group_size, "returns": self.adapter.get("returns", 0),
               "adv_shape": adv_shape or self.adapter.get("adv_shape", "token")}
        out = self.runner.call(how, {k: v for k, v in arrays.items() if k in self.binding})
        if "bad" in out:
            raise BadReturn(f"{self.name} {out['bad']}; expected {EXPECTED}")
        if "raised" in out:
            raise _rebuilt(*out["raised"])
        self.dtype = out.get("dtype", self.dtype)
        return float(out["loss"]), np.asarray(out["grad"], dtype=float), b

    def close(self):
        """Stop the worker process (a later call starts it again)."""
        self.runner.close()

    def checks(self) -> list[Check]:
        if self._checks is None:
            self._checks = [self._check()]
        return self._checks

    def _check(self) -> Check:
        aggs, grid = ref.TOKEN_AGG, {"agg": ref.TOKEN_AGG}
        conv, cands, notes = None, [], []
        if self.algorithm is not None:
            if "dual_clip" in get_algorithm(self.algorithm).reads():  # PPO-clip losses: the dual clip too
                grid["dual_clip"] = [None, 3.0]
            conv = ref.policy(self.algorithm, **self.hp)
            cands = ref.policy_grid([self.algorithm], self.hp, grid, rows_counted=True,
                                    exclude=(self.algorithm, self.hp))
            if self._kl_unseen():
                cands += ref.policy_grid([self.algorithm], {**self.hp, "beta": 0.0}, grid, rows_counted=True)
            cands += [c for c in ref.released(self.algorithm) if not ref.is_released(self.algorithm, self.hp)]
            notes = self._mismatches(conv)
        others = [a for a in POLICY_ALGORITHMS if a != self.algorithm]
        cands += ref.policy_grid(others, {"beta": 0.0}, {"agg": aggs})
        cases = partial(batch_of, seq_adv=True) if self.adapter.get("adv_shape") == "seq" else batch_of
        return Check(self.algorithm or "unknown", self.name, ", ".join(f"{k}={v}" for k, v in self.hp.items())
                     or "as called", self.run, conv, cands, cases, note=" ".join(notes),
                     exact=None if conv is None else ref.exact_policy(self.algorithm, **self.hp),
                     dtype=self.dtype)

    def _kl_unseen(self) -> bool:
        """The claimed reference has a KL term, and the callable takes no reference log-probs to compute one."""
        return "ref_logp" not in self.binding and resolve_hparams(self.algorithm, dict(self.hp))["beta"] > 0

    def _mismatches(self, conv) -> list[str]:
        """Every mismatch between the claim and the callable that can be seen before the checks run."""
        hp = resolve_hparams(self.algorithm, dict(self.hp))
        notes = []
        if self._kl_unseen():
            notes.append(f"The reference {self.algorithm} has a KL term (beta={hp['beta']:g}, {hp['kl']}) and "
                         f"{self.name} takes no reference log-probs: a loss without a KL term is "
                         f"{self.algorithm} with beta=0 (adapter beta=0).")
        if hp["agg"] in GROUP_AGG_MODES and "group_size" not in self.binding:
            batch = (" A loss divided by the batch's token count, as verl, TRL and OpenRLHF compute DAPO, is "
                     "agg=token_mean (adapter agg=token_mean)." if hp["agg"] == "group_token_mean" else "")
            notes.append(f"The reference aggregates per group (agg={hp['agg']}) and {self.name} takes no group "
                         f"size, so it cannot compute that; one that does takes it (adapter group_size=PARAM).{batch}")
        if "adv_shape" not in self.adapter and self._agrees_only_per_sequence(conv):
            notes.append(f"Called with one advantage per sequence, shape [B], {self.name} agrees with the "
                         "reference on probe batches: add adv_shape=seq to the adapter (the default passes "
                         "[B, T]).")
        return notes

    def _agrees_only_per_sequence(self, conv) -> bool:
        """On a few probe batches with per-sequence advantages, the callable agrees with the reference (or with it
        at beta=0 if it cannot see a KL term) when given [B] advantages, and not when given [B, T]."""
        refs = [conv] + ([ref.policy(self.algorithm, **{**self.hp, "beta": 0.0})] if self._kl_unseen() else [])
        batches = [b for b in (batch_of(s, "typical", seq_adv=True) for s in range(3)) if b.mask.sum() > 0]

        def agrees(shape):
            try:
                got = [self.run(b, adv_shape=shape) for b in batches]
            except Exception:  # noqa: BLE001 (a callable that raises on this shape does not agree with it)
                return False
            return any(all(max(scaled_diff(v, want[0]), scaled_diff(g, want[1])) <= TOLERANCE
                           for (v, g, _), want in zip(got, (r.fn(b) for b in batches))) for r in refs)
        return agrees("seq") and not agrees("token")
