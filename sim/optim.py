"""Optimisers for the tabular parameters, updating arrays in place.

``blocks`` > 1: the parameters are that many stacked copies of equal size (the simulator's seeds, one under the
other); ``step(grad, only=...)`` may update some of them, and each keeps its own step count, so every copy follows
exactly the trajectory it would follow alone.
"""
from __future__ import annotations

import numpy as np


class _Blocked:
    """Step bookkeeping shared by the optimisers: which copies a step updates, and on which rows."""

    def __init__(self, params: np.ndarray, lr: float, blocks: int):
        _check_lr(lr)
        self.params, self.lr, self.blocks = params, lr, blocks
        self.t = np.zeros(blocks, dtype=np.int64)  # steps taken by each copy

    def step(self, grad: np.ndarray, rows=None, only=None) -> None:
        """One step on every copy, or on the copies listed in ``only`` (the others are left as they are).
        ``rows``: ``grad`` holds only these parameter rows (distinct; every other row's gradient is 0)."""
        chosen = range(self.blocks) if only is None else list(only)
        self.t[chosen] += 1
        if len(chosen) == self.blocks and (self.t == self.t[0]).all():
            self._update(slice(None), grad, int(self.t[0]), rows)
            return
        if rows is not None:
            grad = self._dense(grad, rows)
        n = len(self.params) // self.blocks
        for b in chosen:
            part = slice(b * n, (b + 1) * n)
            self._update(part, grad[part], int(self.t[b]), None)

    def _dense(self, grad, rows):
        """The full gradient of one given on ``rows`` only."""
        full = np.zeros(self.params.shape)
        full[rows] = grad
        return full


class SGD(_Blocked):
    """SGD with optional heavy-ball momentum: v = mu v + g; x -= lr v."""

    def __init__(self, params: np.ndarray, lr: float, momentum: float = 0.0, blocks: int = 1):
        super().__init__(params, lr, blocks)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum: expected a number in [0, 1), got {momentum!r}")
        self.momentum = momentum
        self.velocity = np.zeros_like(params)

    def _update(self, part, grad, t, rows) -> None:
        if rows is not None:
            grad = self._dense(grad, rows)
        self.velocity[part] = self.momentum * self.velocity[part] + grad
        self.params[part] -= self.lr * self.velocity[part]


class Adam(_Blocked):
    """Adam (Kingma and Ba 1412.6980, Algorithm 1) with bias correction."""

    def __init__(self, params: np.ndarray, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, blocks: int = 1):
        super().__init__(params, lr, blocks)
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas: expected two numbers in [0, 1), got {betas!r}")
        self.betas, self.eps = betas, eps
        self.m, self.v = np.zeros_like(params), np.zeros_like(params)
        self.scratch = np.empty_like(params)  # the step's temporaries, written in place

    def _update(self, part, grad, t, rows) -> None:
        b1, b2 = self.betas
        m, v, tmp = self.m[part], self.v[part], self.scratch[part]
        m *= b1
        v *= b2
        if rows is None:
            m += np.multiply(grad, 1 - b1, out=tmp)
            np.multiply(grad, 1 - b2, out=tmp)
            tmp *= grad  # (1 - b2) * grad * grad, in that order
            v += tmp
        else:  # the other rows would add exact zeros
            m[rows] += (1 - b1) * grad
            v[rows] += (1 - b2) * grad * grad
        # lr * m_hat / (sqrt(v_hat) + eps), with the bias corrections folded into the step and eps
        c2 = np.sqrt(1 - b2 ** t)
        denom = np.sqrt(v, out=tmp)
        denom += self.eps * c2
        np.divide(m, denom, out=denom)
        denom *= self.lr * c2 / (1 - b1 ** t)
        self.params[part] -= denom


def make(name: str, params: np.ndarray, lr: float, blocks: int = 1, **kw):
    """Build the optimiser called ``name`` ("adam" or "sgd") over ``params`` (``blocks`` stacked copies)."""
    if name == "adam":
        return Adam(params, lr, blocks=blocks, **kw)
    if name == "sgd":
        return SGD(params, lr, blocks=blocks, **kw)
    raise ValueError(f"optimizer: expected 'adam' or 'sgd', got {name!r}")


def _check_lr(lr):
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr: expected a number > 0, got {lr!r}")
