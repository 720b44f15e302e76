"""Torch-side value checks (messages from spec.contract): tensors are floating, finite, and masks are 0/1."""
from __future__ import annotations

import torch

from spec.contract import mask_error, meta_error, nonfinite_error


def as_tensor(name: str, x, like: torch.Tensor | None = None, ndim: int | None = None) -> torch.Tensor:
    """Return ``x`` as a finite floating tensor (on ``like``'s device and dtype when given)."""
    dtype = torch.get_default_dtype() if like is None else like.dtype
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, dtype=dtype)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{name}: expected a numeric tensor, got {type(x).__name__}") from None
    if x.is_meta:
        raise meta_error(name)
    if x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name}: expected a real floating tensor, got dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(dtype)
    if like is not None:
        x = x.to(device=like.device)
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(x.shape)}")
    if not _all_finite(x):
        raise nonfinite_error(name)
    return x


def as_mask(mask, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Return the mask (argument ``name``) as 0/1 in ``like``'s dtype, or raise if it holds anything else."""
    if not isinstance(mask, torch.Tensor):
        try:
            mask = torch.as_tensor(mask)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"{name}: expected a numeric tensor, got {type(mask).__name__}") from None
    if mask.is_meta:
        raise meta_error(name)
    if mask.dtype != torch.bool and not bool(mask.eq(mask.bool()).all()):  # 0/1 only (NaN fails too)
        raise mask_error(name)
    return mask.to(dtype=like.dtype, device=like.device)


def _all_finite(x: torch.Tensor) -> bool:
    """One reduction on the fast path: a finite sum means no NaN or inf; otherwise look element by element."""
    return bool(torch.isfinite(x.sum())) or bool(torch.isfinite(x).all())
