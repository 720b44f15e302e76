"""Argument checks shared by the three layers, so that every layer rejects the same inputs with the same words."""
from __future__ import annotations

import functools
import math
import reprlib
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from .registry import AGG_MODES, CAP_MODES, GROUP_AGG_MODES, HPARAMS, KL_KINDS, ROLLOUT_CORRECTIONS, get_algorithm

#: Past z = tau (r - 1) = SAPO_SATURATION, SAPO's gate (4/tau) sigmoid(z) is taken as 4/tau, with derivative 0.
SAPO_SATURATION = 4096
#: The smallest SAPO temperature: below it, the saturation point log1p(SAPO_SATURATION / tau) passes float32's
#: largest log-ratio whose exp is finite (88.7), and the ratio could overflow before the gate saturates.
SAPO_TAU_MIN = 1e-30

#: How every layer treats far ratios and other products of an overflowing and a vanishing factor, so that the three
#: stay one definition: values exact where representable, gradients never NaN where the exact gradient is finite.
RATIO_GUARDS: Mapping[str, str] = MappingProxyType({
    "clipped": "A token whose gradient is zeroed (PPO-clip's clipped branch, the two-sided clip's delta, the dual "
               "clip's -c*A, a Clip-Cov selection) keeps its value and contributes exactly 0 to the gradient, however "
               "far its ratio: the float layers take exp of the log-ratio only where the gradient flows (a masked "
               "exp, the double where), so autograd never forms 0 * inf.",
    "zero_advantage": "A token with A = 0 has loss r * 0 = 0 and gradient 0 at any ratio, also where exp(log r) "
                      "overflows the float type (inf * 0 would be NaN); it is not clipped.",
    "zero_weight": "A token whose aggregation or rollout-correction weight is 0 (padding, a token MIS cuts) "
                   "contributes 0 and no gradient, however far its ratio.",
    "sapo_saturation": "SAPO's gate is 4/tau with derivative 0 where tau (r - 1) > SAPO_SATURATION = 4096, i.e. past "
                       "log r = log1p(4096 / tau) (sapo_log_ratio_cap), where r is not formed: the exact gate is "
                       "within e^-4096 of it, and the exact gradient, below 4 e^-z (z / tau + 1) |A|, is under "
                       "1e-1400 for tau >= SAPO_TAU_MIN and any float A; spec evaluates every finite log-ratio so.",
    "vespo_saturation": "VESPO's kernel W^k e^(lam (1 - W)) is 0 where log W = x passes vespo_log_weight_cap, the root "
                        "of lam (e^x - 1) - k x = SAPO_SATURATION, where W is not formed: the exact kernel is below "
                        "e^-4096 there, and W^k e^(lam (1 - W)) at a log-weight of 1e300 is not evaluable; it is a "
                        "stop-gradient weight, so no derivative is lost.",
    "k3_unbiased": "The unbiased KL estimator r * k3 and its derivatives -r * d and r * (e^d - 1) are 0 where k3, d or "
                   "e^d - 1 is, and formed as sign * exp(log r + log|.|) where r = e^(logp - old_logp) overflows: "
                   "finite wherever the product is.",
    "linear_in_logp": "CISPO's, GPG's and DPPO's losses, linear in logp, sum their terms c * logp with c scaled by a "
                      "power of 2 to at most 1, and scale the total back (no bit changes): c * logp alone may overflow "
                      "where the weighted total does not.",
    "overflow": "Elsewhere a value past the float type's range is +-inf, the exact value rounded: -r * A of KL-Cov, or "
                "of an unclipped A < 0 token without dual clip, at r = e^100 in float32, and its gradient likewise; "
                "also where r alone passes the range but r times the aggregation weight would not. KL-Cov's and DPPO's "
                "losses, unbounded on both sides, are NaN where such infinities of both signs meet in their sum: the "
                "exact total is then past the range, of a sign the float type cannot tell.",
})


#: The smallest VESPO decay c2: above it, its saturation point (vespo_log_weight_cap) stays within float32's
#: largest log-ratio whose exp is finite.
VESPO_LAMBDA_MIN = 1e-30


@functools.lru_cache(maxsize=64)
def vespo_log_weight_cap(k: float, lam: float) -> float:
    """The log sequence weight x past which VESPO's kernel W^k e^(lam (1 - W)), W = e^x, is taken as 0
    (RATIO_GUARDS['vespo_saturation']): the root x > 0 of lam (e^x - 1) - k x = SAPO_SATURATION, by bisection."""
    def excess(x):
        return lam * math.expm1(x) - k * x - SAPO_SATURATION
    lo, hi = 0.0, 1.0
    while excess(hi) <= 0:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) <= 0 else (lo, mid)
    return hi


def cispo_bounds(hp) -> tuple:
    """CISPO's weight interval: [1 - eps_low, 1 + eps_high] (MiniMax-M1 Eq. 5), or [0, eps_high] with
    cap_mode='absolute' (TRL's clamp(r, max=epsilon_high): no lower bound, eps_low unused)."""
    if hp["cap_mode"] == "absolute":
        return 0, hp["eps_high"]
    return 1 - hp["eps_low"], 1 + hp["eps_high"]


def sapo_log_ratio_cap(tau: float) -> float:
    """The log-ratio past which SAPO's gate is saturated (RATIO_GUARDS['sapo_saturation']): log1p(4096 / tau)."""
    return math.log1p(SAPO_SATURATION / tau)


def resolve_hparams(name: str, hp: dict) -> dict:
    """Merge ``hp`` over the registry defaults of ``name`` and check every value; returns the full set."""
    alg = get_algorithm(name)
    if alg.clip == "none":
        raise ValueError(f"name: {name!r} is not a policy loss; use dpo_loss")
    unknown = sorted(set(hp) - set(HPARAMS))
    if unknown:
        raise ValueError(f"unknown hyper-parameter(s) {', '.join(unknown)}; expected among {', '.join(HPARAMS)}")
    out = dict(alg.defaults)
    out.update(hp)
    check_agg(out["agg"])
    check_kl_kind(out["kl"], "kl")
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
    for key in ("tau_pos", "tau_neg"):
        if out[key] < SAPO_TAU_MIN:
            raise ValueError(f"{key}: expected a temperature >= {SAPO_TAU_MIN} (SAPO's gate saturates past float32's "
                             f"range below it), got {out[key]!r}")
    for key in ("vespo_k_pos", "vespo_k_neg"):
        _positive(key, out[key])
    for key in ("vespo_lambda_pos", "vespo_lambda_neg"):
        _positive(key, out[key])
        if out[key] < VESPO_LAMBDA_MIN:
            raise ValueError(f"{key}: expected a decay >= {VESPO_LAMBDA_MIN} (VESPO's kernel saturates past float32's "
                             f"range below it), got {out[key]!r}")
    if out["dual_clip"] is None and alg.clip == "dynamic":  # DCPO: the dual clip follows r_max
        out["dual_clip"] = out["r_max"]
    if out["dual_clip"] is not None:
        if alg.clip not in ("fixed", "dynamic"):
            raise ValueError(f"dual_clip: the dual clip applies to PPO-clip losses, not {name}")
        _positive("dual_clip", out["dual_clip"])
        if out["dual_clip"] <= 1:
            raise ValueError(f"dual_clip: expected a constant > 1, got {out['dual_clip']!r}")
    _check_beyond_seeds(name, alg, out)
    return out


def _check_beyond_seeds(name, alg, hp) -> None:
    """The options of the 2026 algorithms: CISPO's cap, the two-sided clip, the Cov selections, rollout correction."""
    if hp["cap_mode"] not in CAP_MODES:
        raise ValueError(f"cap_mode: expected one of {', '.join(CAP_MODES)}, got {hp['cap_mode']!r}")
    if alg.clip == "truncated":
        if hp["cap_mode"] == "relative" and hp["eps_low"] > 1:
            raise ValueError(f"eps_low: CISPO's lower weight bound 1 - eps_low must be >= 0, got eps_low="
                             f"{hp['eps_low']!r}")
        if hp["cap_mode"] == "absolute" and hp["eps_high"] < 1:
            raise ValueError(f"eps_high: CISPO's absolute cap must be >= 1, got {hp['eps_high']!r}")
    if hp["delta"] is not None:
        if alg.clip != "fixed":
            raise ValueError(f"delta: the two-sided clip applies to fixed-clip losses, not {name}")
        _positive("delta", hp["delta"])
        if hp["delta"] <= 1 + hp["eps_high"]:
            raise ValueError(f"delta: expected a number > 1 + eps_high = {1 + hp['eps_high']!r}, got {hp['delta']!r}")
    for key in ("clip_cov_ratio", "kl_cov_ratio"):
        _finite_number(key, hp[key])
        if not 0 <= hp[key] <= 1:
            raise ValueError(f"{key}: expected a share in [0, 1], got {hp[key]!r}")
    for key in ("clip_cov_lb", "clip_cov_ub"):
        _finite_number(key, hp[key])
    if hp["clip_cov_lb"] >= hp["clip_cov_ub"]:
        raise ValueError(f"clip_cov_ub: expected a number > clip_cov_lb ({hp['clip_cov_lb']!r}), "
                         f"got {hp['clip_cov_ub']!r}")
    _finite_number("kl_cov_coef", hp["kl_cov_coef"])
    if hp["kl_cov_coef"] < 0:
        raise ValueError(f"kl_cov_coef: expected a number >= 0, got {hp['kl_cov_coef']!r}")
    seed = hp["cov_seed"]
    if not _is_integer(seed) or seed < 0:
        raise ValueError(f"cov_seed: expected an integer >= 0, got {seed!r}")
    if hp["opsm_delta"] is not None:
        _finite_number("opsm_delta", hp["opsm_delta"])
        if hp["opsm_delta"] < 0:
            raise ValueError(f"opsm_delta: expected None or a number >= 0, got {hp['opsm_delta']!r}")
    rc = hp["rollout_correction"]
    if rc is not None and rc not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"rollout_correction: expected None or one of {', '.join(ROLLOUT_CORRECTIONS)}, got {rc!r}")
    _positive("tis_cap", hp["tis_cap"])
    _finite_number("mis_low", hp["mis_low"])
    _positive("mis_high", hp["mis_high"])
    if not 0 <= hp["mis_low"] <= hp["mis_high"]:
        raise ValueError(f"mis_low: expected 0 <= mis_low <= mis_high ({hp['mis_high']!r}), got {hp['mis_low']!r}")


def policy_options(name: str, alg, hp: dict, shapes: dict, mask, group_size, ref_logp, rollout_logp, cov_select,
                   to_float, to_mask) -> tuple:
    """``policy_loss``'s optional arguments, the same in every layer: ``ref_logp`` (needed and read only when beta >
    0), ``rollout_logp`` (only with a rollout correction) and ``cov_select`` (Clip-Cov's or KL-Cov's selection),
    converted by the layer's ``to_float(name, x)`` and ``to_mask(name, x)`` and checked with the required arguments'
    ``shapes`` and the group size. Returns them converted (None where absent or unread)."""
    check_reference(name, hp["beta"], ref_logp)
    check_rollout_logp(hp, rollout_logp)
    ref_logp = to_float("ref_logp", ref_logp) if hp["beta"] > 0 else None
    rollout_logp = None if rollout_logp is None else to_float("rollout_logp", rollout_logp)
    cov_select = None if cov_select is None else to_mask("cov_select", cov_select)
    given = {"ref_logp": ref_logp, "rollout_logp": rollout_logp, "cov_select": cov_select}
    check_token_shapes({**shapes, **{k: tuple(v.shape) for k, v in given.items() if v is not None}}, group_size,
                       hp["agg"])
    if cov_select is not None:
        check_cov_select(name, alg, bool((cov_select > mask).any()))
    return ref_logp, rollout_logp, cov_select


def check_rollout_logp(hp: dict, rollout_logp) -> None:
    """A rollout correction needs the engine's log-probs, and the engine's log-probs are used only by one."""
    if hp["rollout_correction"] is not None and rollout_logp is None:
        raise ValueError(f"rollout_logp: rollout_correction={hp['rollout_correction']!r} needs rollout_logp (the "
                         "sampling engine's log-probs)")
    if hp["rollout_correction"] is None and rollout_logp is not None:
        raise ValueError(f"rollout_logp: used only by a rollout correction; pass rollout_correction (one of "
                         f"{', '.join(ROLLOUT_CORRECTIONS)}) or leave rollout_logp out")


def check_cov_select(name: str, alg, selected_off_mask: bool) -> None:
    """``cov_select`` is Clip-Cov's or KL-Cov's selection, a 0/1 mask inside ``mask``."""
    if alg.select is None:
        raise ValueError(f"cov_select: only clip_cov and kl_cov select tokens, not {name}")
    if selected_off_mask:
        raise ValueError("cov_select: selects tokens outside mask (padding)")


def check_agg(agg: str) -> None:
    """Raise if ``agg`` is not an aggregation mode of the reference."""
    if not isinstance(agg, str) or agg not in AGG_MODES:
        raise ValueError(f"agg: unknown aggregation mode {agg!r}; expected one of {', '.join(AGG_MODES)}")


def check_kl_kind(kind: str, arg: str = "kind", has_old: bool = True) -> None:
    """Raise if ``kind`` (the argument ``arg``) is not a KL estimator, or is k3_unbiased without old log-probs."""
    if not isinstance(kind, str) or kind not in KL_KINDS:
        raise ValueError(f"{arg}: unknown KL estimator {kind!r}; expected one of {', '.join(KL_KINDS)}")
    if kind == "k3_unbiased" and not has_old:
        raise ValueError("old_logp: the k3_unbiased estimator (r * k3) needs old_logp for r = exp(logp - old_logp)")


def check_same_shape(name: str, shape, ref_name: str, ref_shape) -> None:
    """Raise unless ``name`` has the shape of ``ref_name``."""
    if tuple(shape) != tuple(ref_shape):
        raise ValueError(f"{name}: expected shape {tuple(ref_shape)} (the shape of {ref_name}), got {tuple(shape)}")


def check_reference(name: str, beta, ref_logp) -> None:
    """A KL penalty (beta > 0) needs the reference log-probs."""
    if beta > 0 and ref_logp is None:
        raise ValueError(f"ref_logp: {name} with beta={beta} > 0 needs ref_logp (the reference log-probs)")


def check_old_logp_probabilities(name: str, any_positive: bool) -> None:
    """DCPO's q and DPPO's mu, exp(old_logp), must be probabilities: no unmasked old_logp above 0."""
    if any_positive:
        raise ValueError(f"old_logp: {name} needs log-probabilities <= 0 (exp(old_logp) in (0, 1])")


def check_value_args(clip, agg: str, max_len) -> None:
    """The value loss's clip width, aggregation mode and, for seq_mean_token_sum_norm, its constant."""
    check_agg(agg)
    _positive("clip", clip)
    if agg == "seq_mean_token_sum_norm":
        if max_len is None:
            raise ValueError("max_len: agg='seq_mean_token_sum_norm' needs max_len, got None")
        _positive("max_len", max_len)


def check_dpo_args(beta, pairs: int) -> None:
    """DPO's beta and at least one preference pair."""
    _positive("beta", beta)
    if pairs == 0:
        raise ValueError("logp_chosen: expected at least one preference pair, got none")


GROUP_ADVANTAGE_KINDS = ("grpo", "dr_grpo", "rloo", "gpg")


def check_advantage_kind(kind: str, group_size: int, unbiased: bool, eps=0.0) -> None:
    """Group advantages are grpo, dr_grpo, rloo or gpg; GRPO's unbiased std and RLOO need G >= 2; eps >= 0."""
    if kind not in GROUP_ADVANTAGE_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(GROUP_ADVANTAGE_KINDS)}, got {kind!r}")
    if group_size < 2 and (kind == "rloo" or (kind == "grpo" and unbiased)):
        why = "the leave-one-out mean" if kind == "rloo" else "the unbiased std"
        raise ValueError(f"group_size: {why} needs G >= 2 responses per prompt, got 1")
    _finite_number("eps", eps)
    if eps < 0:
        raise ValueError(f"eps: expected a number >= 0, got {eps!r}")


def check_reward_weights(weights, n_rewards: int) -> list:
    """GDPO's rewards come as a [B, N] array with N >= 1; ``weights`` is None (all 1) or N finite numbers. Returns
    the weights as floats."""
    if n_rewards < 1:
        raise ValueError("rewards: expected a [B, N] array with N >= 1 rewards per response, got N = 0")
    if weights is None:
        return [1.0] * n_rewards
    weights = list(np.asarray(weights, dtype=object).reshape(-1)) if not isinstance(weights, (int, float)) else None
    if weights is None or len(weights) != n_rewards:
        raise ValueError(f"weights: expected {n_rewards} numbers, one per reward (column of rewards)")
    for w in weights:
        _finite_number("weights", w)
    return [float(w) for w in weights]


def check_reinforce_args(n_rewards: int, mask_shape, beta, gamma, eps, group_size, baseline: bool, logp,
                         ref_logp) -> None:
    """REINFORCE++: one reward per row of a [B, T] mask, beta >= 0 (with both log-probs when > 0), gamma in
    [0, 1], eps >= 0, and for the baseline variant a group size that divides B."""
    if len(mask_shape) != 2:
        raise ValueError(f"mask: expected a 2-D [B, T] array, got shape {tuple(mask_shape)}")
    if n_rewards != mask_shape[0]:
        raise ValueError(f"rewards: expected one reward per row of mask ({mask_shape[0]}), got {n_rewards}")
    for name, value in (("beta", beta), ("eps", eps)):
        _finite_number(name, value)
        if value < 0:
            raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
    if beta > 0 and (logp is None or ref_logp is None):
        raise ValueError(f"ref_logp: beta={beta} > 0 needs logp and ref_logp (the k1 penalty in the reward)")
    _finite_number("gamma", gamma)
    check_unit_interval("gamma", gamma)
    check_group_size(group_size, mask_shape[0], needed=baseline, why="the baseline variant")


def check_prompt_ids(ids: list, groups: int) -> None:
    """SAS takes one distinct prompt id per group."""
    if len(ids) != groups:
        raise ValueError(f"prompt_ids: expected one id per group ({groups}), got {len(ids)}")
    if len(set(ids)) != len(ids):
        raise ValueError("prompt_ids: each prompt may appear once per call")


def check_sas_state(state) -> dict:
    """The history of a ``SmoothAdvantage.state_dict()``, checked: {prompt id: (visits >= 1, mean, variance >= 0)}."""
    history = state.get("history") if isinstance(state, Mapping) else None
    if not isinstance(history, Mapping):
        raise ValueError(f"state: expected a mapping {{'history': {{prompt id: [visits, mean, variance]}}}}, got "
                         f"{reprlib.repr(state)}")
    out = {}
    for pid, entry in history.items():
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and _is_integer(entry[0]) and entry[0] >= 1
                and all(_is_number(x) and math.isfinite(x) for x in entry[1:]) and entry[2] >= 0):
            raise ValueError(f"state: history[{pid!r}] must be [visits >= 1, mean, variance >= 0] with finite "
                             f"numbers, got {reprlib.repr(entry)}")
        out[pid] = (int(entry[0]), float(entry[1]), float(entry[2]))
    return out


def check_unit_interval(name: str, value) -> None:
    """Discounts (gamma, lambda) lie in [0, 1]."""
    if not _is_number(value) or not 0 <= value <= 1:
        raise ValueError(f"{name}: expected a number in [0, 1], got {value!r}")


def check_overlong(max_len, cache_len) -> None:
    """DAPO's overlong buffer: 0 < cache_len <= max_len."""
    _positive("max_len", max_len)
    _finite_number("cache_len", cache_len)
    if not 0 < cache_len <= max_len:
        raise ValueError(f"cache_len: expected 0 < cache_len <= max_len ({max_len}), got {cache_len!r}")


def check_token_shapes(shapes: dict, group_size, agg: str | None = None) -> tuple[int, int]:
    """Check that every named ``[B, T]`` shape matches and that ``group_size`` divides B; returns (B, T)."""
    name0, shape0 = next(iter(shapes.items()))
    if len(shape0) != 2:
        raise ValueError(f"{name0}: expected a 2-D [B, T] array, got shape {tuple(shape0)}")
    if shape0[1] == 0:
        raise ValueError(f"{name0}: expected at least one token column (T >= 1), got shape {tuple(shape0)}")
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
    if not _is_integer(group_size) or group_size < 1:
        raise ValueError(f"group_size: expected a positive integer, got {group_size!r}")
    if batch % group_size:
        raise ValueError(f"group_size: {group_size} does not divide the batch of {batch} rows")


def check_dcpo_bounds_args(eps_low, eps_high, r_max) -> None:
    """DCPO's bound widths (>= 0) and cap (>= 1), finite numbers."""
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        _finite_number(name, value)
        if value < 0:
            raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
    _finite_number("r_max", r_max)
    if r_max < 1:
        raise ValueError(f"r_max: expected a number >= 1, got {r_max!r}")


def check_q(q_min: float, q_max: float) -> None:
    """DCPO's bound needs the sampling probability q in (0, 1]."""
    if not (q_min > 0 and q_max <= 1):
        raise ValueError(f"q: expected probabilities in (0, 1], got values in [{q_min!r}, {q_max!r}]")


def nonfinite_error(name: str) -> ValueError:
    return ValueError(f"{name}: expected finite values, found NaN or inf")


def meta_error(name: str) -> ValueError:
    return ValueError(f"{name}: expected a tensor with data, got one on the meta device (shape and dtype only)")


def mask_error(name: str = "mask") -> ValueError:
    return ValueError(f"{name}: expected only 0 and 1 (or booleans)")


def _is_number(value) -> bool:
    """A real number that is not a bool (numpy scalars included)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _is_integer(value) -> bool:
    """An integer that is not a bool (numpy integers included)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _finite_number(name, value):
    if not _is_number(value) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")


def _positive(name, value):
    _finite_number(name, value)
    if value <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
