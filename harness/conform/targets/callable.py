"""A user callable ``module:function`` computing a policy loss from torch tensors. An adapter description maps the
callable's parameters and names what it claims to implement, e.g.
``algorithm=dapo,agg=token_mean,logp=log_prob,old_logp=old_log_prob,adv=advantages,mask=response_mask,returns=0``.
Parameters named like verl's, TRL's or OpenRLHF's are recognised without an adapter."""
from __future__ import annotations

import importlib
import inspect

import torch

from spec.contract import resolve_hparams
from spec.registry import AGG_MODES, HPARAMS, POLICY_ALGORITHMS

from harness.conform.cases import Check, batch_of
from harness.conform.targets import reference as ref
from harness.conform.targets.reference import t64

ALIASES = {
    "logp": ("logp", "log_prob", "log_probs", "logprobs", "per_token_logps"),
    "old_logp": ("old_logp", "old_log_prob", "old_log_probs", "old_per_token_logps"),
    "adv": ("adv", "advantages", "advantage"),
    "mask": ("mask", "response_mask", "action_mask", "completion_mask", "loss_mask"),
    "ref_logp": ("ref_logp", "ref_log_prob", "ref_log_probs", "ref_per_token_logps"),
    "group_size": ("group_size", "num_generations"),
}
EXPECTED = ("a callable f(logp, old_logp, adv, mask[, ref_logp][, group_size]) -> loss (a 0-d torch tensor "
            "differentiable in logp, or a tuple whose item `returns` is one); [B, T] float64 tensors")


def parse_adapter(text: str | None) -> dict:
    """``key=value,...`` -> dict; keys are algorithm, returns, our argument names, and hyper-parameters."""
    out = {}
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ValueError(f"adapter: expected key=value items separated by commas, got {item!r}")
        if key not in ("algorithm", "returns", *ALIASES, *HPARAMS):
            raise ValueError(f"adapter: unknown key {key!r}; expected algorithm, returns, one of "
                             f"{', '.join(ALIASES)} (= the callable's parameter name) or a hyper-parameter "
                             f"({', '.join(HPARAMS)})")
        out[key] = _number(value) if key in HPARAMS or key == "returns" else value
    if "algorithm" in out and out["algorithm"] not in POLICY_ALGORITHMS:
        raise ValueError(f"adapter: unknown algorithm {out['algorithm']!r}; expected one of "
                         f"{', '.join(POLICY_ALGORITHMS)}")
    if "agg" in out and out["agg"] not in AGG_MODES:
        raise ValueError(f"adapter: unknown aggregation mode {out['agg']!r}; expected one of {', '.join(AGG_MODES)}")
    return out


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
    except Exception as exc:  # an outside module may fail in any way while importing
        raise ValueError(f"target: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"target: {module_name!r} has no callable {attr!r}; expected {EXPECTED}")
    return fn


def bind(fn, adapter: dict) -> dict:
    """Our argument name -> the callable's parameter name; a ValueError if a required parameter is left over."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ValueError(f"target: cannot read the signature of {fn!r}; expected {EXPECTED}") from None
    names = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    binding = {}
    for ours, aliases in ALIASES.items():
        given = adapter.get(ours)
        if given is not None:
            if given not in names:
                raise ValueError(f"adapter: {ours}={given!r}, but the callable has no parameter {given!r} "
                                 f"(it has {', '.join(sorted(names)) or 'none'})")
            binding[ours] = given
        else:
            found = [a for a in aliases if a in names]
            if found:
                binding[ours] = found[0]
    missing = [ours for ours in ("logp", "old_logp", "adv", "mask") if ours not in binding]
    required = [n for n, p in params.items() if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in binding.values()]
    if missing or required:
        raise ValueError(f"target: wrong signature {fn.__name__}{inspect.signature(fn)}: "
                         + (f"no parameter for {', '.join(missing)}" if missing else "")
                         + ("; " if missing and required else "")
                         + (f"cannot fill {', '.join(required)}" if required else "")
                         + f"; expected {EXPECTED} (or an adapter such as logp=NAME,old_logp=NAME,adv=NAME,mask=NAME)")
    return binding


class CallableTarget:
    def __init__(self, target: str, adapter: str | None):
        self.fn = load_callable(target)
        self.adapter = parse_adapter(adapter)
        self.binding = bind(self.fn, self.adapter)
        self.name = target
        self.algorithm = self.adapter.get("algorithm")
        self.hp = {k: v for k, v in self.adapter.items() if k in HPARAMS}
        if self.algorithm is not None:
            resolve_hparams(self.algorithm, self.hp)  # a bad claimed hyper-parameter fails here, with its name
        elif self.hp:
            raise ValueError("adapter: hyper-parameters need algorithm=NAME (what the callable implements)")
        self.versions = {"callable": target, "torch": torch.__version__.split("+")[0]}
        self.how = (f"`{target}` is called with float64 [B, T] tensors bound as {self.binding}; the gradient is "
                    "d loss / d logp by autograd.")
        self._probe()

    def _probe(self):
        """Call once on a small batch so that a wrong signature or return type fails with what was expected."""
        try:
            value, _, _ = self.run(batch_of(0, "typical"))
        except (TypeError, AttributeError, IndexError, KeyError) as exc:
            raise ValueError(f"target: calling {self.name} failed ({type(exc).__name__}: {exc}); expected "
                             f"{EXPECTED}") from None
        if not isinstance(value, float):
            raise ValueError(f"target: {self.name} returned {type(value).__name__}; expected {EXPECTED}")

    def run(self, b):
        logp = t64(b.logp, grad=True)
        args = {"logp": logp, "old_logp": t64(b.old_logp), "adv": t64(b.adv), "mask": t64(b.mask),
                "ref_logp": t64(b.ref_logp), "group_size": b.group_size}
        out = self.fn(**{self.binding[k]: v for k, v in args.items() if k in self.binding})
        if isinstance(out, (tuple, list)):
            out = out[int(self.adapter.get("returns", 0))]
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise TypeError(f"returned {type(out).__name__}, not a one-element tensor")
        if out.requires_grad:
            out.reshape(()).backward()
        grad = logp.grad if logp.grad is not None else torch.zeros_like(logp)
        return float(out.detach()), grad.numpy(), b

    def checks(self) -> list[Check]:
        aggs = ref.TOKEN_AGG
        conv, cands = None, []
        if self.algorithm is not None:
            conv = ref.policy(self.algorithm, **self.hp)
            cands = ref.policy_grid([self.algorithm], self.hp, {"agg": aggs, "dual_clip": [None, 3.0]},
                                    rows_counted=True, exclude=(self.algorithm, self.hp))
            cands += [c for c in ref.released(self.algorithm) if not ref.is_released(self.algorithm, self.hp)]
        others = [a for a in POLICY_ALGORITHMS if a != self.algorithm]
        cands += ref.policy_grid(others, {"beta": 0.0}, {"agg": aggs})
        return [Check(self.algorithm or "unknown", self.name, ", ".join(f"{k}={v}" for k, v in self.hp.items())
                      or "as called", self.run, conv, cands, batch_of,
                      exact=None if conv is None else ref.exact_policy(self.algorithm, **self.hp))]
