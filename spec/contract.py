"""Argument checks shared by the three layers, so that every layer rejects the same inputs with the same words."""
from __future__ import annotations

from .registry import AGG_MODES, GROUP_AGG_MODES, HPARAMS, KL_KINDS, get_algorithm


def resolve_hparams(name: str, hp: dict) -> dict:
    """Merge ``hp`` over the registry defaults of ``name`` and check every value; returns the full set."""
    alg = get_algorithm(name)
    if alg.clip == "none":
        raise ValueError(f"name: {name!r} is not a policy loss; use dpo_loss")
    unknown = sorted(set(hp) - set(HPARAMS))
    if unknown:
        raise ValueError(f"unknown hyper-parameter(s) {', '.join(unknown)}; expected among {', '.join(HPARAMS)}")
    out = dict(alg.defaults)
    out.update({k: v for k, v in hp.items()})
    if out["agg"] not in AGG_MODES:
        raise ValueError(f"agg: unknown aggregation mode {out['agg']!r}; expected one of {', '.join(AGG_MODES)}")
    if out["kl"] not in KL_KINDS:
        raise ValueError(f"kl: unknown KL estimator {out['kl']!r}; expected one of {', '.join(KL_KINDS)}")
    if out["agg"] == "seq_mean_token_sum_norm":
        if out["max_len"] is None:
            raise ValueError(f"max_len: {name} with agg='seq_mean_token_sum_norm' needs max_len (the generation "
                             "budget L), got None")
        _positive("max_len", out["max_len"])
    for key in ("eps_low", "eps_high", "beta"):
        _finite_number(key, out[key])
        if out[key] < 0:
            raise ValueError(f"{key}: expected a number >= 0, got {out[key]!r}")
    if out["eps_low"] >= 1 and alg.clip == "fixed":
        raise ValueError(f"eps_low: expected a number in [0, 1), got {out['eps_low']!r}")
    for key in ("tau_pos", "tau_neg", "r_max"):
        _positive(key, out[key])
    if out["dual_clip"] is not None:
        _positive("dual_clip", out["dual_clip"])
        if out["dual_clip"] <= 1:
            raise ValueError(f"dual_clip: expected a constant > 1, got {out['dual_clip']!r}")
    return out


def check_agg(agg: str) -> None:
    """Raise if ``agg`` is not an aggregation mode of the reference."""
    if agg not in AGG_MODES:
        raise ValueError(f"agg: unknown aggregation mode {agg!r}; expected one of {', '.join(AGG_MODES)}")


def check_kl_kind(kind: str) -> None:
    """Raise if ``kind`` is not k1, k2 or k3."""
    if kind not in KL_KINDS:
        raise ValueError(f"kind: unknown KL estimator {kind!r}; expected one of {', '.join(KL_KINDS)}")


def check_token_shapes(shapes: dict, group_size, agg: str | None = None) -> tuple[int, int]:
    """Check that every named ``[B, T]`` shape matches and that ``group_size`` divides B; returns (B, T)."""
    name0, shape0 = next(iter(shapes.items()))
    if len(shape0) != 2:
        raise ValueError(f"{name0}: expected a 2-D [B, T] array, got shape {tuple(shape0)}")
    for name, shape in shapes.items():
        if tuple(shape) != tuple(shape0):
            raise ValueError(f"{name}: expected shape {tuple(shape0)} (the shape of {name0}), got {tuple(shape)}")
    batch = shape0[0]
    check_group_size(group_size, batch, needed=agg in GROUP_AGG_MODES, why=f"agg={agg!r}")
    return tuple(shape0)


def check_group_size(group_size, batch: int, *, needed: bool, why: str = "") -> None:
    """Check ``group_size`` (G) is a positive integer dividing the batch, and present where ``needed``."""
    if group_size is None:
        if needed:
            raise ValueError(f"group_size: {why} needs group_size (G responses per prompt), got None")
        return
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size: expected a positive integer, got {group_size!r}")
    if batch % group_size:
        raise ValueError(f"group_size: {group_size} does not divide the batch of {batch} rows")


def check_q(q_min: float, q_max: float) -> None:
    """DCPO's bound needs the sampling probability q in (0, 1]."""
    if not (q_min > 0 and q_max <= 1):
        raise ValueError(f"q: expected probabilities in (0, 1], got values in [{q_min!r}, {q_max!r}]")


def check_temperature(name: str, value) -> None:
    """Temperatures and widths must be positive finite numbers."""
    _positive(name, value)


def nonfinite_error(name: str) -> ValueError:
    return ValueError(f"{name}: expected finite values, found NaN or inf")


def mask_error() -> ValueError:
    return ValueError("mask: expected only 0 and 1 (or booleans)")


def _finite_number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")


def _positive(name, value):
    _finite_number(name, value)
    if value <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
