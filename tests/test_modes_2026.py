"""The 2026 modes (DPPO, LUSPO, VESPO, GDPO's advantage, sequence rejection masks, DeepSeek-V3.2's off-policy
sequence mask): values worked out by hand from the papers in every layer, and bad input. Expected values are literals
with their arithmetic beside them, never taken from a layer; tests/test_differential.py holds the layers together
on generated batches for every registry algorithm and option."""
import math

import numpy as np
import pytest
import torch

import gpu
import sim
import spec

LAYERS = ("spec", "sim", "gpu")


def run(layer, name, logp, old, adv, mask, **kw):
    """(loss, gradient in logp, stats or None) of one layer in float64."""
    logp, old, adv, mask = (np.asarray(x, dtype=np.float64) for x in (logp, old, adv, mask))
    if layer == "spec":
        loss, grad = spec.policy_loss(name, logp, old, adv, mask, **kw)
        return float(loss), np.asarray(grad, dtype=object).astype(float), None
    if layer == "sim":
        return sim.policy_loss(name, logp, old, adv, mask, **kw)
    t = torch.tensor(logp, requires_grad=True)
    loss, stats = gpu.policy_loss(name, t, torch.tensor(old), torch.tensor(adv), torch.tensor(mask), **kw)
    loss.backward()
    return float(loss.detach()), t.grad.numpy(), stats


# -- DPPO (Qi et al. 2602.04879): -sg(M r) A log pi, M the Binary-TV / Binary-KL trust-region mask ----------------

# Four tokens (mu = pi_old, pi, A), one row, token mean (each token weighs 1/4):
# t0: mu 0.001 -> pi 0.01, A +1: r = 10, far past PPO's 1.2, but pi - mu = 0.009 <= 0.15 and
#     KL = 0.001 log(0.1) + 0.999 log(0.999/0.99) = 0.00674 <= 0.05: kept by both, gradient -10 * 1 / 4 = -2.5
# t1: mu 0.9 -> pi 0.74, A -1: r = 0.822, inside PPO's 0.8, but pi - mu = -0.16 < -0.15 and
#     KL = 0.9 log(0.9/0.74) + 0.1 log(0.1/0.26) = 0.0806 > 0.05: masked by both, gradient 0
# t2: mu 0.05 -> pi 0.15, A +1: pi - mu = 0.1 <= 0.15, kept by TV (r = 3: gradient -3/4 = -0.75);
#     KL = 0.05 log(1/3) + 0.95 log(0.95/0.85) = 0.0507 > 0.05: masked by KL
# t3: mu 0.5 -> pi 1, A +1: pi - mu = 0.5 > 0.15 and KL infinite (pi = 1): masked by both
DPPO_MU = [0.001, 0.9, 0.05, 0.5]
DPPO_PI = [0.01, 0.74, 0.15, 1.0]
DPPO_ADV = [1.0, -1.0, 1.0, 1.0]
DPPO_WANT = {  # loss = sum of -M r A log pi / 4
    "dppo_tv": (-(10 * math.log(0.01) + 3 * math.log(0.15)) / 4, [-2.5, 0.0, -0.75, 0.0], 0.5),
    "dppo_kl": (-(10 * math.log(0.01)) / 4, [-2.5, 0.0, 0.0, 0.0], 0.75),
}


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("name", list(DPPO_WANT))
def test_dppo_masks_by_divergence_not_by_ratio(layer, name):
    want_loss, want_grad, masked = DPPO_WANT[name]
    loss, grad, stats = run(layer, name, [np.log(DPPO_PI)], [np.log(DPPO_MU)], [DPPO_ADV], [[1.0] * 4])
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, [want_grad], rtol=1e-12, atol=1e-15)
    if stats is not None:
        assert stats["clip_frac"] == pytest.approx(masked)


@pytest.mark.parametrize("layer", LAYERS)
def test_dppo_kl_keeps_a_token_moving_against_its_advantage(layer):
    # mu 0.9 -> pi 0.5 with A > 0 (the update moved it the other way): KL = 0.9 log(1.8) + 0.1 log(0.2) = 0.368 is
    # far past 0.05, yet only a move up is masked for A > 0: kept, r = 5/9, gradient -r A = -5/9
    loss, grad, _ = run(layer, "dppo_kl", [[math.log(0.5)]], [[math.log(0.9)]], [[1.0]], [[1.0]])
    assert grad[0, 0] == pytest.approx(-5 / 9, rel=1e-12)
    assert loss == pytest.approx(-5 / 9 * math.log(0.5), rel=1e-12)


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_needs_old_probabilities(layer, name):
    with pytest.raises(ValueError, match=f"old_logp: {name} needs log-probabilities <= 0"):
        run(layer, name, [[-1.0]], [[0.5]], [[1.0]], [[1.0]])
    run(layer, name, [[-1.0, 2.0]], [[-0.5, 0.5]], [[1.0, 1.0]], [[1.0, 0.0]])  # padding is not read


# -- LUSPO (Liu et al. 2602.05261): GSPO's sequence loss times the response length --------------------------------

@pytest.mark.parametrize("layer", LAYERS)
def test_luspo_scales_each_sequence_by_its_length(layer):
    # Row 0: one token, log-ratio 0.001, A +1: s0 = e^0.001, inside [1 - 2e-3, 1 + 2.5e-3]; l0 = -s0.
    # Row 1: three tokens, log-ratios 0.01, 0, -0.004 (mean 0.002), A -1: s1 = e^0.002, inside; l1 = +s1.
    # LUSPO = (1 * l0 + 3 * l1) / 2; d/dlogp of s_i is s_i / |o_i|, so row 0's token gets -s0 / 2 and each of row
    # 1's tokens 3 * s1 / 3 / 2 = s1 / 2: the same scale for every token (GSPO gives row 1's tokens s1 / 6).
    old = np.full((2, 3), -1.0)
    logp = old + [[0.001, 0.0, 0.0], [0.01, 0.0, -0.004]]
    adv, mask = [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    s0, s1 = math.exp(0.001), math.exp(0.002)
    loss, grad, _ = run(layer, "luspo", logp, old, adv, mask)
    assert loss == pytest.approx((-s0 + 3 * s1) / 2, rel=1e-12)
    np.testing.assert_allclose(grad, [[-s0 / 2, 0.0, 0.0], [s1 / 2] * 3], rtol=1e-12, atol=1e-15)
    # past the clip (a mean log-ratio of 0.01 for A > 0: s = e^0.01 > 1.0025) the row gets no gradient, as in GSPO
    loss, grad, _ = run(layer, "luspo", old + 0.01, old, adv, mask)
    assert (grad[0] == 0).all() and loss == pytest.approx((-(1 + 2.5e-3) + 3 * math.exp(0.01)) / 2, rel=1e-12)


# -- VESPO (2602.10693 Sec. 3.4): -sg(phi(W)) A log pi, phi(W) = W^c1 e^(c2 (1 - W)), W = prod_t r_t -------------

@pytest.mark.parametrize("layer", LAYERS)
def test_vespo_reshapes_the_sequence_weight(layer):
    # Row 0: log-ratios (log 2, 0), A +1: W = 2, (c1, c2) = (2, 3): phi = 4 e^-3.
    # Row 1: log-ratios (0, -log 2), A -1: W = 1/2, (c1, c2) = (3, 2): phi = e / 8.
    # Token mean over 4 tokens: d/dlogp = -phi A / 4: row 0 -e^-3 each, row 1 e / 32 each.
    old = np.full((2, 2), -1.0)
    logp = old + [[math.log(2.0), 0.0], [0.0, -math.log(2.0)]]
    adv, mask = [[1.0, 1.0], [-1.0, -1.0]], np.ones((2, 2))
    phi0, phi1 = 4 * math.exp(-3.0), math.e / 8
    loss, grad, _ = run(layer, "vespo", logp, old, adv, mask)
    np.testing.assert_allclose(grad, [[-phi0 / 4] * 2, [phi1 / 4] * 2], rtol=1e-12)
    assert loss == pytest.approx(-(phi0 * logp[0].sum() - phi1 * logp[1].sum()) / 4, rel=1e-12)
    # on policy (W = 1) phi = 1: REINFORCE's -A / 4; a row whose weight is past the float range gets exactly 0
    _, grad, _ = run(layer, "vespo", old, old, adv, mask)
    np.testing.assert_allclose(grad, [[-0.25] * 2, [0.25] * 2], rtol=1e-12)
    far = old + [[1e300, 0.0], [0.0, 0.0]]
    loss, grad, _ = run(layer, "vespo", far, old, adv, mask)
    assert (grad[0] == 0).all() and loss == pytest.approx(-(old[1].sum() * -1) / 4, rel=1e-12)


@pytest.mark.parametrize("layer", LAYERS)
def test_vespo_refuses_a_decay_below_its_floor(layer):
    with pytest.raises(ValueError, match="vespo_lambda_neg: expected a decay >= 1e-30"):
        run(layer, "vespo", [[-1.0]], [[-1.0]], [[1.0]], [[1.0]], vespo_lambda_neg=1e-40)
    with pytest.raises(ValueError, match="vespo_k_pos: expected a number > 0"):
        run(layer, "vespo", [[-1.0]], [[-1.0]], [[1.0]], [[1.0]], vespo_k_pos=0.0)


# -- GDPO (Liu et al. 2601.05242): each reward standardised in its group, the weighted sum over the batch ----------

ADVANTAGE_LAYERS = {"spec": lambda r, **kw: np.asarray(spec.gdpo_advantages(r, 2, **kw), dtype=object).astype(float),
                    "sim": lambda r, **kw: sim.gdpo_advantages(r, 2, **kw),
                    "gpu": lambda r, **kw: gpu.gdpo_advantages(torch.tensor(r), 2, **kw).numpy()}


@pytest.mark.parametrize("layer", list(ADVANTAGE_LAYERS))
def test_gdpo_keeps_reward_combinations_apart(layer):
    # Two groups of 2, rewards (correct, format): group A (0, 1), (0, 0); group B (1, 1), (0, 0). GRPO on the sums
    # (1, 0) and (2, 0) gives +-1/sqrt(2) in both groups. GDPO, eps 0, unbiased std: in A the first reward is constant
    # (0, 0), the second +-1/sqrt(2); in B both are +-1/sqrt(2): sums s(1, -1, 2, -2), s = 1/sqrt(2); over the batch
    # mean 0, std sqrt(10 s^2 / 3) = sqrt(5/3): (1, -1, 2, -2) * sqrt(3/10).
    rewards = np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    got = ADVANTAGE_LAYERS[layer](rewards, eps=0.0)
    np.testing.assert_allclose(got, np.array([1, -1, 2, -2]) * math.sqrt(0.3), rtol=1e-12)
    # weights (2, 1): sums s(1, -1, 3, -3), std sqrt(20 s^2 / 3): (1, -1, 3, -3) * sqrt(3/20)
    got = ADVANTAGE_LAYERS[layer](rewards, eps=0.0, weights=[2.0, 1.0])
    np.testing.assert_allclose(got, np.array([1, -1, 3, -3]) * math.sqrt(0.15), rtol=1e-12)
    # every reward constant in its group: no signal, advantage 0 (0 / (0 + eps))
    np.testing.assert_array_equal(ADVANTAGE_LAYERS[layer](np.ones((4, 2))), np.zeros(4))


@pytest.mark.parametrize("layer", list(ADVANTAGE_LAYERS))
def test_gdpo_bad_input(layer):
    rewards = np.zeros((4, 2))
    with pytest.raises(ValueError, match="weights: expected 2 numbers, one per reward"):
        ADVANTAGE_LAYERS[layer](rewards, weights=[1.0])
    with pytest.raises(ValueError, match="weights: expected a finite number"):
        ADVANTAGE_LAYERS[layer](rewards, weights=[1.0, math.nan])
    with pytest.raises(ValueError, match="rewards: expected a 2-D (array|tensor)"):
        ADVANTAGE_LAYERS[layer](np.zeros(4))
    with pytest.raises(ValueError, match="rewards: expected a \\[B, N\\] array with N >= 1"):
        ADVANTAGE_LAYERS[layer](np.zeros((4, 0)))


# -- rejection sampling of whole sequences (verl's rollout_rs sequence / geometric): weight 1 kept, 0 cut ----------

# Three rows of two tokens, rho = exp(old_logp - rollout_logp) per token, band [0.5, 2]:
# row 0: log rho (0.5, 0.5): product e^1 = 2.72 (cut by seq_rs), geometric mean e^0.5 = 1.65 (kept by geo_rs)
# row 1: log rho (0.2, 0.2): product e^0.4 = 1.49, geometric mean e^0.2 = 1.22: kept by both, with weight 1
#        (seq_mis would weigh it 1.49)
# row 2: log rho (1.0, 0.6): product e^1.6 = 4.95, geometric mean e^0.8 = 2.23: cut by both
# PPO on policy (r = 1), A = 1, token mean over 6 tokens: a kept token has loss -1/6 and gradient -1/6.
RS_LOG_RHO = [[0.5, 0.5], [0.2, 0.2], [1.0, 0.6]]
RS_WANT = {"seq_rs": [0, 0, 1, 1, 0, 0], "geo_rs": [1, 1, 1, 1, 0, 0],
           "seq_mis": [0, 0, math.exp(0.4), math.exp(0.4), 0, 0]}


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("kind", list(RS_WANT))
def test_sequence_rejection_masks_whole_rows(layer, kind):
    old = np.full((3, 2), -1.0)
    weight = np.array(RS_WANT[kind], dtype=float).reshape(3, 2)
    loss, grad, stats = run(layer, "ppo", old, old, np.ones((3, 2)), np.ones((3, 2)), rollout_correction=kind,
                            rollout_logp=old - np.array(RS_LOG_RHO), mis_low=0.5, mis_high=2.0)
    np.testing.assert_allclose(grad, -weight / 6, rtol=1e-12)
    assert loss == pytest.approx(-weight.sum() / 6, rel=1e-12)
    if stats is not None:
        assert stats["rc_cut_frac"] == pytest.approx((weight == 0).mean())


# -- DeepSeek-V3.2's off-policy sequence mask (2512.02556, OPSM): drop A < 0 tokens of rows far from pi_old -------

@pytest.mark.parametrize("layer", LAYERS)
def test_off_policy_sequence_mask_drops_negative_tokens_of_stale_rows(layer):
    # GPG (loss -A logp, token mean over 4 tokens), delta 0.3. Row 0: log(pi_old / pi) = 0.5 a token, mean 0.5 > 0.3:
    # its A < 0 token is dropped, its A > 0 token kept (gradient -1/4). Row 1: mean 0.1 <= 0.3, both A < 0 tokens
    # kept (gradient +1/4). Loss -(1 * -1.5 + -1 * -1.1 + -1 * -1.1) / 4 = -0.175.
    old = np.full((2, 2), -1.0)
    logp = np.array([[-1.5, -1.5], [-1.1, -1.1]])
    adv = np.array([[-1.0, 1.0], [-1.0, -1.0]])
    loss, grad, stats = run(layer, "gpg", logp, old, adv, np.ones((2, 2)), opsm_delta=0.3)
    np.testing.assert_allclose(grad, [[0.0, -0.25], [0.25, 0.25]], rtol=1e-12)
    assert loss == pytest.approx(-0.175, rel=1e-12)
    if stats is not None:
        assert stats["opsm_frac"] == 0.25
    with pytest.raises(ValueError, match="opsm_delta: expected None or a number >= 0"):
        run(layer, "gpg", logp, old, adv, np.ones((2, 2)), opsm_delta=-1.0)
