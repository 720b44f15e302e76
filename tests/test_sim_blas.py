"""The simulator's numbers do not depend on the BLAS kernel: products in the hot path are exact (fixed-point
slices) or fixed-order reductions, so one claim sweep gives the same bytes under two OpenBLAS kernels."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.feature_lm import PHI_BITS, FeatureLM, combine, fixed_point, product_bits

ROOT = Path(__file__).resolve().parents[1]
#: OpenBLAS kernels every x86-64 CPU runs: the default (this CPU's own) and two older ones.
KERNELS = ("", "Nehalem", "Prescott")


def _sweep(tmp_path: Path, kernel: str) -> dict:
    out = tmp_path / (kernel or "default")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_CORETYPE": kernel}
    subprocess.run([sys.executable, "-m", "harness.cli", "sim", "--env", "feature_lm", "--algos", "dapo",
                    "--seeds", "2", "--steps", "12", "--set", "eps_high=0.2,100", "--set", "eval_every=4",
                    "--workers", "1", "--out", str(out)], cwd=ROOT, env=env, check=True, capture_output=True)
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.json*"))
            if p.name not in ("sweep.lock",)}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="OpenBLAS kernel names of x86-64")
def test_a_claim_sweep_has_the_same_bytes_under_two_blas_kernels(tmp_path):
    first = _sweep(tmp_path, KERNELS[0])
    for kernel in KERNELS[1:]:
        assert _sweep(tmp_path, kernel) == first, kernel


def test_fixed_point_products_are_exact_whatever_the_summation_order():
    """phi @ x by slices: every order of the sum over the inner axis gives the same bits, and the result is
    float64's product to its own rounding."""
    rng = np.random.default_rng(3)
    phi = FeatureLM(n_prompts=16).phi
    x = rng.standard_normal((phi.shape[1], 64)) * np.exp(3 * rng.standard_normal((phi.shape[1], 64)))
    bits = product_bits(phi.shape[1])
    parts = fixed_point(x, np.full(len(x), np.abs(x).max()), bits)  # [2, F, V]: hi and lo
    forward = combine(phi @ parts)
    order = rng.permutation(phi.shape[1])
    assert np.array_equal(combine(phi[:, order] @ parts[:, order]), forward)
    assert np.array_equal(combine(np.cumsum(phi[None, :, :, None] * parts[:, None], axis=2)[:, :, -1]), forward)
    assert np.abs(forward - phi @ x).max() <= 1e-15 * np.abs(phi).sum(1).max() * np.abs(x).max()
    assert np.all(np.rint(phi * 2 ** PHI_BITS) == phi * 2 ** PHI_BITS) and np.abs(phi).max() <= 1


def test_fixed_point_slices_are_the_rounded_scalings():
    """hi = rint(x / q) q and lo = rint((x - hi) / q') q' with q = 2^(e - bits), q' = q 2^-bits for each row's
    top < 2^e (Ozaki et al.'s splitting by scaling), on rows of very different scales; ties round to even."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 40)) * np.exp(8 * rng.standard_normal((6, 1)))
    x[1] = 0.0
    top = np.abs(x).max(1)
    for bits in (1, 24, 35):
        hi, lo = fixed_point(x, top, bits)
        q = 2.0 ** (np.frexp(top)[1] - bits)[:, None]
        want_hi = np.rint(x / q) * q
        assert np.array_equal(hi, want_hi)
        assert np.array_equal(lo, np.rint((x - want_hi) / (q * 2.0 ** -bits)) * (q * 2.0 ** -bits))
    ties = np.array([[1.0, 3.0, -3.0, 2.5]])  # top 3 < 2^2: grid 2 at bits = 1, so 1 and 3 are halfway
    assert np.array_equal(fixed_point(ties, np.array([3.0]), 1)[0], [[0.0, 4.0, -4.0, 2.0]])
