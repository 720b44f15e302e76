"""Liger-Kernel's ``LigerFusedLinearGRPOLoss`` (compiled=False, torch only), driven out of process
(``.venv-targets/liger``, ``workers/liger.py``) through a known output layer: fixed weight W [V, H], hidden states
h [B, T, H] and token ids drawn per batch. The reference sees the log-probs log_softmax(h W^T)[id] computed here
in float64; the gradient w.r.t. each token's log-prob is read back from Liger's gradient w.r.t. h.

The worker's op ``loss``: kw = LigerFusedLinearGRPOLoss's keywords (compiled=False always); arrays hidden [B, T, H],
weight [V, H], ids [B, T] (int), mask, old_logp, ref_logp [B, T] and adv [B]. Reply {"loss": float,
"grad_hidden": [B, T, H], "grad_weight": [V, H]}."""
from __future__ import annotations

import functools

import numpy as np
import torch

from harness.conform.cases import Batch, Check, lay_log_ratio, tolerance_of
from harness.conform.targets.remote import RemoteTarget, TargetError, loss_and_grad
from harness.conform.targets.unsloth import AGGS, grpo_check, loss_type_checks, row_advantages, seq_batch

VOCAB, HIDDEN = 32, 8
TOLERANCE = tolerance_of("float32")  # Liger computes log-probs and the loss in float32 whatever the input dtype
BIAS_NOTE = ("With the reference log-probs tens of nats above the policy's (x = ref - logp), Liger's float32 "
             "gradient of the bias-corrected term r * k3 is lost to cancellation: its two parts, r * k3 and "
             "r * (1 - e^x), are each about e^x / x times their sum -r * x (3e9 times at x = 25), and float32 "
             "keeps each to about 6e-8 of its size.")


@functools.lru_cache(maxsize=1)
def output_weight() -> np.ndarray:
    """The output layer's weight W [V, H], N(0, 1) from a fixed seed."""
    return np.random.default_rng(7).normal(0.0, 1.0, (VOCAB, HIDDEN))


def with_layer(b: Batch, seed: int) -> Batch:
    """The batch plus hidden states N(0, 0.3^2) (log-probs near -log V, no token near probability 1) and ids."""
    rng = np.random.default_rng(40_000 + seed)
    b.extra["hidden"] = rng.normal(0.0, 0.3, b.mask.shape + (HIDDEN,))
    b.extra["ids"] = rng.integers(0, VOCAB, b.mask.shape)
    return b


def layer(hidden, ids):
    """Float64 log-probs log_softmax(h W^T)[id] [B, T], d logp / d h [B, T, H], and the softmax [B, T, V]."""
    w = torch.tensor(output_weight())
    logits = torch.tensor(hidden) @ w.T
    ids = torch.as_tensor(ids, dtype=torch.long)
    probs = torch.softmax(logits, -1)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]
    return logp.numpy(), (w[ids] - probs @ w).numpy(), probs.numpy()


def logp_grad(name: str, out: dict, hidden, ids, jac, probs, tolerance: float) -> np.ndarray:
    """d loss / d logp from the gradient w.r.t. h: h[b, t] reaches the loss only through logp[b, t], so
    dL/dh[b, t] = g[b, t] * d logp[b, t] / d h[b, t]. A TargetError when Liger's gradient w.r.t. h has a part
    off that direction, or its gradient w.r.t. W is not the one g implies."""
    grad_h = np.asarray(out.get("grad_hidden"), dtype=float)
    grad_w = np.asarray(out.get("grad_weight"), dtype=float)
    if grad_h.shape != jac.shape or grad_w.shape != (VOCAB, HIDDEN):
        raise TargetError(f"{name}: returned gradients of shapes {grad_h.shape} and {grad_w.shape}; expected "
                          f"{jac.shape} and {(VOCAB, HIDDEN)}")
    g = (grad_h * jac).sum(-1) / (jac * jac).sum(-1)
    onehot = np.eye(VOCAB)[np.asarray(ids, dtype=int)]
    want_w = np.einsum("bt,btv,bth->vh", g, onehot - probs, hidden)
    for what, got, want in (("hidden states", grad_h, g[..., None] * jac), ("weight", grad_w, want_w)):
        if np.abs(got - want).max(initial=0.0) > tolerance * max(1.0, np.abs(want).max(initial=0.0)):
            raise TargetError(f"{name}: the gradient w.r.t. the {what} is not d loss / d logp through the layer")
    return g


def layer_batch(cases):
    return lambda seed, family: with_layer(cases(seed, family), seed)


class Target(RemoteTarget):
    name = "liger"
    tolerance = TOLERANCE
    timeout_s = 120.0
    how = (f"Each loss is `LigerFusedLinearGRPOLoss(compiled=False, **kw)(h, W, ids, mask, advantages, "
           "ref_per_token_logps=..., old_per_token_logps=...)` (chunk_size 1, one advantage per response) "
           f"on a fixed output weight W [{VOCAB}, {HIDDEN}] and hidden states h ~ N(0, 0.3^2) drawn per "
           "batch; old and reference log-probs are the batch's log-ratios laid on the layer's float64 "
           "log-probs, which the reference reads. Liger works in float32 whatever the input dtype, hence "
           "the float32 tolerance. The gradient w.r.t. each token's log-prob is Liger's gradient w.r.t. "
           "that token's hidden state divided along d logp / d h (a case fails if any of that gradient, or "
           "of the weight's, is off what it implies). Liger's module defaults are checked as a direct "
           "caller gets them (TRL 1.16's trainer no longer calls Liger's GRPO loss).")

    def run(self, kw: dict):
        def run(b: Batch):
            hidden, ids = b.extra["hidden"], b.extra["ids"]
            logp, jac, probs = layer(hidden, ids)
            used = Batch(logp, lay_log_ratio(logp, b.logp - b.old_logp), b.adv, b.mask,
                         logp + (b.ref_logp - b.logp), b.group_size, b.extra)
            out = self.worker.call("loss", kw, hidden=hidden, weight=output_weight(), ids=ids, mask=b.mask,
                                   adv=row_advantages(b), old_logp=used.old_logp, ref_logp=used.ref_logp)
            value, _ = loss_and_grad(self.name, out, b.mask.shape)
            return value, logp_grad(self.name, out, hidden, ids, jac, probs, self.tolerance), used
        return run

    def _check(self, name, knob, kw, ref_hp, grid, names=None, note=""):
        call = "LigerFusedLinearGRPOLoss(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"
        cases = layer_batch(seq_batch)
        return grpo_check(name, call, knob, self.run(kw), ref_hp, grid, names, note, cases=cases,
                          tolerance=self.tolerance, reads_more="; logp is the layer's log-prob of the drawn ids at "
                          "the drawn hidden states, old_logp and ref_logp keep their offsets from it")

    def checks(self) -> list[Check]:
        defaults = self._check("dapo", "defaults (loss_type 'dapo', epsilon 0.2 / 0.2, beta 0.04)", {}, {},
                               {"agg": AGGS, "eps_high": [0.28, 0.2], "beta": [0.0, 0.04]},
                               note="The module's own defaults, which a direct caller gets; a trainer passes its own "
                               "(TRL's GRPOConfig: beta 0, loss_type 'dapo', epsilon 0.2).")
        vespo = self._check("vespo", "loss_type='vespo' (k 2 / 3, lambda 3 / 2), beta=0",
                            {"loss_type": "vespo", "beta": 0.0}, {}, {"agg": AGGS},
                            note="Liger's get_gamma_weights follows TRL's: each token's log-ratio clamped to "
                                 "[-20, 20] and the row's summed log-weight to [log 1e-8, 20] before phi.")
        return [defaults] + loss_type_checks(self._check, bias_note=BIAS_NOTE) + [vespo]
