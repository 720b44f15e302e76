"""Each difference the conformance report finds in OpenPipe ART, reproduced by calling ``art.loss.loss_fn`` through
its worker (its own virtualenv), and its default loss checked against spec; expected numbers are worked by hand."""
import math

import numpy as np
import pytest
from conftest import target_worker

import spec
from harness.conform.targets.remote import worker_loss


@pytest.fixture(scope="module")
def art():
    worker = target_worker("art")
    yield worker
    worker.close()


def loss(worker, logp, old_logp, adv, mask, **config):
    return worker_loss(worker, "policy", config, logp=logp, old_logp=old_logp, adv=adv, mask=mask)


def test_the_default_loss_is_cispo_with_a_relative_cap(art):
    # one token at r = e^2 = 7.4 with A = 1 and one at r = 1 with A = -1: CISPO's weight min(r, 1 + 4) = 5 and 1
    logp, old, adv, mask = [[0.0, -1.0]], [[-2.0, -1.0]], [[1.0, -1.0]], [[1.0, 1.0]]
    value, grad = loss(art, logp, old, adv, mask)
    want, want_grad = spec.policy_loss("cispo", logp, old, adv, mask)
    assert grad[0] == pytest.approx([-5 / 2, 1 / 2]) and grad[0] == pytest.approx(np.asarray(want_grad, float)[0])
    assert value == pytest.approx(float(want))


def test_ppo_clamps_the_log_ratio_at_20(art):
    # log r = 25 with A = -1: PPO's loss -r * A = e^25 (spec); ART's exp(clamp(25, -20, 20)) gives e^20, gradient 0
    value, grad = loss(art, [[0.0]], [[-25.0]], [[-1.0]], [[1.0]], ppo=True)
    assert float(spec.policy_loss("ppo", [[0.0]], [[-25.0]], [[-1.0]], [[1.0]])[0]) == pytest.approx(math.exp(25))
    assert value == pytest.approx(math.exp(20)) and grad[0, 0] == 0.0


def test_clip_higher_averages_over_all_tokens_not_per_group(art):
    # groups of one response: 1 token with A = 1 and 3 tokens with A = 0, on-policy: DAPO Eq. 8 gives
    # (-1/1 + 0/3) / 2 = -0.5; ART divides the sum by the batch's 4 tokens
    logp, mask = [[-1.0, 0, 0], [-1.0, -1.0, -1.0]], [[1.0, 0, 0], [1.0, 1.0, 1.0]]
    adv = [[1.0, 0, 0], [0.0, 0.0, 0.0]]
    value, _ = loss(art, logp, logp, adv, mask, ppo=True, epsilon_high=0.28)
    assert float(spec.policy_loss("dapo", logp, logp, adv, mask, group_size=1)[0]) == pytest.approx(-0.5)
    assert value == pytest.approx(-0.25)
