"""Each difference the conformance report finds in AReaL, reproduced by calling AReaL through its worker (its own
virtualenv); expected numbers are worked by hand in the comments and checked against spec."""
import math

import numpy as np
import pytest
from conftest import engine_row, target_worker

import spec
from harness.conform.targets.remote import loss_and_grad

# Two on-policy responses (r = 1): one token with A = 1, three tokens with A = 0.5 (sequence-level advantages).
LOGP = [[-1.0, 0.0, 0.0], [-1.0, -2.0, -0.5]]
ADV = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5]]
MASK = [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


@pytest.fixture(scope="module")
def areal():
    worker = target_worker("areal")
    yield worker
    worker.close()


def call(worker, op, kw, **arrays):
    return loss_and_grad("areal", worker.call(op, kw, **arrays), np.shape(arrays["logp"]))


def test_clip_higher_averages_over_all_tokens_not_per_group(areal):
    # groups of one response each: DAPO Eq. 8 averages the groups' token means, (-1/1 + 0/3) / 2 = -0.5; AReaL
    # divides the token sum by the batch's 4 tokens: -1/4
    adv = [[1.0, 0, 0], [0.0, 0.0, 0.0]]
    loss, _ = call(areal, "ppo", {"eps_clip": 0.2, "eps_clip_higher": 0.28}, logp=LOGP, old_logp=LOGP, adv=adv,
                   mask=MASK)
    eq8, _ = spec.policy_loss("dapo", LOGP, LOGP, adv, MASK, group_size=1)
    assert float(eq8) == pytest.approx(-0.5)
    assert loss == pytest.approx(-0.25)


def test_gspo_averages_the_sequence_loss_over_tokens(areal):
    # s_i = 1 on-policy, so the sequence losses are -A_i = -1 and -0.5. GSPO Eq. 5: mean over the 2 sequences,
    # -0.75, with d/d logp_it = -A_i / (2 |o_i|). AReaL repeats each sequence's loss on its tokens and takes the
    # token mean: (-1 - 3 * 0.5) / 4 = -0.625, with d/d logp_it = -A_i / 4 (long responses weigh more)
    kw = {"eps_clip": 3e-4, "eps_clip_higher": 4e-4, "importance_sampling_level": "sequence"}
    loss, grad = call(areal, "ppo", kw, logp=LOGP, old_logp=LOGP, adv=ADV, mask=MASK)
    exact, exact_grad = spec.policy_loss("gspo", LOGP, LOGP, ADV, MASK)
    assert float(exact) == pytest.approx(-0.75)
    assert np.allclose(np.asarray(exact_grad, dtype=float)[1], [-0.5 / 6] * 3)
    assert loss == pytest.approx(-0.625)
    assert np.allclose(grad, [[-0.25, 0, 0], [-0.125] * 3])


def test_sapo_averages_over_tokens_not_sequences(areal):
    # at r = 1 the gate is (4 / tau) * sigmoid(0) = 2 (tau_pos = 1): token losses -2 * A = -2 and -1 (x3).
    # SAPO Eq. 5 (mean over sequences of token means): (-2 - 1) / 2 = -1.5; AReaL: (-2 - 3) / 4 = -1.25
    loss, _ = call(areal, "sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, logp=LOGP, old_logp=LOGP, adv=ADV, mask=MASK)
    assert float(spec.policy_loss("sapo", LOGP, LOGP, ADV, MASK)[0]) == pytest.approx(-1.5)
    assert loss == pytest.approx(-1.25)


def test_dual_clip_caps_the_negative_advantage_loss(areal):
    # r = e^2, A = -3: PPO's loss is -r * A = 3 e^2 = 22.17; with c = 3 it is capped at -c * A = 9, gradient 0
    loss, grad = call(areal, "ppo", {"eps_clip": 0.2, "c_clip": 3.0}, logp=[[-2.0]], old_logp=[[-4.0]],
                      adv=[[-3.0]], mask=[[1.0]])
    assert loss == pytest.approx(9.0) and grad[0, 0] == 0.0
    plain, _ = call(areal, "ppo", {"eps_clip": 0.2}, logp=[[-2.0]], old_logp=[[-4.0]], adv=[[-3.0]], mask=[[1.0]])
    assert plain == pytest.approx(3 * math.exp(2))


def test_dpo_is_eq7_on_sequence_sums(areal):
    # chosen: policy -1 - 2 = -3, reference -3.1; rejected (one token): policy -3, reference -2.
    # margin = (-3 + 3.1) - (-3 + 2) = 1.1; loss = log(1 + exp(-beta * 1.1)); d/d logp(chosen token) =
    # -beta * sigmoid(-beta * 1.1), the rejected token the opposite. AReaL computes it in float32.
    logp, ref_logp, mask = [[-1.0, -2.0], [-3.0, -1.0]], [[-1.1, -2.0], [-2.0, -2.0]], [[1.0, 1.0], [1.0, 0.0]]
    beta = 0.1
    loss, grad = call(areal, "dpo", {"beta": beta}, logp=logp, ref_logp=ref_logp, mask=mask)
    assert loss == pytest.approx(math.log1p(math.exp(-0.11)), rel=1e-6)
    g = beta / (1 + math.exp(0.11))
    assert np.allclose(grad, [[-g, -g], [g, 0.0]], rtol=1e-6)
    want, _ = spec.dpo_loss([-3.0], [-3.0], [-3.1], [-2.0], beta=beta)
    assert loss == pytest.approx(float(want), rel=1e-6)


def test_the_engine_finds_the_token_averaged_gspo(areal):  # the fixture skips when the environment is not built
    from harness.conform.targets.areal import Target
    row = engine_row(Target, lambda c: c.algorithm == "gspo", seeds=3)
    assert row["kind"] == "differs" and "gspo[agg=token_mean]" in row["matches"]
    assert row["findings"][0]["minimal_input"]["tokens"] >= 2  # one token per batch cannot tell the two means apart


def test_gspo_with_per_token_advantages_averages_them_through_the_sequence_ratio(areal):
    # on-policy (s = 1), one row, A = (1, -1): GSPO-token (Eq. 13) gives each token the gradient -s * A_t / 2 =
    # (-0.5, 0.5); AReaL multiplies the sequence ratio s by each A_t and averages the tokens, so the gradient is
    # -(A_1 + A_2) / 2 * ds / dlogp_t = 0, GSPO's with the row's mean advantage 0 (the values agree: 0)
    logp, adv, mask = [[-1.0, -2.0]], [[1.0, -1.0]], [[1.0, 1.0]]
    out = areal.call("ppo", {"eps_clip": 3e-4, "eps_clip_higher": 4e-4, "importance_sampling_level": "sequence"},
                     logp=logp, old_logp=logp, adv=adv, mask=mask)
    exact, exact_grad = spec.policy_loss("gspo_token", logp, logp, adv, mask)
    assert float(exact) == pytest.approx(0.0) and np.ravel(exact_grad.astype(float)) == pytest.approx([-0.5, 0.5])
    mean_adv = np.ravel(spec.policy_loss("gspo", logp, logp, adv, mask, agg="token_mean")[1].astype(float))
    assert out["loss"] == pytest.approx(0.0) and np.ravel(out["grad"]) == pytest.approx(mean_adv)
    assert mean_adv == pytest.approx([0.0, 0.0])


def test_kl_estimator_clamps_every_value_to_10(areal):
    # the KL penalty of AReaL's rewards: logp - ref = 30 nats gives k1 = 30 (spec); KLEstimator clamps it at 10
    out = areal.call("kl", {"kl_estimator": "k1", "dtype": "float64"}, logp=[[0.0]], ref_logp=[[-30.0]], mask=[[1.0]])
    assert float(spec.kl([0.0], [-30.0], "k1")[0]) == pytest.approx(30.0)
    assert np.asarray(out["value"])[0, 0] == 10.0
