"""Optimisers for the tabular parameters, updating arrays in place."""
from __future__ import annotations

import numpy as np


class SGD:
    """SGD with optional heavy-ball momentum: v = mu v + g; x -= lr v."""

    def __init__(self, params: np.ndarray, lr: float, momentum: float = 0.0):
        _check_lr(lr)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum: expected a number in [0, 1), got {momentum!r}")
        self.params, self.lr, self.momentum = params, lr, momentum
        self.velocity = np.zeros_like(params)

    def step(self, grad: np.ndarray) -> None:
        self.velocity = self.momentum * self.velocity + grad
        self.params -= self.lr * self.velocity


class Adam:
    """Adam (Kingma and Ba 1412.6980, Algorithm 1) with bias correction."""

    def __init__(self, params: np.ndarray, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        _check_lr(lr)
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas: expected two numbers in [0, 1), got {betas!r}")
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m, self.v, self.t = np.zeros_like(params), np.zeros_like(params), 0

    def step(self, grad: np.ndarray) -> None:
        b1, b2 = self.betas
        self.t += 1
        self.m *= b1
        self.m += (1 - b1) * grad
        self.v *= b2
        self.v += (1 - b2) * grad * grad
        # lr * m_hat / (sqrt(v_hat) + eps), with the bias corrections folded into the step and eps
        c2 = np.sqrt(1 - b2 ** self.t)
        denom = np.sqrt(self.v)
        denom += self.eps * c2
        np.divide(self.m, denom, out=denom)
        denom *= self.lr * c2 / (1 - b1 ** self.t)
        self.params -= denom


def make(name: str, params: np.ndarray, lr: float, **kw):
    """Build the optimiser called ``name`` ("adam" or "sgd") over ``params``."""
    if name == "adam":
        return Adam(params, lr, **kw)
    if name == "sgd":
        return SGD(params, lr, **kw)
    raise ValueError(f"optimizer: expected 'adam' or 'sgd', got {name!r}")


def _check_lr(lr):
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr: expected a number > 0, got {lr!r}")
