"""Each difference the conformance report finds in RLinf, reproduced by calling RLinf through its worker (its own
virtualenv); expected numbers are worked by hand in the comments and checked against spec."""
import math

import numpy as np
import pytest
from conftest import target_worker

import spec
from harness.conform.targets.remote import worker_loss


@pytest.fixture(scope="module")
def rlinf():
    worker = target_worker("rlinf")
    yield worker
    worker.close()


def policy(worker, logp, old_logp, adv, mask, **kw):
    return worker_loss(worker, "policy", kw, logp=logp, old_logp=old_logp, adv=adv, mask=mask)


def test_an_empty_first_row_makes_the_loss_0(rlinf):
    # the first response has no tokens, the second one token at r = 1 with A = 1: PPO's token mean is -1; the
    # actor's fast_path_zero_loss_mask looks at the first row only and returns 0
    logp, mask, adv = [[-1.0], [-1.0]], [[0.0], [1.0]], [[1.0], [1.0]]
    assert float(spec.policy_loss("ppo", logp, logp, adv, mask, agg="token_mean")[0]) == pytest.approx(-1.0)
    loss, grad = policy(rlinf, logp, logp, adv, mask)
    assert loss == 0.0 and not grad.any()
    # the same rows in the other order: the first row has a token, and the loss is the token mean
    loss, _ = policy(rlinf, logp[::-1], logp[::-1], adv, mask[::-1])
    assert loss == pytest.approx(-1.0)


def test_seq_mean_token_mean_gives_nan_on_an_empty_row(rlinf):
    # rows (1 token, 0 tokens): the empty row's token mean is 0 / 0; the reference averages over rows with tokens
    logp, mask, adv = [[-1.0], [-1.0]], [[1.0], [0.0]], [[1.0], [1.0]]
    loss, _ = policy(rlinf, logp, logp, adv, mask, agg="seq-mean-token-mean")
    assert float(spec.policy_loss("grpo", logp, logp, adv, mask, beta=0.0)[0]) == pytest.approx(-1.0)
    assert math.isnan(loss)


def test_the_kl_loss_passes_the_reference_first(rlinf):
    # logp - ref = 0.5: k1 = 0.5 and k3 = e^-0.5 + 0.5 - 1 = 0.1065 (spec); the actor's kl_penalty(ref, logp)
    # gives ref - logp = -0.5 and e^0.5 - 0.5 - 1 = 0.1487
    for name, want, got in (("k1", 0.5, -0.5), ("k3", math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5)):
        out = rlinf.call("kl", {"kl_estimator": name, "dtype": "float64"}, logp=[[0.0]], ref_logp=[[-0.5]],
                         mask=[[1.0]])
        assert float(spec.kl([0.0], [-0.5], name)[0]) == pytest.approx(want)
        assert np.asarray(out["value"])[0, 0] == pytest.approx(got)


def test_reinpp_raises_on_float64_rewards(rlinf):
    # the token rewards are built as float32 and scattered with the rewards' own dtype
    from harness.conform.targets.remote import TargetError
    with pytest.raises(TargetError, match="scatter"):
        rlinf.call("advantage", {"estimator": "reinpp", "group_size": 1, "dtype": "float64"}, rewards=[1.0, 0.0],
                   mask=[[1.0], [1.0]])
