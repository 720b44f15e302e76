"""The 2026 policy-loss modes (DPPO): values worked out by hand from the papers in every layer, the layers against
each other on generated batches, and bad input. Expected values are literals with their arithmetic beside them,
never taken from a layer."""
import math

import numpy as np
import pytest
import torch

import gpu
import sim
import spec
from harness.verify.cases import make_case
from harness.verify.layers import policy_case

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


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("seed", range(6))
def test_dppo_layers_agree_on_generated_batches(name, seed):
    for pair, (d_value, d_grad) in policy_case(name, make_case(seed, extreme=seed % 2 == 0),
                                               exact=seed < 2).items():
        assert d_value <= 1 and d_grad <= 1, (pair, d_value, d_grad)


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_needs_old_probabilities(layer, name):
    with pytest.raises(ValueError, match=f"old_logp: {name} needs log-probabilities <= 0"):
        run(layer, name, [[-1.0]], [[0.5]], [[1.0]], [[1.0]])
    run(layer, name, [[-1.0, 2.0]], [[-0.5, 0.5]], [[1.0, 1.0]], [[1.0, 0.0]])  # padding is not read
