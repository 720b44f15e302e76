"""Formulas pinned to values worked out by hand from the papers, in every layer (spec exact, sim, gpu float64).

The differential tests cannot see a mistake made the same way in all three layers; these can. Each expected value
below is written as a literal with its arithmetic in a comment, and never taken from a layer.
"""
import math

import numpy as np
import pytest
import sympy as sp
import torch

import gpu
import sim
import spec
from harness.verify.cases import Case
from harness.verify.layers import layer_policy_loss

LAYERS = ("spec", "sim", "gpu64")


def _np(x):
    """A layer's output (sympy object array, NumPy array or tensor) as float64 NumPy."""
    if isinstance(x, torch.Tensor):
        return x.detach().double().numpy()
    return np.asarray(x, dtype=object).astype(np.float64)


def _t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=torch.float64)


def _one_group(logp, old_logp, adv):
    """A batch of one prompt with one response (group_size 1), every token unmasked."""
    logp = np.array([logp], dtype=np.float64)
    return Case(logp, np.array([old_logp], dtype=np.float64), np.array([adv], dtype=np.float64),
                np.ones_like(logp), logp.copy(), 1)


# ---- DCPO (2509.02333): bounds Eq. 21-27, q = exp(old_logp), dual clip ---------------------------------------

@pytest.mark.parametrize("layer", LAYERS)
def test_dcpo_bounds_match_the_papers_worked_values(layer):
    # eps_low 0.16, eps_high 0.2: lo = 1/2 + 1/2 sqrt(max(1 - 0.64/q, 0)), hi = min(1/2 + 1/2 sqrt(1 + 0.8/q), 10)
    # q = 0.9:    lo = 1/2 + 1/2 sqrt(13/45) = 0.768742...,  hi = 1/2 + sqrt(17)/6 = 1.187184...
    # q = 0.1:    1 - 6.4 < 0 so lo = 0.5;                   hi = 1/2 + 1/2 sqrt(9) = 2
    # q = 0.01:   lo = 0.5;                                  hi = 1/2 + 1/2 sqrt(81) = 5
    # q = 1/450:  lo = 0.5;                                  hi = 1/2 + 1/2 sqrt(361) = 10, where the cap starts
    # q = 0.001:  lo = 0.5;                                  hi = min(1/2 + 1/2 sqrt(801), 10) = 10 (capped)
    q = [0.9, 0.1, 0.01, 1 / 450, 0.001]
    want_lo = [0.5 + 0.5 * math.sqrt(13 / 45), 0.5, 0.5, 0.5, 0.5]
    want_hi = [0.5 + math.sqrt(17) / 6, 2.0, 5.0, 10.0, 10.0]
    fn = {"spec": spec.dcpo_bounds, "sim": sim.dcpo_bounds, "gpu64": lambda x: gpu.dcpo_bounds(_t(x))}[layer]
    lo, hi = (_np(b) for b in fn(q))
    np.testing.assert_allclose(lo, want_lo, rtol=1e-12)
    np.testing.assert_allclose(hi, want_hi, rtol=1e-12)
    # the paper's rounded numbers: [0.769, 1.187], [0.5, 2.0], [0.5, 5.0]
    assert [round(x, 3) for x in lo[:3]] == [0.769, 0.5, 0.5] and [round(x, 3) for x in hi[:3]] == [1.187, 2.0, 5.0]


@pytest.mark.parametrize("layer", LAYERS)
def test_dcpo_takes_q_from_the_old_policy(layer):
    """Two tokens whose clipping decision flips if q were exp(logp) instead of exp(old_logp)."""
    # token 0: q = 0.1, pi = 0.18 so r = 1.8, A = +1. Bounds from q = 0.1: [0.5, 2]; r inside, so
    #          l = -r*A = -1.8 and dl/dlogp = -r*A = -1.8.
    #          (From pi = 0.18 instead: hi = 1/2 + 1/2 sqrt(1 + 0.8/0.18) = 1/2 + 1/2 * 7/3 = 5/3 < r: clipped.)
    # token 1: q = 1, pi = 0.75 so r = 0.75, A = -1. lo = 1/2 + 1/2 sqrt(1 - 0.64) = 0.8 > r, and
    #          min(r*A, lo*A) = min(-0.75, -0.8) = -0.8: clipped, l = 0.8, gradient 0.
    #          (From pi = 0.75 instead: lo = 1/2 + 1/2 sqrt(1 - 0.64/0.75) = 0.691 < r: unclipped.)
    # group_seq_sum_token_mean over one response of 2 tokens weighs each token 1/2:
    #          loss = (-1.8 + 0.8)/2 = -0.5, grad = [-1.8/2, 0] = [-0.9, 0].
    case = _one_group([math.log(0.18), math.log(0.75)], [math.log(0.1), 0.0], [1.0, -1.0])
    loss, grad = layer_policy_loss(layer, "dcpo", case)
    assert loss == pytest.approx(-0.5, abs=1e-12)
    np.testing.assert_allclose(grad, [[-0.9, 0.0]], atol=1e-12)


@pytest.mark.parametrize("layer", LAYERS)
def test_dcpo_dual_clip_caps_negative_advantages(layer):
    # q = 0.05, pi = 0.6: r = 12, A = -1. hi = 1/2 + 1/2 sqrt(1 + 0.8/0.05) = 1/2 + 1/2 sqrt(17) = 2.56 < 12, and
    # min(r*A, hi*A) = min(-12, -2.56) = -12, so PPO's loss is 12; dual clip caps it at -c*A = c.
    case = _one_group([math.log(0.6)], [math.log(0.05)], [-1.0])
    for hp, cap in (({}, 10.0), ({"dual_clip": 3.0}, 3.0)):  # registry default c = r_max = 10; c given: 3
        loss, grad = layer_policy_loss(layer, "dcpo", case, **hp)
        assert loss == pytest.approx(cap, abs=1e-12)
        np.testing.assert_allclose(grad, [[0.0]], atol=1e-12)


@pytest.mark.parametrize("layer", LAYERS)
def test_dcpo_dual_clip_follows_r_max(layer):
    # The reference: c follows r_max unless dual_clip is given. Same token as above (PPO loss 12, hi 2.56 < 5),
    # r_max = 5 and no dual_clip: loss = min(12, 5) = 5.
    case = _one_group([math.log(0.6)], [math.log(0.05)], [-1.0])
    loss, _ = layer_policy_loss(layer, "dcpo", case, r_max=5.0)
    assert loss == pytest.approx(5.0, abs=1e-12)


# ---- DCPO SAS (Eq. 9-12, pooled statistics Eq. 29-30) at three visits ------------------------------------------

def _sas(layer):
    obj = {"spec": spec.SmoothAdvantage, "sim": sim.SmoothAdvantage, "gpu64": gpu.SmoothAdvantage}[layer]()
    return lambda ids, rewards: _np(obj(ids, rewards if layer != "gpu64" else _t(rewards), 2))


@pytest.mark.parametrize("layer", LAYERS)
def test_sas_third_visit_keeps_the_smaller_magnitude(layer):
    """At i >= 3, SA_new and SA_total differ and the rule keeps the one of smaller |.|; G = 2."""
    sas = _sas(layer)
    # visit 1 of p, rewards [0, 1]: mu 1/2, var 1/4, A = [-1, 1] (= GRPO with the population std)
    np.testing.assert_allclose(sas(["p"], [0.0, 1.0]), [-1.0, 1.0], atol=1e-12)
    # visit 2 of p, rewards [1, 1]: A_new = 0 (sigma_new = 0); pooled mu = (1 + 1/2)/2 = 3/4,
    # var = (0 + 1/4)/2 + (1/4)(1/2 - 1)^2 = 3/16 (the population variance of [0, 1, 1, 1]);
    # A_total = (1 - 3/4)/sqrt(3/16) = 1/sqrt(3); at i = 2 SA_new = SA_total = A_total/2 = 1/(2 sqrt 3)
    np.testing.assert_allclose(sas(["p"], [1.0, 1.0]), [1 / (2 * math.sqrt(3))] * 2, atol=1e-12)
    # visit 3 of p with rewards [0, 1], and the first visit of q with [0, 1] in the same call:
    # A_new = [-1, 1]; pooled mu = (1/2 + 2 * 3/4)/3 = 2/3, var = (1/4 + 2 * 3/16)/3 + (2/9)(3/4 - 1/2)^2 = 2/9
    # (the population variance of [0, 1, 1, 1, 0, 1]); sigma = sqrt(2)/3; A_total = [-sqrt 2, 1/sqrt 2].
    # SA_new = 2/3 A_new + 1/3 A_total, SA_total = 1/3 A_new + 2/3 A_total:
    #   reward 0: SA_new = -(2 + sqrt 2)/3 = -1.138, SA_total = -(1 + 2 sqrt 2)/3 = -1.276: keep SA_new
    #   reward 1: SA_new = (2 + 1/sqrt 2)/3 = 0.902, SA_total = (1 + sqrt 2)/3 = 0.805: keep SA_total
    got = sas(["q", "p"], [0.0, 1.0, 0.0, 1.0])
    want = [-1.0, 1.0, -(2 + math.sqrt(2)) / 3, (1 + math.sqrt(2)) / 3]
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_sas_third_visit_exactly():
    """The same third visit in spec as exact surds."""
    sas = spec.SmoothAdvantage()
    for rewards in ([0, 1], [1, 1]):
        sas(["p"], rewards, 2)
    got = sas(["p"], [0, 1], 2)
    assert sp.simplify(got[0] + (2 + sp.sqrt(2)) / 3) == 0 and sp.simplify(got[1] - (1 + sp.sqrt(2)) / 3) == 0


# ---- PPO clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old - d, v_old + d) - R)^2) -----------------------

def _value_loss(layer, v, v_old, ret, **kw):
    mask = np.ones_like(np.asarray(v, dtype=float))
    if layer == "spec":
        loss, grad = spec.value_loss(v, v_old, ret, mask, **kw)
        return float(loss), _np(grad)
    if layer == "sim":
        loss, grad, _ = sim.value_loss(v, v_old, ret, mask, **kw)
        return loss, grad
    tv = _t(v).requires_grad_(True)
    loss, _ = gpu.value_loss(tv, _t(v_old), _t(ret), _t(mask), **kw)
    loss.backward()
    return float(loss.detach()), tv.grad.numpy()


@pytest.mark.parametrize("layer", LAYERS)
def test_value_loss_by_hand(layer):
    # d = 1/4, token_mean over 4 tokens; (v, v_old, R):
    # (1/2, 0, 0):    plain 1/4, clipped v 1/4 -> 1/16; max is plain: l = 1/8, dl/dv = v - R = 1/2
    # (3/4, 1/4, 3/2): plain 9/16, clipped v 1/2 -> (1/2 - 3/2)^2 = 1; max is clipped: l = 1/2, dl/dv = 0
    # (-1/2, 0, -1):  plain 1/4, clipped v -1/4 -> (3/4)^2 = 9/16; max is clipped: l = 9/32, dl/dv = 0
    # (1/8, 0, 1):    inside the clip range: (7/8)^2 = 49/64, l = 49/128, dl/dv = -7/8
    # loss = (16 + 64 + 36 + 49)/128 / 4 = 165/512; grad = [1/2, 0, 0, -7/8] / 4
    loss, grad = _value_loss(layer, [[0.5, 0.75], [-0.5, 0.125]], [[0.0, 0.25], [0.0, 0.0]],
                             [[0.0, 1.5], [-1.0, 1.0]], clip=0.25)
    assert loss == pytest.approx(165 / 512, abs=1e-15)
    np.testing.assert_allclose(grad, [[1 / 8, 0.0], [0.0, -7 / 32]], atol=1e-15)


@pytest.mark.parametrize("layer", LAYERS)
def test_value_loss_default_clip_is_two_tenths(layer):
    # v = 0.5, v_old = 0, R = 1: plain 1/4; clipped v = 0.2 -> 0.8^2 = 0.64 is larger: l = 0.32, dl/dv = 0
    loss, grad = _value_loss(layer, [[0.5]], [[0.0]], [[1.0]])
    assert loss == pytest.approx(0.32, abs=1e-12)
    np.testing.assert_allclose(grad, [[0.0]], atol=1e-12)


# ---- GAE (1506.02438 Eq. 16) with gamma and lambda below 1 -----------------------------------------------------

@pytest.mark.parametrize("layer", LAYERS)
def test_gae_by_hand(layer):
    # gamma = 1/2, lam = 3/4, gamma*lam = 3/8; delta_t = r_t + gamma V_{t+1} - V_t, V after the last token 0.
    # row 0, r = [1, 0, 2], V = [1/2, 1, 1/4]:
    #   delta = [1 + 1/2 - 1/2, 0 + 1/8 - 1, 2 - 1/4] = [1, -7/8, 7/4]
    #   A_2 = 7/4, A_1 = -7/8 + 3/8 * 7/4 = -7/32, A_0 = 1 + 3/8 * (-7/32) = 235/256
    #   returns = A + V = [363/256, 25/32, 2]
    # row 1, the middle token masked (the recursion skips it): r = [1, 9, 2], V = [1/2, 7, 1/4]:
    #   A_2 = 7/4; delta_0 = 1 + 1/2 * 1/4 - 1/2 = 5/8, A_0 = 5/8 + 3/8 * 7/4 = 41/32; returns [57/32, 0, 2]
    rewards = [[1.0, 0.0, 2.0], [1.0, 9.0, 2.0]]
    values = [[0.5, 1.0, 0.25], [0.5, 7.0, 0.25]]
    mask = [[1, 1, 1], [1, 0, 1]]
    want_adv = [[235 / 256, -7 / 32, 7 / 4], [41 / 32, 0.0, 7 / 4]]
    want_ret = [[363 / 256, 25 / 32, 2.0], [57 / 32, 0.0, 2.0]]
    if layer == "gpu64":
        adv, ret = gpu.gae(_t(rewards), _t(values), _t(mask), gamma=0.5, lam=0.75)
    else:
        adv, ret = {"spec": spec.gae, "sim": sim.gae}[layer](rewards, values, mask, gamma=0.5, lam=0.75)
    if layer == "spec":  # dyadic inputs: the exact layer gives the fractions themselves
        assert adv[0, 0] == sp.Rational(235, 256) and ret[1, 0] == sp.Rational(57, 32)
    np.testing.assert_allclose(_np(adv), want_adv, atol=1e-15)
    np.testing.assert_allclose(_np(ret), want_ret, atol=1e-15)


# ---- Group advantages, KL estimators and DAPO's extras -----------------------------------------------------------

def _layer_fn(layer, name):
    if layer == "gpu64":
        fn = getattr(gpu, name)
        return lambda x, *a, **k: _np(fn(_t(x), *a, **k))
    fn = getattr({"spec": spec, "sim": sim}[layer], name)
    return lambda x, *a, **k: _np(fn(x, *a, **k))


@pytest.mark.parametrize("layer", LAYERS)
def test_group_advantages_by_hand(layer):
    # rewards [0, 0, 1, 1], G = 4: mean 1/2; unbiased std = sqrt(4 * (1/4) / 3) = 1/sqrt 3 (the default), eps 1e-6
    fn = _layer_fn(layer, "group_advantages")
    a = 0.5 / (1 / math.sqrt(3) + 1e-6)
    np.testing.assert_allclose(fn([0.0, 0.0, 1.0, 1.0], 4), [-a, -a, a, a], rtol=1e-12)
    # Dr.GRPO: R - mean only
    np.testing.assert_allclose(fn([0.0, 0.0, 1.0, 1.0], 4, kind="dr_grpo"), [-0.5, -0.5, 0.5, 0.5], atol=1e-15)


@pytest.mark.parametrize("layer", LAYERS)
def test_kl_estimators_by_hand(layer):
    # logp = 0, ref_logp = ln 2, so d = ref - logp = ln 2: k1 = -ln 2, k2 = (ln 2)^2 / 2, k3 = 2 - ln 2 - 1
    ln2 = math.log(2.0)
    if layer == "gpu64":
        kl = lambda kind: _np(gpu.kl(_t([0.0]), _t([ln2]), kind))  # noqa: E731
    else:
        kl = lambda kind: _np({"spec": spec, "sim": sim}[layer].kl([0.0], [ln2], kind))  # noqa: E731
    for kind, want in (("k1", -ln2), ("k2", ln2**2 / 2), ("k3", 1 - ln2)):
        np.testing.assert_allclose(kl(kind), [want], rtol=1e-14)


@pytest.mark.parametrize("layer", LAYERS)
def test_overlong_penalty_by_hand(layer):
    # DAPO Eq. 13 with Lmax = 20, Lcache = 4 (start 16): 16 -> 0, 18 -> (16 - 18)/4 = -1/2, 20 -> -1, 21 -> -1
    fn = _layer_fn(layer, "overlong_penalty")
    np.testing.assert_allclose(fn([16.0, 18.0, 20.0, 21.0], max_len=20, cache_len=4), [0.0, -0.5, -1.0, -1.0])


@pytest.mark.parametrize("layer", LAYERS)
def test_dynamic_sampling_filter_by_hand(layer):
    # DAPO Eq. 11 on 0/1 correctness, G = 4: all correct (drop), one of four (keep), none (drop)
    keep = _layer_fn(layer, "dynamic_sampling_filter")([1.0] * 4 + [0.0, 1.0, 0.0, 0.0] + [0.0] * 4, 4)
    assert keep.tolist() == [0.0, 1.0, 0.0]
