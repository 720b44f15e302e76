"""User callables of kind rollout_correction (``cliplab conform module:function --adapter
kind=rollout_correction,correction=tis|mis|seq_mis``): the weights that correct a policy loss for the mismatch
between the trainer's and the sampler's log-probs, checked against the gpu layer's ``gpu.rollout_weights``.

Conventions the reference follows, stated once (rho = exp(old_logp - rollout_logp) per token):

- TIS: min(rho, C) (Yao et al. 2025, truncated importance sampling); MIS: rho where C_lo <= rho <= C_hi, else 0
  (IcePop, Ring-1T report 2025); seq_mis: the same bounds on one weight per sequence, held by each of its tokens.
- The sequence weight is the product of the row's token ratios, exp(sum_t log rho_t) (``seq_weight=product``), or
  their geometric mean, exp(mean_t log rho_t) (``seq_weight=geometric``, verl's geometric mode); both over the
  row's unmasked tokens only, so padding and holes in a mask take no part.
- The weights are constants of the loss: no gradient flows through them into the trainer's log-probs, which the
  check passes as a tensor that requires grad (as a trainer's current log-probs do when they stand in for the old
  ones)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

import gpu
from spec.contract import resolve_hparams
from spec.registry import ROLLOUT_CORRECTIONS, ROLLOUT_READS
from spec.schema import did_you_mean

from harness.conform.cases import Check, Convention, rollout_batch

SEQ_WEIGHTS = {"product": "exp of the row's sum of log-ratios (the product of its token ratios)",
               "geometric": "exp of the row's mean log-ratio (the geometric mean of its token ratios)"}
OPTIONS = {"correction": f"what the callable implements: {', '.join(ROLLOUT_CORRECTIONS)}",
           "seq_weight": "seq_mis's sequence weight: " + "; ".join(f"{k}, {v}" for k, v in SEQ_WEIGHTS.items())
                         + " (default product)",
           "kept": "the item of a returned tuple that is a kept-token mask (multiplied into the weights), if any",
           **{k: f"the correction's bound (default {resolve_hparams('grpo', {})[k]:g})"
              for k in sorted({k for reads in ROLLOUT_READS.values() for k in reads})}}
ALIASES = {"old_logp": ("old_logp", "old_log_prob", "old_log_probs", "logp", "log_prob", "log_probs",
                        "per_token_logps", "old_per_token_logps"),
           "rollout_logp": ("rollout_logp", "rollout_log_probs", "rollout_log_prob", "sampling_logp",
                            "sampling_per_token_logps", "vllm_logprobs", "behavior_logp"),
           "mask": ("mask", "response_mask", "action_mask", "completion_mask", "loss_mask")}
REQUIRED = ("old_logp", "rollout_logp")
EXPECTED = ("a callable f(old_logp, rollout_logp[, mask]) -> per-token weights [B, T] ([B] for seq_mis; or a "
            "tuple whose item `returns` is one, and item `kept` a kept-token mask), not differentiable in old_logp")
READS = "old_logp (the trainer's log-probs), rollout_logp (the sampler's), mask"
PATHWISE = "weights not detached: gradient flows through them into the trainer's log-probs"


def parse(out: dict) -> dict:
    """Check and convert the adapter of kind rollout_correction (``out`` holds its items as text or numbers)."""
    correction = out.get("correction")
    if correction not in ROLLOUT_CORRECTIONS:
        raise ValueError("adapter: kind=rollout_correction needs correction=NAME"
                         + (f", got {correction!r}{did_you_mean(str(correction), ROLLOUT_CORRECTIONS)}"
                            if correction else "") + f"; expected one of {', '.join(ROLLOUT_CORRECTIONS)}")
    if "seq_weight" in out and correction != "seq_mis":
        raise ValueError(f"adapter: seq_weight applies to correction=seq_mis, not {correction}")
    if out.setdefault("seq_weight", "product") not in SEQ_WEIGHTS:
        raise ValueError(f"adapter: seq_weight={out['seq_weight']!r}; expected product or geometric")
    bounds = {k: out[k] for k in ROLLOUT_READS[correction] if k in out}
    others = [k for k in OPTIONS if k in out and k in ROLLOUT_READS["tis"] + ROLLOUT_READS["mis"]
              and k not in ROLLOUT_READS[correction]]
    if others:
        raise ValueError(f"adapter: {', '.join(others)} is not read by correction={correction} (it reads "
                         f"{', '.join(ROLLOUT_READS[correction])})")
    for key, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"adapter: {key}={value!r}; expected a number")
    try:
        hp = resolve_hparams("grpo", {"rollout_correction": correction, **bounds})
    except ValueError as exc:
        raise ValueError(f"adapter: {exc}") from None
    out.update({k: hp[k] for k in ROLLOUT_READS[correction]})
    kept = out.get("kept")
    if kept is not None and (not str(kept).isdigit() or int(kept) == out.get("returns", 0)):
        raise ValueError(f"adapter: kept={kept}; expected the index (>= 0) of the kept-token mask in the "
                         "returned tuple, another than returns")
    if kept is not None:
        out["kept"] = int(kept)
    return out


# ---- the reference's conventions and what a callable may compute instead ---------------------------------------

def _hp(correction: str, adapter: dict) -> dict:
    """The settings of ``correction``: the adapter's bounds, else the registry's defaults."""
    return resolve_hparams("grpo", {"rollout_correction": correction,
                                    **{k: adapter[k] for k in ROLLOUT_READS[correction] if k in adapter}})


def _row_weight(hp: dict, log_w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MIS's bounds on one log-weight per row, held by each of its tokens: gpu.rollout_weights's token MIS on the
    row's value."""
    return gpu.rollout_weights({**hp, "rollout_correction": "mis"}, log_w[:, None].expand_as(mask),
                               torch.zeros_like(mask), mask)[0]


def _log_rho(old, rollout, mask):
    return torch.where(mask > 0, old - rollout, torch.zeros_like(old))


def _forms(hp: dict) -> dict:
    """The weight forms of a seq_mis sequence weight, each f(old_logp, rollout_logp, mask) -> [B, T]: the two named
    ones and what a callable may compute instead."""
    lens = lambda m: m.sum(1).clamp(min=1.0)  # noqa: E731
    return {
        "product": lambda o, r, m: gpu.rollout_weights(hp, o, r, m)[0],
        "geometric": lambda o, r, m: _row_weight(hp, _log_rho(o, r, m).sum(1) / lens(m), m),
        "geometric mean over the padded width T (padding counted in the length)":
            lambda o, r, m: _row_weight(hp, _log_rho(o, r, m).sum(1) / m.shape[1], m),
        "product over the padded row (padding tokens' ratios counted)":
            lambda o, r, m: _row_weight(hp, (o - r).sum(1), m),
        "sum of the token ratios": lambda o, r, m: _row_weight(hp, torch.log(
            torch.where(m > 0, torch.exp(o - r), torch.zeros_like(o)).sum(1)), m),
        "arithmetic mean of the token ratios": lambda o, r, m: _row_weight(hp, torch.log(
            torch.where(m > 0, torch.exp(o - r), torch.zeros_like(o)).sum(1) / lens(m)), m),
    }


def _weights(fn, b, pathwise: bool) -> tuple[np.ndarray, np.ndarray]:
    """(weights on the mask, d sum(weights) / d old_logp): ``fn`` on the trainer's log-probs, through which the
    gradient flows with ``pathwise`` and not otherwise (the reference's weights are constants)."""
    t = lambda x: torch.tensor(np.asarray(x, dtype=np.float64))  # noqa: E731
    mask = t(b.mask)
    old = t(b.old_logp).requires_grad_(True)
    with warnings.catch_warnings():  # gpu.rollout_weights's stats read the weights as numbers
        warnings.filterwarnings("ignore", "Converting a tensor with requires_grad", UserWarning)
        w = fn(old if pathwise else old.detach(), t(b.extra["rollout_logp"]), mask)
    on = torch.where(mask > 0, w, torch.zeros_like(w))
    if pathwise and on.requires_grad:
        on.sum().backward()
    grad = old.grad if old.grad is not None else torch.zeros_like(old)
    return on.detach().numpy(), grad.numpy()


def label_of(correction: str, adapter: dict, seq_weight: str | None = None) -> str:
    """The claim in words: the correction, its bounds and (seq_mis) its sequence weight."""
    hp = _hp(correction, adapter)
    if correction == "tis":
        return f"tis: min(rho, {hp['tis_cap']:g})"
    bounds = f"kept in [{hp['mis_low']:g}, {hp['mis_high']:g}]"
    if correction == "mis":
        return f"mis: each token's rho {bounds}"
    if correction == "seq_mis":
        return f"seq_mis[{seq_weight}]: the row's {seq_weight} of rho {bounds}"
    return f"{correction}: {bounds} (spec.registry)"


def _form(correction: str, hp: dict, form: str):
    """f(old_logp, rollout_logp, mask) -> weights [B, T] of a correction: gpu.rollout_weights for tis and mis, a
    seq_mis weight of ``form`` (see ``_forms``)."""
    if correction == "seq_mis":
        return _forms(hp)[form]
    return lambda o, r, m: gpu.rollout_weights(hp, o, r, m)[0]


def convention(correction: str, adapter: dict, seq_weight: str = "product", pathwise: bool = False,
               form: str | None = None) -> Convention:
    """A correction's weights (the reference with the defaults): seq_mis's ``form`` (see ``_forms``; default
    ``seq_weight``) or the token correction; ``pathwise``: with the gradient its weights carry when they are not
    detached (a variant of the same weights, named by what changed)."""
    fn = _form(correction, _hp(correction, adapter), form or seq_weight)
    label = label_of(correction, adapter, seq_weight) if form is None else f"seq_mis with the {form}"
    base = convention(correction, adapter, seq_weight, form=form) if pathwise else None
    return Convention(f"{label}, {PATHWISE}" if pathwise else label, lambda b: _weights(fn, b, pathwise),
                      named=form is None, base=base, part=PATHWISE if pathwise else "")


def reference(adapter: dict) -> Convention:
    return convention(adapter["correction"], adapter, adapter["seq_weight"])


def candidates(adapter: dict) -> list[Convention]:
    """What a callable claiming ``adapter``'s correction may compute instead, each named: the other corrections and
    sequence weights, the other ways to form a sequence weight (seq_mis), the ratio inverted, TIS's cap as a floor,
    and each named correction (the reference too) with its weights not detached."""
    correction, hp, mine = adapter["correction"], _hp(adapter["correction"], adapter), reference(adapter).label
    claims = [(c, w) for c in ROLLOUT_CORRECTIONS for w in (SEQ_WEIGHTS if c == "seq_mis" else ("product",))]
    out = [c for c in (convention(c, adapter, w) for c, w in claims) if c.label != mine]
    if correction == "seq_mis":
        out += [convention("seq_mis", adapter, form=f) for f in _forms(hp) if f not in SEQ_WEIGHTS]
    fn = _form(correction, hp, adapter["seq_weight"])
    out.append(Convention(f"{mine}, with the ratio inverted (exp(rollout_logp - old_logp))",
                          lambda b: _weights(lambda o, r, m: fn(r, o, m), b, False), named=False))
    if correction == "tis":
        out.append(Convention(f"tis with its cap on the wrong side: max(rho, {hp['tis_cap']:g})",
                              lambda b: _weights(lambda o, r, m: torch.clamp(torch.exp(_log_rho(o, r, m)),
                                                                             min=hp["tis_cap"]), b, False),
                              named=False))
    return out + [convention(c, adapter, w, pathwise=True) for c, w in claims]


def checks(name: str, adapter: dict, run, dtypes: tuple) -> list[Check]:
    """One check per dtype of the callable ``name``; ``run(batch, dtype)`` calls it."""
    ref, cands = reference(adapter), candidates(adapter)
    return [Check("rollout_correction", name, f"{ref.label.split(':')[0]}, {dtype}",
                  lambda b, dtype=dtype: run(b, dtype), ref, cands, rollout_batch, ("typical", "extreme"),
                  reads=READS, dtype=dtype) for dtype in dtypes]
