"""One stale token (a log-ratio far past exp's range) in every policy algorithm, with A > 0 and A < 0, on the side
where the clip holds it and the side where it does not, in float64, float32 and bfloat16.

The exact gradient of the stale token is known by hand there (``EXPECT``): 0 where it is clipped (or saturated, or
its weight is 0), a number past the float type's range where the unclipped -r * A overflows, and otherwise a finite
number, taken from sim in float64, which is checked against spec's exact value at the far ratio in float64. The
conventions are spec.contract.RATIO_GUARDS.
"""
import itertools
import math

import numpy as np
import pytest
import sympy as sp
import torch

import gpu
import sim
import spec
from gpu.integrations import verl_plugin
from spec.contract import SAPO_TAU_MIN
from spec.registry import POLICY_ALGORITHMS, get_algorithm

DTYPES = ("float64", "float32", "bfloat16")
#: A stale token's log-ratio: e^FAR overflows the dtype (and still does divided by the batch's token count), e^(FAR/3)
#: (a row's mean) does not; EDGE is near the dtype's largest number.
FAR = {"float64": 1000.0, "float32": 100.0, "bfloat16": 100.0}
EDGE = {"float64": 1e300, "float32": 3e38, "bfloat16": 3e38}
RTOL = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 2e-2}
HP = {"beta": 0.0, "max_len": 4}
OLD = -np.ones((2, 4))
# Log-ratios: [0, 0] is the stale token, [0, 2] is clipped in log space by GMPO with A < 0, [0, 3] is padding.
ORDINARY = np.array([[0.0, 0.125, -0.5, 0.25], [0.0625, -0.125, 0.03125, 0.5]])
ADV = np.array([[1.0, 0.5, -0.5, 2.0], [1.0, -1.0, 0.25, 0.5]])  # each row's mean has the sign of its first token
MASK = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def expected(name, a, side, edge):
    """The stale token's exact gradient, by hand: "zero", "over" (past any float: -r * A overflows, sign -A) or
    "value" (finite; sim in float64 gives it). ``a`` is the sign of A, ``side`` of the log-ratio, ``edge`` whether
    it is EDGE (else FAR)."""
    alg = get_algorithm(name)
    if alg.ratio == "none" or alg.clip == "truncated":  # GPG: -A w; CISPO: -clip(r, 0, 5) A w
        return "value"
    if alg.clip == "gamma":  # VESPO's kernel of the row's weight vanishes far above (saturated) and far below
        return "zero"
    if alg.clip == "soft":  # the gate saturates far above; far below, r ~ 0
        return "zero" if side > 0 else "value"
    if alg.clip == "off":  # KL-Cov: -r A, no clip
        return "over" if side > 0 else "value"
    if a * side > 0:  # PPO-clip, DCPO, GMPO's log clip, GSPO's sequence clip: held on this side
        return "zero"
    if side < 0:
        return "value"  # A > 0, r ~ 0: unclipped
    if alg.clip == "dynamic":  # DCPO's dual clip (c = r_max) caps A < 0
        return "zero"
    # the sequence ratios (GSPO, GMPO) average the row's log-ratios: e^(FAR / 3) is finite, e^(EDGE / 3) is not
    return "value" if alg.ratio != "token" and not edge else "over"


def batch(dtype, a, side, far=None):
    """(logp, old_logp, adv, mask) as float64 arrays holding values of the dtype (the stale logp rounded to it)."""
    log_ratio = ORDINARY.copy()
    log_ratio[0, 0] = side * (far or FAR[dtype])
    return OLD + log_ratio, OLD.copy(), a * ADV, MASK


def gpu_run(name, dtype, arrays, group_size=None, **hp):
    as_t = lambda x: torch.tensor(x, dtype=getattr(torch, dtype))  # noqa: E731
    logp = as_t(arrays[0]).requires_grad_(True)
    loss, stats = gpu.policy_loss(name, logp, *map(as_t, arrays[1:]), group_size=group_size, **{**HP, **hp})
    loss.backward()
    return float(loss.detach()), logp.grad.double().numpy(), stats


def in_dtype(x, dtype):
    """float64 values rounded to ``dtype`` (past its range: inf), back as float64."""
    return torch.tensor(x, dtype=torch.float64).to(getattr(torch, dtype)).double().numpy()


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_a_stale_token_gets_its_exact_gradient_in_every_dtype(name):
    for dtype, a, side, far in itertools.product(DTYPES, (1.0, -1.0), (1.0, -1.0), ("far", "edge")):
        far = FAR[dtype] if far == "far" else EDGE[dtype]
        arrays = batch(dtype, a, side, far)
        arrays = (in_dtype(arrays[0], dtype), *arrays[1:])
        kind = expected(name, a, side, far == EDGE[dtype])
        where = f"{name} {dtype} A {a:+} log-ratio {side * far:+}"
        want_loss, want, want_stats = sim.policy_loss(name, *arrays, group_size=2, **HP)
        loss, grad, stats = gpu_run(name, dtype, arrays, group_size=2)
        assert not np.isnan(grad).any() and not math.isnan(loss), where
        assert not np.isnan([*stats.values(), *want_stats.values()]).any(), where
        for got in (want, grad) if dtype == "float64" else (grad,):  # sim too, where it runs
            if kind == "zero":
                assert got[0, 0] == 0.0, where
            elif kind == "over":
                assert got[0, 0] == -a * math.inf, where
            else:
                assert math.isfinite(got[0, 0]), where
        want = in_dtype(want, dtype)
        finite = np.isfinite(want)
        assert (grad[~finite] == want[~finite]).all(), where
        assert (grad[want == 0] == 0).all(), where  # a zero gradient is exactly 0 in every dtype
        scale = np.abs(want[finite]).max(initial=0.0)
        # e^y of a sequence log-ratio y = FAR / 3 rounded to the dtype is off by up to |y| eps, relatively
        rtol = RTOL[dtype] * (1 + far / 3 if get_algorithm(name).ratio != "token" and far < 1e3 else 1)
        np.testing.assert_allclose(grad[finite], want[finite], rtol=rtol, atol=rtol * scale, err_msg=where)
        want_loss = float(in_dtype(want_loss, dtype))
        if math.isfinite(want_loss):
            assert loss == pytest.approx(want_loss, rel=rtol, abs=rtol * scale), where
        else:
            assert loss == want_loss, where


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_sim_at_a_far_ratio_is_the_exact_value(name):
    """spec's exact loss and gradient with the stale token far above (A > 0 and A < 0), rounded to float64, are
    sim's: the oracle of the test above, checked where it is used."""
    for a in (1.0, -1.0):
        arrays = batch("float64", a, 1.0)
        e_loss, e_grad = spec.policy_loss(name, *arrays, group_size=2, **HP)
        loss, grad, _ = sim.policy_loss(name, *arrays, group_size=2, **HP)
        exact = np.array([float(sp.N(g, 20)) for g in e_grad.flat]).reshape(grad.shape)
        assert (grad[exact == 0] == 0).all()
        np.testing.assert_allclose(grad, exact, rtol=1e-12, atol=0)
        assert loss == pytest.approx(float(sp.N(e_loss, 20)), rel=1e-12)


@pytest.mark.parametrize("name", ["cispo", "gpg"])
def test_a_loss_linear_in_logp_is_exact_where_only_its_terms_overflow(name):
    """CISPO at one logp of 1e308 among ten tokens: -5 * 1e308 alone overflows, the token mean -5e307 does not;
    every layer gives the exact value (GPG the same with A = 5)."""
    logp, adv = np.full((1, 10), -1.0), np.full((1, 10), 1.0 if name == "cispo" else 5.0)
    logp[0, 0] = 1e308
    args = (logp, np.zeros((1, 10)), adv, np.ones((1, 10)))
    e_loss, e_grad = spec.policy_loss(name, *args)
    want = float(sp.N(e_loss, 20))
    assert want == pytest.approx(-5e307 + 4.5, rel=1e-15)  # -(5 * 1e308 + 9 * 5 * -1) / 10, by hand
    assert sim.policy_loss(name, *args)[0] == pytest.approx(want, rel=1e-12)
    loss, grad, _ = gpu_run(name, "float64", args, max_len=None)
    assert loss == pytest.approx(want, rel=1e-12)
    np.testing.assert_allclose(grad, e_grad.astype(float), rtol=1e-12)


def test_sapo_at_a_log_ratio_of_1e300_is_exact_in_every_layer():
    """SAPO's gate saturates: loss -(4/tau) A w, gradient 0, and spec evaluates it (e^(-e^1e300) would not)."""
    args = ([[1e300, -1.0]], [[0.0, -1.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    want = -(4.0 / 1.0) * 1.0 / 2 + -(4.0 / 1.0) * 0.5 * 1.0 / 2  # tau_pos = 1; the second token at r = 1
    e_loss, e_grad = spec.policy_loss("sapo", *args)
    assert float(sp.N(e_loss, 30)) == pytest.approx(want, rel=1e-15)
    assert e_grad[0, 0] == 0 and float(sp.N(e_grad[0, 1], 30)) == pytest.approx(-0.5, rel=1e-15)  # -sech^2(0) / 2
    loss, grad, _ = sim.policy_loss("sapo", *args)
    assert loss == pytest.approx(want, rel=1e-15) and grad[0, 0] == 0
    loss, grad, _ = gpu_run("sapo", "float64", args, max_len=None)
    assert loss == pytest.approx(want, rel=1e-15) and grad[0, 0] == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_advantage_and_zero_weight_tokens_give_nothing_at_any_ratio(dtype):
    """A token with A = 0 (PPO, KL-Cov; a row's for GMPO) or cut by MIS (PPO) at a ratio past the float range: loss
    and gradient 0, where r * 0 would be inf * 0; an A = 0 token is not counted as clipped."""
    far = FAR[dtype]
    logp, old = [[-1.0 + far, -1.0]], [[-1.0, -1.0]]
    for name in ("ppo", "kl_cov"):
        loss, grad, stats = gpu_run(name, dtype, (logp, old, [[0.0, 1.0]], [[1.0, 1.0]]), kl_cov_ratio=0.0)
        assert loss == -0.5 and grad.tolist() == [[0.0, -0.5]] and stats["clip_frac"] == 0.0, name
        if dtype == "float64":
            loss, grad, stats = sim.policy_loss(name, logp, old, [[0.0, 1.0]], [[1.0, 1.0]], kl_cov_ratio=0.0)
            assert loss == -0.5 and grad.tolist() == [[0.0, -0.5]] and stats["clip_frac"] == 0.0, name
    loss, grad, _ = gpu_run("gmpo", dtype, (logp, old, [[0.0, 0.0]], [[1.0, 1.0]]))  # a row's A = 0
    assert loss == 0 and grad.tolist() == [[0.0, 0.0]]
    if dtype == "float64":
        loss, grad, _ = sim.policy_loss("gmpo", logp, old, [[0.0, 0.0]], [[1.0, 1.0]])
        assert loss == 0 and grad.tolist() == [[0.0, 0.0]]
    mis = dict(rollout_correction="mis", rollout_logp=[[-10.0, -1.0]])  # rho = e^9 > mis_high: the token is cut
    loss, grad, _ = gpu_run("ppo", dtype, (logp, old, [[-1.0, 1.0]], [[1.0, 1.0]]), **mis)
    assert loss == -0.5 and grad.tolist() == [[0.0, -0.5]]
    if dtype == "float64":
        loss, grad, _ = sim.policy_loss("ppo", logp, old, [[-1.0, 1.0]], [[1.0, 1.0]], **mis)
        assert loss == -0.5 and grad.tolist() == [[0.0, -0.5]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_clip_cov_selection_detaches_a_far_unclipped_token(dtype):
    """Clip-Cov's selected token keeps its value (here past the range: +inf) and contributes exactly 0 to the
    gradient; the others keep theirs."""
    far = FAR[dtype]
    args = ([[-1.0 + far, -1.0]], [[-1.0, -1.0]], [[-1.0, 1.0]], [[1.0, 1.0]])
    loss, grad, _ = gpu_run("clip_cov", dtype, args, cov_select=[[1, 0]])
    assert loss == math.inf and grad.tolist() == [[0.0, -0.5]]


def test_one_stale_token_leaves_a_bf16_update_finite_through_the_verl_plugin():
    """verl's entry point (gpu.integrations.verl_plugin) in bfloat16: one token at a log-ratio of 100 with A > 0,
    clipped, gives the loss of the others plus its clipped value and a finite gradient that is 0 on it."""

    class Config(dict):  # what the plug-in reads of verl's ActorConfig, without importing verl
        __getattr__ = dict.__getitem__

    config = Config(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, rollout_n=2, tau_pos=1.0,
                    tau_neg=1.05)
    for name in ("grpo", "dapo", "sapo"):
        logp = torch.tensor([[99.0, -1.0], [-1.0, -1.0]], dtype=torch.bfloat16, requires_grad=True)
        old = torch.full((2, 2), -1.0, dtype=torch.bfloat16)
        adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.bfloat16)
        loss, _ = verl_plugin.make_policy_loss(name)(old, logp, adv, torch.ones(2, 2, dtype=torch.bool),
                                                     config=config)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), name
        assert logp.grad[0, 0] == 0 and (logp.grad[1] != 0).all(), name


@pytest.mark.parametrize("arg", ["logp", "old_logp", "adv", "mask"])
def test_a_meta_tensor_is_refused_by_name(arg):
    tensors = {"logp": torch.zeros(1, 2, requires_grad=True), "old_logp": torch.zeros(1, 2),
               "adv": torch.ones(1, 2), "mask": torch.ones(1, 2)}
    tensors[arg] = torch.zeros(1, 2, device="meta")
    with pytest.raises(ValueError, match=f"^{arg}: expected a tensor with data, got one on the meta device"):
        gpu.policy_loss("ppo", *tensors.values())


@pytest.mark.parametrize("layer", [spec, sim, gpu])
def test_a_temperature_below_the_floor_is_refused_in_every_layer(layer):
    """Below SAPO_TAU_MIN the gate would saturate only past float32's range (RATIO_GUARDS['sapo_saturation'])."""
    args = [[[-1.0]], [[-1.0]], [[1.0]], [[1.0]]]
    if layer is gpu:
        args = [torch.tensor(a) for a in args]
    with pytest.raises(ValueError, match=r"^tau_neg: expected a temperature >= 1e-30 .*got 1e-31$"):
        layer.policy_loss("sapo", *args, tau_neg=SAPO_TAU_MIN / 10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_unbiased_kl_is_finite_where_its_product_with_a_far_ratio_is(dtype):
    """k3_unbiased = r * k3 at a ratio r past the range: 0 where ref_logp = logp, and where r * k3 and its gradient
    -r * d are representable (a gap d of one unit in the last place of logp), their value; sim's and spec's too."""
    far = {"float64": 715.0, "float32": 100.0, "bfloat16": 100.0}[dtype]
    for gap in (0.0, {"float64": 1e-3, "float32": 2.0**-17, "bfloat16": 0.0}[dtype]):
        logp, old = [[-1.0 + far, -1.0]], [[-1.0, -1.0]]
        args = (logp, old, [[0.0, 0.0]], [[1.0, 1.0]])
        hp = dict(ref_logp=[[logp[0][0] + gap, -1.0]], beta=1.0, kl="k3_unbiased")
        loss, grad, _ = gpu_run("gpg", dtype, args, **hp)
        want_loss, want, _ = sim.policy_loss("gpg", *args, **hp)
        if gap == 0:
            assert loss == want_loss == 0 and grad.tolist() == want.tolist() == [[0.0, 0.0]]
            continue
        assert np.isfinite(want).all() and math.isfinite(want_loss)
        np.testing.assert_allclose(grad, want, rtol=RTOL[dtype] * far)  # e^(log r) rounds log r's error in
        assert loss == pytest.approx(want_loss, rel=RTOL[dtype] * far)
        if dtype == "float64":
            e_loss, e_grad = spec.policy_loss("gpg", *args, **hp)
            assert want_loss == pytest.approx(float(sp.N(e_loss, 20)), rel=1e-11)  # k3 = expm1(d) - d cancels
            np.testing.assert_allclose(want, e_grad.astype(float), rtol=1e-12)
