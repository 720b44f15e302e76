"""Array checks shared by spec and sim: numeric, finite, and masks that are 0/1 (messages from contract)."""
from __future__ import annotations

import numpy as np

from .contract import mask_error, nonfinite_error


def as_float(name: str, x, ndim: int | None = None) -> np.ndarray:
    """Return ``x`` as a finite float64 array, or raise a ValueError naming ``name``."""
    if np.iscomplexobj(x):
        raise ValueError(f"{name}: expected a real array, got complex values")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a numeric array, got {type(x).__name__}") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise nonfinite_error(name)
    return arr


def as_mask(mask, name: str = "mask") -> np.ndarray:
    """Return the mask (argument ``name``) as float64 0/1, or raise if it holds anything else."""
    arr = as_float(name, mask)
    if not ((arr == 0.0) | (arr == 1.0)).all():
        raise mask_error(name)
    return arr
