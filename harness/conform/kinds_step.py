"""A user's training step (``cliplab conform module:function --level step --adapter algorithm=NAME,...``): the
callable is the loss a trainer backpropagates for one micro-batch, called as a trainer with gradient accumulation
and data-parallel ranks calls it, each call given the step's counts:

- ``num_items_in_batch``: the unmasked tokens of the generation batch over every rank (TRL's, a 0-d tensor);
- ``gradient_accumulation_steps``: micro-batches per rank in one optimisation step;
- ``num_processes``: data-parallel ranks (their gradients are averaged, as DDP's all-reduce does);
- ``steps_per_generation``: optimisation steps per generation batch, times gradient_accumulation_steps (TRL's
  count of micro-batches per generation batch).

The gradients are summed over each rank's micro-batches and averaged over the ranks, as a trainer's backward
passes and all-reduce do. With ``steps_per_generation = gradient_accumulation_steps`` one step uses the generation
batch; with twice as many, the generation batch (twice the rows) spans two steps, and the check compares the mean
of the two steps' gradients (the policy unchanged between them) with the reference's on the whole generation batch:
a normaliser of the generation batch's tokens must be scaled by gradient_accumulation_steps / steps_per_generation
(TRL's fix for its dapo, cispo and vespo losses). Each runs in float64, float32 and bfloat16 (inputs rounded to
the dtype, held to ``tolerance_of`` it, or of the dtype the loss comes back in if coarser). The reference is the
claimed algorithm's loss on the whole batch (``harness.conform.step`` reports the factor per micro-batch size and
rank count); the bug classes a step may show instead are named by the step they reproduce on every split
(``bug_classes``)."""
from __future__ import annotations

import math

import numpy as np
import torch

from spec.contract import resolve_hparams
from spec.registry import HPARAMS

from harness.conform.kinds import DTYPES, rounded
from harness.conform.cases import STEP_ROWS, Batch, NotApplicable, StepCheck, bind_params, step_batch, tolerance_of
from harness.conform.targets import callable as user
from harness.conform.targets import reference as ref

ALIASES = {"num_items_in_batch": ("num_items_in_batch", "num_tokens", "global_num_tokens", "total_tokens"),
           "gradient_accumulation_steps": ("gradient_accumulation_steps", "current_gradient_accumulation_steps",
                                           "grad_accum", "accumulation_steps"),
           "num_processes": ("num_processes", "world_size", "dp_size"),
           "steps_per_generation": ("steps_per_generation",)}
#: Optimisation steps per generation batch: one (steps_per_generation = gradient_accumulation_steps) and two.
SPANS = (1, 2)


def split(n_rows: int, micro, ranks: int, span: int) -> list[list[list[np.ndarray]]]:
    """Row indices per optimisation step, rank and micro-batch: ``ranks`` contiguous shares of the generation batch,
    each cut into ``span`` steps of micro-batches of ``micro`` rows (None: a rank's whole share of a step)."""
    if n_rows % (ranks * span):
        raise NotApplicable(f"{ranks} ranks x {span} steps do not divide the generation batch's {n_rows} rows")
    shares = [np.split(local, span) for local in np.split(np.arange(n_rows), ranks)]
    size = micro or len(shares[0][0])
    if len(shares[0][0]) % size:
        raise NotApplicable(f"micro-batches of {size} rows do not divide a step's {len(shares[0][0])} rows per rank")
    return [[np.split(share[s], len(share[s]) // size) for share in shares] for s in range(span)]


def micro_batch(b: Batch, rows) -> Batch:
    """The rows ``rows`` of ``b``, with the groups that fit in them (a micro-batch may cut a group)."""
    return b.take(rows=rows, group_size=math.gcd(len(rows), b.group_size))


def accumulate(b: Batch, steps, loss_grad) -> np.ndarray:
    """The mean over the steps of each step's gradient: per rank the sum of ``loss_grad(micro-batch rows)`` over
    its micro-batches, averaged over the ranks."""
    grad = np.zeros(b.mask.shape)
    for step in steps:
        for micro_batches in step:
            for rows in micro_batches:
                grad[rows] += loss_grad(rows) / len(step) / len(steps)
    return grad


def bug_classes(conv, algorithm: str, hp: dict) -> dict:
    """Steps a trainer gets wrong, by name: f(batch, micro, ranks, span) -> the gradient it accumulates, built from
    the reference ``conv`` (its loss on a sub-batch: ``conv.fn(sub)``)."""
    agg = resolve_hparams(algorithm, {**hp, "max_len": hp.get("max_len") or 1})["agg"]

    def scaled(factor):
        return lambda b, micro, ranks, span: conv.fn(b)[1] * factor(len(split(len(b.mask), micro, ranks, span)[0][0]),
                                                                   ranks, span)

    def per_micro_batch(b, micro, ranks, span):
        steps = split(len(b.mask), micro, ranks, span)
        ga = len(steps[0][0])
        return accumulate(b, steps, lambda rows: conv.fn(micro_batch(b, rows))[1] / ga)
    return {
        "loss divided again by gradient_accumulation_steps (factor 1 / gradient_accumulation_steps)":
            scaled(lambda ga, ranks, span: 1 / ga),
        "normaliser of the generation batch, not the step (factor gradient_accumulation_steps / "
        "steps_per_generation: num_items_in_batch counts every step of the generation batch)":
            scaled(lambda ga, ranks, span: 1 / span),
        "the ranks' mean not undone (factor 1 / num_processes: a global count divided by the ranks' all-reduce "
        "mean again)": scaled(lambda ga, ranks, span: 1 / ranks),
        f"a {agg} per micro-batch (each normalised by its own count, divided by gradient_accumulation_steps) "
        f"instead of the step's {agg}": per_micro_batch,
    }


class UserStep:
    """A user's per-micro-batch loss driven through one optimisation step (see the module's docstring): the
    step-level target of ``module:function`` (or a function object) with an adapter of a policy loss's keys and
    the parameter names of the step's counts (ALIASES)."""

    def __init__(self, target, adapter: str | dict | None):
        items = user_items(adapter)
        counts = {k: v for k, v in items if k in ALIASES}
        rest = [(k, v) for k, v in items if k not in ALIASES and (k, v) != ("kind", "step")]  # kind=step: this
        policy = user.parse_adapter(dict(rest) if isinstance(adapter, dict) else ",".join(f"{k}={v}" for k, v in rest))
        if policy.get("kind", "policy") != "policy":
            raise ValueError(f"adapter: --level step checks a policy loss's training step, not kind={policy['kind']}")
        if "algorithm" not in policy:
            raise ValueError("adapter: algorithm=NAME is required for a module:function step (what its loss "
                             "implements)")
        self.algorithm = policy["algorithm"]
        self.hp = {k: v for k, v in policy.items() if k in HPARAMS}
        resolve_hparams(self.algorithm, dict(self.hp))  # a bad claimed setting fails here, with its name
        self.adapter = policy
        self.name = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        self.runner = user._Child(target, self.name, policy.get("timeout_s", user.TIMEOUT_S))
        signature = self.runner.load()
        if "error" in signature:
            raise ValueError(signature["error"])
        self.counts = bind_params(signature, counts, ALIASES)
        rest = {**signature, "params": [p for p in signature["params"] if p[0] not in self.counts.values()]}
        self.binding = user.bind(rest, policy)
        self.versions = {"callable": self.name, "torch": torch.__version__.split("+")[0]}
        self.how = (f"`{self.name}` is called in a child process once per micro-batch with float64 tensors bound as "
                    f"{self.binding} and the step's counts as {self.counts or 'none (it takes none)'}; its "
                    "gradients are summed over each rank's micro-batches and averaged over the ranks.")
        self.dtype = "float64"

    def call(self, b: Batch, rows, counts: dict, dtype: str = "float64") -> np.ndarray:
        """d loss / d logp of the callable on the micro-batch ``rows`` of ``b`` in ``dtype``, given the step's
        ``counts``."""
        mb = micro_batch(b, rows)
        arrays = {"logp": mb.logp, "old_logp": mb.old_logp, "adv": mb.adv, "mask": mb.mask, "ref_logp": mb.ref_logp}
        how = {"binding": self.binding, "group_size": mb.group_size, "returns": self.adapter.get("returns", 0),
               "dtype": dtype,
               "adv_shape": self.adapter.get("adv_shape", "token"),
               "counts": {k: [self.counts[k], v] for k, v in counts.items() if k in self.counts}}
        out = self.runner.call(how, {k: v for k, v in arrays.items() if k in self.binding})
        if "bad" in out:
            raise user.BadReturn(f"{self.name} {out['bad']}; expected {user.EXPECTED}")
        if "raised" in out:
            raise user._rebuilt(*out["raised"])
        self.dtype = out.get("dtype", self.dtype)
        return np.asarray(out["grad"], dtype=float)

    def step(self, span: int, dtype: str):
        """The step over ``span`` optimisation steps per generation batch, its inputs rounded to ``dtype`` (the
        reference is computed on what the callable saw)."""
        def run(b: Batch, micro, ranks):
            steps = split(len(b.mask), micro, ranks, span)
            counts = {"num_items_in_batch": float(b.mask.sum()), "gradient_accumulation_steps": len(steps[0][0]),
                      "num_processes": ranks, "steps_per_generation": len(steps[0][0]) * span}
            used = rounded(b, "step", dtype)
            return accumulate(used, steps, lambda rows: self.call(used, rows, counts, dtype)), used
        return run

    def step_checks(self) -> list[StepCheck]:
        conv = ref.policy(self.algorithm, **self.hp)
        self.call(step_batch(0), np.arange(2), {"num_items_in_batch": 1.0, "gradient_accumulation_steps": 1,
                                                 "num_processes": 1, "steps_per_generation": 1})  # its dtype
        classes = bug_classes(conv, self.algorithm, self.hp)
        out = []
        for span in SPANS:
            knob = ("steps_per_generation = gradient_accumulation_steps" if span == 1 else
                    f"steps_per_generation = {span} x gradient_accumulation_steps (the step's gradient: the mean "
                    f"of the {span} steps of a generation batch)")
            out += [StepCheck(self.algorithm, self.name, f"{knob}, {dtype}", self.step(span, dtype), conv,
                              tolerance=max(tolerance_of(dtype), tolerance_of(self.dtype)),
                              batches=lambda s, f, span=span: step_batch(s, f, rows=STEP_ROWS * span),
                              candidates={k: (lambda b, m, r, fn=fn, span=span: fn(b, m, r, span))
                                          for k, fn in classes.items()}) for dtype in DTYPES]
        return out

    def close(self):
        self.runner.close()


def user_items(adapter) -> list:
    """The adapter's (key, value) items, from text (``key=value,...``, values kept as text for
    ``targets.callable.parse_adapter``) or a dict."""
    if isinstance(adapter, dict):
        return list(adapter.items())
    items = []
    for item in filter(None, (p.strip() for p in (adapter or "").split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not value:
            raise ValueError(f"adapter: expected key=value items separated by commas, got {item!r}")
        items.append((key, value))
    return items
