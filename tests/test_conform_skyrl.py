"""Each difference the conformance report finds in SkyRL, reproduced by calling SkyRL through its worker (its own
virtualenv); expected numbers are worked by hand in the comments and checked against spec or gpu."""
import math

import numpy as np
import pytest
import torch
from conftest import engine_row, target_worker

import gpu
import spec
from harness.conform.targets.remote import loss_and_grad

# An empty response and a one-token response, on-policy (r = 1), A = 1.
EMPTY_LOGP, EMPTY_MASK, EMPTY_ADV = [[-1.0], [-1.0]], [[0.0], [1.0]], [[1.0], [1.0]]


@pytest.fixture(scope="module")
def skyrl():
    worker = target_worker("skyrl")
    yield worker
    worker.close()


def policy(worker, loss, reduction, logp, old_logp, adv, mask, **kw):
    kw = {"loss": loss, "reduction": reduction, **kw}
    out = worker.call("policy", kw, logp=logp, old_logp=old_logp, adv=adv, mask=mask)
    return loss_and_grad("skyrl", out, np.shape(logp))


@pytest.mark.parametrize("reduction, name, kw", [
    ("sequence_mean", "grpo", {"beta": 0.0}),
    ("seq_mean_token_sum_norm", "dr_grpo", {"max_len": 1}),
])
def test_sequence_means_count_empty_responses(skyrl, reduction, name, kw):
    # the one live response's loss is -r * A = -1; the reference averages over live responses (-1), SkyRL divides
    # by the batch size, empty rows included: -1 / 2
    loss, _ = policy(skyrl, "regular", reduction, EMPTY_LOGP, EMPTY_LOGP, EMPTY_ADV, EMPTY_MASK, max_seq_len=1)
    assert float(spec.policy_loss(name, EMPTY_LOGP, EMPTY_LOGP, EMPTY_ADV, EMPTY_MASK, **kw)[0]) == pytest.approx(-1)
    assert loss == pytest.approx(-0.5)


def test_prompt_mean_counts_prompts_without_tokens(skyrl):
    # two prompts of one response each, the first without tokens: DAPO Eq. 8's mean over groups has one live
    # group (-1); SkyRL's prompt_mean divides by both prompts: -1 / 2
    loss, _ = policy(skyrl, "regular", "prompt_mean", EMPTY_LOGP, EMPTY_LOGP, EMPTY_ADV, EMPTY_MASK,
                     prompt_size=1, config={"eps_clip_high": 0.28})
    eq8, _ = spec.policy_loss("dapo", EMPTY_LOGP, EMPTY_LOGP, EMPTY_ADV, EMPTY_MASK, group_size=1)
    assert float(eq8) == pytest.approx(-1.0)
    assert loss == pytest.approx(-0.5)


def test_token_mean_is_the_default_for_clip_higher(skyrl):
    # groups of one response: DAPO Eq. 8 gives (-1/1 + 0/3) / 2 = -0.5; SkyRL's token_mean -1 / 4
    logp, mask = [[-1.0, 0, 0], [-1.0, -1.0, -1.0]], [[1.0, 0, 0], [1.0, 1.0, 1.0]]
    adv = [[1.0, 0, 0], [0.0, 0.0, 0.0]]
    loss, _ = policy(skyrl, "regular", "token_mean", logp, logp, adv, mask, config={"eps_clip_high": 0.28})
    assert float(spec.policy_loss("dapo", logp, logp, adv, mask, group_size=1)[0]) == pytest.approx(-0.5)
    assert loss == pytest.approx(-0.25)


def test_gspo_clamps_the_log_sequence_ratio_at_10(skyrl):
    # log s = 20 - 0 = 20, A = -0.4: GSPO's loss is -s * A = 0.4 e^20 (unclipped for A < 0, gradient 0.4 e^20);
    # SkyRL clamps log s at 10: 0.4 e^10, gradient 0
    loss, grad = policy(skyrl, "gspo", "sequence_mean", [[20.0]], [[0.0]], [[-0.4]], [[1.0]],
                        config={"eps_clip_low": 3e-4, "eps_clip_high": 4e-4})
    exact, exact_grad = spec.policy_loss("gspo", [[20.0]], [[0.0]], [[-0.4]], [[1.0]])
    assert float(exact) == pytest.approx(0.4 * math.exp(20)) and float(exact_grad[0, 0]) == pytest.approx(float(exact))
    assert loss == pytest.approx(0.4 * math.exp(10), rel=1e-6) and grad[0, 0] == 0.0


def test_clip_cov_selects_on_advantages_already_divided_by_the_token_count(skyrl):
    # on-policy, A = (1.5, -1.5), logp = (0, -2): Cov terms (A - 0)(logp + 1) = (1.5, 1.5), both inside (1, 5), so
    # Clip-Cov detaches both (gradient 0). SkyRL computes them from A / 2 (token_mean): 0.75, outside the window;
    # nothing is selected and the gradient is PPO's, -A / 2 = (-0.75, 0.75)
    logp, adv, mask = [[0.0, -2.0]], [[1.5, -1.5]], [[1.0, 1.0]]
    loss, grad = policy(skyrl, "clip_cov", "token_mean", logp, logp, adv, mask,
                        config={"clip_cov": {"clip_ratio": 1.0}})
    _, exact_grad = spec.policy_loss("clip_cov", logp, logp, adv, mask, clip_cov_ratio=1.0)
    assert np.allclose(np.asarray(exact_grad, dtype=float), 0.0)
    assert loss == pytest.approx(0.0) and np.allclose(grad, [[-0.75, 0.75]])


def test_kl_cov_sums_its_penalty_instead_of_averaging_it(skyrl):
    # A = 0, |log r| = 1 on both tokens; k = max(1, int(0.2 * 2)) = 1 token gets the penalty 1 * |log r| = 1.
    # token mean: 1 / 2; SkyRL's reduction scales only the advantages, so the penalty is summed: 1
    logp, old, adv, mask = [[-1.0, -1.0]], [[0.0, -2.0]], [[0.0, 0.0]], [[1.0, 1.0]]
    loss, _ = policy(skyrl, "kl_cov", "token_mean", logp, old, adv, mask,
                     config={"kl_cov": {"kl_cov_frac": 0.2, "ppo_kl_coef": 1.0}})
    want = spec.policy_loss("kl_cov", logp, old, adv, mask, kl_cov_ratio=0.2, kl_cov_coef=1.0)[0]
    assert float(want) == pytest.approx(0.5)
    assert loss == pytest.approx(1.0)


@pytest.mark.parametrize("norm, want", [(True, -3.0 / (1.0 + 1e-6)), (False, -3.0)])
def test_a_lone_response_keeps_its_reward_as_advantage(skyrl, norm, want):
    # a prompt with one response, R = -3: R - mean_g = 0 (no baseline, no signal); SkyRL takes mean 0 and std 1
    # for such a prompt, so the advantage is R / (1 + eps), or R without the std division
    out = skyrl.call("advantage", {"estimator": "grpo", "group_size": 1, "grpo_norm_by_std": norm},
                     rewards=[[-3.0]], mask=[[1.0]])
    assert float(gpu.group_advantages(torch.tensor([-3.0], dtype=torch.float64), 1, kind="dr_grpo")[0]) == 0.0
    assert out["advantages"][0][0] == pytest.approx(want, rel=1e-6)


def test_gae_bootstraps_from_padded_values_and_whitens(skyrl):
    # rewards (-1, -1, pad), values (-1.7, -3.8, 0.2 on the pad), gamma 1, lambda 0.95. SkyRL runs the recursion
    # over the padded slot: A_2 = 0 - 0.2 = -0.2, A_1 = (-1 + 0.2 + 3.8) + 0.95 * (-0.2) = 2.81,
    # A_0 = (-1 - 3.8 + 1.7) + 0.95 * 2.81 = -0.4305; returns A + V = (-2.1305, -0.99). GAE over the valid tokens
    # stops at the last one: A_1 = -1 + 3.8 = 2.8, A_0 = -3.1 + 0.95 * 2.8 = -0.44, returns (-2.14, -1.0)
    rewards, values, mask = [[-1.0, -1.0, 0.0]], [[-1.7, -3.8, 0.2]], [[1.0, 1.0, 0.0]]
    out = skyrl.call("advantage", {"estimator": "gae", "gamma": 1.0, "lambd": 0.95}, rewards=rewards,
                     values=values, mask=mask)
    assert np.allclose(out["returns"][0][:2], [-2.1305, -0.99])
    _, ret = gpu.gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask), gamma=1.0, lam=0.95)
    assert np.allclose(ret[0, :2].numpy(), [-2.14, -1.0])
    # the advantages come back whitened over the valid tokens: (A - mean) / std with the unbiased std
    raw = np.array([-0.4305, 2.81])
    assert np.allclose(out["advantages"][0][:2], (raw - raw.mean()) / raw.std(ddof=1), atol=1e-6)


def test_the_engine_finds_the_empty_rows_counted(skyrl):  # the fixture skips when the environment is not built
    from harness.conform.targets.skyrl import Target
    row = engine_row(Target, lambda c: c.knob == "loss_reduction=sequence_mean", seeds=4)
    assert row["kind"] == "differs"
    assert any("with empty rows counted" in m for m in row["matches"])


@pytest.mark.parametrize("loss", ["regular", "dual_clip"])
def test_ppo_clamps_the_log_ratio_at_20(skyrl, loss):
    # log r = 25, A = -1: PPO's loss is -r * A = e^25 = 7.2e10 with gradient e^25 (the dual clip at 3 gives 3, so
    # only the plain loss shows the clamp's value); SkyRL's safe_exp_delta clamps log r at 20 (in float32)
    got, grad = policy(skyrl, loss, "token_mean", [[0.0]], [[-25.0]], [[-1.0]], [[1.0]])
    exact, exact_grad = spec.policy_loss("ppo", [[0.0]], [[-25.0]], [[-1.0]], [[1.0]])
    assert float(exact) == pytest.approx(math.exp(25)) and float(exact_grad[0, 0]) == pytest.approx(math.exp(25))
    assert got == pytest.approx(math.exp(20) if loss == "regular" else 3.0, rel=1e-6) and grad[0, 0] == 0.0


def test_at_an_exact_tie_the_float32_ratio_takes_the_clipped_branch(skyrl):
    # old chosen so that exp(logp - old) is exactly 1.2 = 1 + eps in float64, A = 1: PPO's two terms are equal and the
    # reference's unclipped one wins the tie (float64, as the engine compares: gradient -r * A = -1.2); SkyRL's ratio
    # is exp in float32, 1.2000000477 > 1.2, so its clipped branch wins, with gradient 0 (the values differ by 5e-8)
    from harness.conform.cases import exact_offset
    old = exact_offset(np.array([[-1.0]]), 1.2)
    logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    assert torch.exp(logp.detach() - torch.tensor(old)).item() == 1.2
    loss, _ = gpu.policy_loss("ppo", logp, torch.tensor(old), torch.ones(1, 1, dtype=torch.float64),
                              torch.ones(1, 1, dtype=torch.float64))
    loss.backward()
    assert float(logp.grad[0, 0]) == pytest.approx(-1.2)
    got, grad = policy(skyrl, "regular", "token_mean", [[-1.0]], old, [[1.0]], [[1.0]])
    assert got == pytest.approx(float(loss.detach()), abs=1e-6) and grad[0, 0] == 0.0


@pytest.mark.parametrize("estimator", ["reinforce++", "gae"])
def test_reinforce_pp_and_gae_raise_on_a_one_token_mask(skyrl, estimator):
    # one valid token, reward 1 (value 0.5 for GAE): the reference gives REINFORCE++'s whitened advantage 0 (a single
    # token has no spread) and GAE's advantage r - V = 0.5; SkyRL's masked whitening refuses a one-token mask
    from harness.conform.targets.remote import TargetError
    arrays = {"rewards": [[1.0, 0.0]], "mask": [[1.0, 0.0]]}
    mask = torch.tensor(arrays["mask"], dtype=torch.float64)
    if estimator == "gae":
        arrays["values"] = [[0.5, 0.0]]
        want = gpu.gae(torch.tensor(arrays["rewards"]), torch.tensor(arrays["values"]), mask, gamma=1.0, lam=0.95)[0]
        assert float(want[0, 0]) == pytest.approx(0.5)
    else:
        want = gpu.reinforce_pp_advantages(torch.tensor([1.0], dtype=torch.float64), mask)
        assert float(want[0, 0]) == 0.0
    with pytest.raises(TargetError, match="sum of the mask is one"):
        skyrl.call("advantage", {"estimator": estimator, "gamma": 1.0, "lambd": 0.95}, **arrays)


def test_k1_kl_loss_has_the_score_functions_gradient(skyrl):
    # k1 = logp - ref differentiated pathwise is 1 on every token, whatever logp - ref: its expectation under pi is
    # 0 (the score function), so the KL loss pulls nothing towards the reference; k2's gradient is logp - ref
    logp, ref = [[-1.0, -2.0]], [[-1.5, -0.5]]
    out = skyrl.call("kl", {"kl_estimator": "k1", "dtype": "float64"}, logp=logp, ref_logp=ref, mask=[[1.0, 1.0]])
    assert np.asarray(out["value"])[0] == pytest.approx([0.5, -1.5])
    assert np.asarray(out["grad"])[0] == pytest.approx([1.0, 1.0])
    k2 = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    gpu.kl(k2, torch.tensor(ref, dtype=torch.float64), "k2").sum().backward()
    assert k2.grad[0].numpy() == pytest.approx([0.5, -1.5])


@pytest.mark.parametrize("kind, name, delta", [("binary_tv", "dppo_tv", 0.15), ("binary_kl", "dppo_kl", 0.05)])
def test_dppo_takes_the_surrogate_as_its_value(skyrl, kind, name, delta):
    # pi = 0.6 from mu = 0.5, A = 1: inside both trust regions (0.1 < 0.15; KL 0.0204 < 0.05). The gradient is
    # -r A = -1.2 in both; the reference's value is -r A log pi = 1.2 * 0.511, SkyRL's the surrogate -r A = -1.2
    logp, old = [[math.log(0.6)]], [[math.log(0.5)]]
    loss, grad = policy(skyrl, "dppo", "token_mean", logp, old, [[1.0]], [[1.0]],
                        config={"dppo": {"dppo_type": kind, "delta_low": delta, "delta_high": delta}})
    exact, exact_grad = spec.policy_loss(name, logp, old, [[1.0]], [[1.0]])
    assert float(exact) == pytest.approx(-1.2 * math.log(0.6))
    assert loss == pytest.approx(-1.2) and grad[0, 0] == pytest.approx(float(exact_grad[0, 0])) == pytest.approx(-1.2)
