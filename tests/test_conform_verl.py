"""Each difference the conformance report finds in verl, reproduced by calling verl directly, and the engine's
verdicts on a few checks. Values in the comments are worked by hand from the reference formulas."""
import math

import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos")
from verl.trainer.ppo import core_algos as ca  # noqa: E402

import gpu  # noqa: E402
import spec  # noqa: E402
from harness.conform.engine import run_check  # noqa: E402
from harness.conform.targets.verl import Target, actor_config  # noqa: E402


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def vanilla(logp, old, adv, mask, mode="token-mean", **cfg):
    lp = t(logp).requires_grad_(True)
    loss, _ = ca.get_policy_loss_fn("vanilla")(t(old), lp, t(adv), t(mask), mode,
                                               actor_config(loss_agg_mode=mode, **cfg))
    loss.backward()
    return float(loss.detach()), lp.grad.numpy()


def test_vanilla_always_applies_the_dual_clip_c_3():
    # r = e^2, A = -3: PPO's loss is -r*A = 3e^2 = 22.17; verl caps it at -c*A = 9 and its gradient vanishes
    loss, grad = vanilla([[-2.0]], [[-4.0]], [[-3.0]], [[1.0]])
    exact, _ = spec.policy_loss("ppo", [[-2.0]], [[-4.0]], [[-3.0]], [[1.0]])
    assert float(exact) == pytest.approx(3 * math.exp(2))
    assert loss == pytest.approx(9.0) and grad[0, 0] == 0.0
    capped, _ = spec.policy_loss("ppo", [[-2.0]], [[-4.0]], [[-3.0]], [[1.0]], dual_clip=3.0)
    assert loss == pytest.approx(float(capped))


def test_the_dapo_recipe_averages_over_all_tokens_not_per_group():
    # two groups of one response: 1 token with A = 1 and 3 tokens with A = 0, on-policy (r = 1)
    logp = [[-1.0, 0, 0], [-1.0, -1.0, -1.0]]
    adv, mask = [[1.0, 0, 0], [0.0, 0.0, 0.0]], [[1.0, 0, 0], [1.0, 1.0, 1.0]]
    loss, _ = vanilla(logp, logp, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    eq8, _ = spec.policy_loss("dapo", logp, logp, adv, mask, group_size=1)
    token_mean, _ = spec.policy_loss("dapo", logp, logp, adv, mask, group_size=1, agg="token_mean")
    assert float(eq8) == pytest.approx(-0.5)  # mean over groups of (-1/1, 0/3)
    assert loss == pytest.approx(-0.25) == pytest.approx(float(token_mean))  # -1 / 4 tokens


def test_gspo_clamps_the_log_sequence_ratio_at_10():
    cfg = actor_config(loss_agg_mode="seq-mean-token-mean", clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    lp = t([[8.0]]).requires_grad_(True)
    loss, _ = ca.get_policy_loss_fn("gspo")(t([[-4.0]]), lp, t([[-1.0]]), t([[1.0]]), "seq-mean-token-mean", cfg)
    loss.backward()
    exact, grad = spec.policy_loss("gspo", [[8.0]], [[-4.0]], [[-1.0]], [[1.0]])
    assert float(exact) == pytest.approx(math.exp(12))  # -s*A with s = e^12, unclipped for A < 0
    assert float(loss.detach()) == pytest.approx(math.exp(10)) and float(lp.grad) == 0.0
    assert float(grad[0, 0]) == pytest.approx(math.exp(12))


def test_sapo_ignores_loss_agg_mode():
    logp = [[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]]
    old = [[-1.2, -1.2, -1.2], [-0.8, 0.0, 0.0]]
    adv, mask = [[1.0] * 3, [-1.0] * 3], [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    fn = ca.get_policy_loss_fn("sapo")
    values = {m: float(fn(t(old), t(logp), t(adv), t(mask), m, actor_config(loss_agg_mode=m))[0])
              for m in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")}
    seq_mean = float(spec.policy_loss("sapo", logp, old, adv, mask)[0])
    token_mean = float(spec.policy_loss("sapo", logp, old, adv, mask, agg="token_mean")[0])
    assert abs(seq_mean - token_mean) > 0.05
    assert all(v == pytest.approx(seq_mean) for v in values.values())


def test_low_var_kl_is_clamped_at_10_and_k3_plus_has_k2s_gradient():
    kl = float(ca.kl_penalty(t([0.0]), t([30.0]), "low_var_kl")[0])
    assert kl == 10.0 and float(spec.kl([0.0], [30.0], "k3")[0]) == pytest.approx(math.exp(30) - 31)
    lp = t([-1.0, -2.0]).requires_grad_(True)
    ref = t([-1.5, -0.5])
    value = ca.kl_penalty(lp, ref, "k3+")
    value.sum().backward()
    assert value.detach().numpy() == pytest.approx(spec.kl([-1.0, -2.0], [-1.5, -0.5], "k3").astype(float))
    assert lp.grad.numpy() == pytest.approx([0.5, -1.5])  # d/dlogp (logp - ref)^2 / 2, k2's gradient
    assert lp.grad.numpy() != pytest.approx([1 - math.exp(-0.5), 1 - math.exp(1.5)])  # k3's gradient


def test_a_lone_response_keeps_its_raw_reward_as_advantage():
    rewards, mask = t([[2.0, 0.0]]), t([[1.0, 1.0]])
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, np.array(["p0"], dtype=object))
    assert adv.numpy().ravel() == pytest.approx([2.0 / (1 + 1e-6)] * 2)  # mean 0, std 1 for a group of one
    assert spec.group_advantages([2.0], 1, kind="dr_grpo")[0] == 0  # R - mean_g = 0
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, np.array(["p0"], dtype=object),
                                               norm_adv_by_std_in_grpo=False)
    assert adv.numpy().ravel() == pytest.approx([2.0, 2.0])


def test_gae_advantages_come_back_whitened_and_returns_do_not():
    rewards, values = [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], [[0.1, 0.2, 0.3], [0.5, 0.4, 0.0]]
    mask = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
    adv, ret = ca.compute_gae_advantage_return(t(rewards), t(values), t(mask), 1.0, 0.95)
    e_adv, e_ret = (x.astype(float) for x in spec.gae(rewards, values, mask, gamma=1.0, lam=0.95))
    on = np.array(mask) > 0
    assert ret.numpy()[on] == pytest.approx(e_ret[on])
    whitened = (e_adv[on] - e_adv[on].mean()) / np.sqrt(e_adv[on].var(ddof=1) + 1e-8)
    assert adv.numpy()[on] == pytest.approx(whitened)
    assert adv.numpy()[on] != pytest.approx(e_adv[on])


def test_verls_critic_clips_values_at_0_5_where_the_reference_clips_at_0_2():
    from verl.workers.config.critic import CriticConfig
    assert CriticConfig.__dataclass_fields__["cliprange_value"].default == 0.5


def test_the_engine_reports_these_conventions():
    target = Target()
    wanted = {("dapo", "DAPO recipe"): "dapo[agg=token_mean, dual_clip=3]",
              ("sapo", "loss_agg_mode=token-mean"): "sapo[agg=seq_mean_token_mean]",
              ("grpo", "loss_agg_mode=seq-mean-token-sum,"): None}
    checks = [c for c in target.checks() if any(c.algorithm == a and c.knob.startswith(k) for a, k in wanted)]
    assert len(checks) == 3
    for check in checks:
        want = next(v for (a, k), v in wanted.items() if check.algorithm == a and check.knob.startswith(k))
        row = run_check(check, seeds=4)[0]
        named = [f["name"] for f in row["findings"] if "batch without tokens" not in f["name"]]
        assert (named == []) if want is None else (want in row["matches"] and named[0].startswith("matches"))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_micro_batch_without_tokens_gives_nan(mode):
    # the reference: a fully masked row contributes nothing and never produces NaN (loss 0)
    loss = ca.agg_loss(t([[0.5, -0.5]]), t([[0.0, 0.0]]), mode)
    assert math.isnan(float(loss))
    assert float(spec.policy_loss("grpo", [[-1.0, -1.0]], [[-1.0, -1.0]], [[1.0, 1.0]], [[0, 0]], beta=0.0,
                                  agg=mode.replace("-", "_"))[0]) == 0.0


def _loss_fn(mode, logp, old, adv, mask, policy_loss=None, agg="token-mean", rollout_is_weights=None, **cfg):
    from verl.workers.config.actor import PolicyLossConfig
    if policy_loss is not None:
        cfg["policy_loss"] = PolicyLossConfig(loss_mode=mode, **policy_loss)
    lp = t(logp).requires_grad_(True)
    kw = {} if rollout_is_weights is None else {"rollout_is_weights": t(rollout_is_weights)}
    loss, _ = ca.get_policy_loss_fn(mode)(t(old), lp, t(adv), t(mask), agg, actor_config(loss_agg_mode=agg, **cfg),
                                          **kw)
    loss.backward()
    return float(loss.detach()), lp.grad.numpy()


def test_cispo_caps_the_weight_at_one_plus_epsilon_as_the_paper():
    # r = e^2 = 7.39 > 5, A = 1: weight 1 + 4 = 5, gradient -5 (MiniMax-M1 Eq. 5)
    loss, grad = _loss_fn("cispo", [[-1.0]], [[-3.0]], [[1.0]], [[1.0]], clip_ratio_low=1.0, clip_ratio_high=4.0)
    exact, exact_grad = spec.policy_loss("cispo", [[-1.0]], [[-3.0]], [[1.0]], [[1.0]])
    assert grad[0, 0] == pytest.approx(-5.0) == pytest.approx(float(exact_grad[0, 0]))
    assert loss == pytest.approx(float(exact)) == pytest.approx(5.0)  # -5 * 1 * (-1)


def test_geo_mean_counts_empty_rows_in_its_mean():
    # row 0: A = 1, log-ratios 0.1 and 0.2 (inside the clip): -exp(0.15); row 1 fully masked
    logp, old = [[-1.0, -1.0], [0.0, 0.0]], [[-1.1, -1.2], [0.0, 0.0]]
    adv, mask = [[1.0, 1.0], [0.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]]
    loss, _ = _loss_fn("geo_mean", logp, old, adv, mask, clip_ratio_low=0.4, clip_ratio_high=0.4)
    exact, _ = spec.policy_loss("gmpo", logp, old, adv, mask)
    assert float(exact) == pytest.approx(-math.exp(0.15))
    assert loss == pytest.approx(-math.exp(0.15) / 2)


def test_clip_cov_zeroes_the_value_of_the_chosen_tokens():
    # on-policy, logp -1..-4, A = 4, -4, -4, 4: covs 6, -2, 2, -6, only token 2 in (1, 5); ratio 1 takes it
    logp, adv = [[-1.0, -2.0, -3.0, -4.0]], [[4.0, -4.0, -4.0, 4.0]]
    loss, grad = _loss_fn("clip_cov", logp, logp, adv, [[1.0] * 4], policy_loss={"clip_cov_ratio": 1.0})
    exact, exact_grad = spec.policy_loss("clip_cov", logp, logp, adv, [[1.0] * 4], clip_cov_ratio=1.0)
    np.testing.assert_allclose(grad, exact_grad.astype(float), atol=1e-12)  # token 2 has no gradient in both
    assert float(exact) == pytest.approx(0.0)  # -(4 - 4 - 4 + 4) / 4: Cui et al. detach, the value stays
    assert loss == pytest.approx(-4.0 / 4)  # verl drops token 2's value: -(4 - 4 + 4) / 4


def test_icepop_keeps_the_importance_weight_inside_its_bounds():
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    # rho = 3 (kept with weight 3), 6 and 0.4 (masked): the same as rollout_correction='mis' with [0.5, 5]
    log_rho = t([[math.log(3.0), math.log(6.0), math.log(0.4)]])
    w, _ = compute_rollout_correction_weights(log_rho, t([[1.0, 1.0, 1.0]]), rollout_is="token",
                                              rollout_is_threshold="0.5_5.0")
    np.testing.assert_allclose(w.numpy(), [[3.0, 0.0, 0.0]], rtol=1e-12)
    old = [[-1.0, -1.0, -1.0]]
    rollout = (np.array(old) - log_rho.numpy()).tolist()
    loss, _ = _loss_fn("vanilla", old, old, [[1.0] * 3], [[1.0] * 3], rollout_is_weights=w.numpy(), clip_ratio_c=1e9)
    exact, _ = spec.policy_loss("grpo", old, old, [[1.0] * 3], [[1.0] * 3], beta=0.0, agg="token_mean",
                                rollout_correction="mis", rollout_logp=rollout)
    assert loss == pytest.approx(float(exact)) == pytest.approx(-1.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_vanilla_clamps_the_log_ratio_at_20(mode):
    # log r = 25, A = -1, dual clip off: PPO's loss is -r * A = e^25 = 7.2e10 with gradient e^25 (unclipped for
    # A < 0, a single token so every mode gives the token's loss); verl clamps log r at 20: e^20, gradient 0
    loss, grad = vanilla([[0.0]], [[-25.0]], [[-1.0]], [[1.0]], mode=mode, clip_ratio_c=1e9)
    exact, exact_grad = spec.policy_loss("grpo", [[0.0]], [[-25.0]], [[-1.0]], [[1.0]], beta=0.0, agg="token_mean")
    assert float(exact) == pytest.approx(math.exp(25)) and float(exact_grad[0, 0]) == pytest.approx(math.exp(25))
    assert loss == pytest.approx(math.exp(20)) and grad[0, 0] == 0.0


@pytest.mark.parametrize("rollout_is", ["token", "sequence"])
def test_icepop_raises_zero_division_when_every_token_is_rejected(rollout_is):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    # one token with rho = 10, outside [0.5, 5]: IcePop's weight is 0 and so is the reference's loss; verl's
    # metrics then divide by the mean weight, 0
    assert float(spec.policy_loss("grpo", [[-1.0]], [[-1.0]], [[1.0]], [[1.0]], beta=0.0, agg="token_mean",
                                  rollout_correction="mis", rollout_logp=[[-1.0 - math.log(10.0)]])[0]) == 0.0
    with pytest.raises(ZeroDivisionError):
        compute_rollout_correction_weights(t([[math.log(10.0)]]), t([[1.0]]), rollout_is=rollout_is,
                                           rollout_is_threshold="0.5_5.0")


def test_the_engine_reports_icepops_raise_with_its_count():
    seeds = 10
    check = next(c for c in Target().checks() if "(IcePop)" in c.knob)
    row = next(r for r in run_check(check, seeds=seeds) if r["family"] == "extreme")
    # the cases on which every unmasked token's rho = exp(old - rollout) is outside [0.5, 5]
    rejected = 0
    for s in range(seeds):
        b = check.batch(s, "extreme")
        rho = np.exp(b.old_logp - b.extra["rollout_logp"])[b.mask > 0]
        rejected += bool(len(rho)) and bool(((rho < 0.5) | (rho > 5.0)).all())
    assert rejected and row["kind"] == "raises"
    (raised,) = [f for f in row["findings"] if "ZeroDivisionError" in f["name"]]
    assert raised["name"].endswith(f" on {rejected} of {seeds} cases") and "rollout_corr_helper.py" in raised["name"]
    assert raised["minimal_input"]["tokens"] == 1


@pytest.mark.parametrize("part", [0, 1])
def test_gae_raises_on_a_one_token_mask(part):
    # one valid token: the reference's advantage is r - V = 1 - 0.5 (returns 1); verl whitens the advantages over the
    # mask first, and a one-token mask raises
    rewards, values, mask = t([[1.0, 0.0]]), t([[0.5, 0.0]]), t([[1.0, 0.0]])
    adv, ret = spec.gae([[1.0, 0.0]], [[0.5, 0.0]], [[1.0, 0.0]], gamma=1.0, lam=0.95)
    assert float((adv, ret)[part][0, 0]) == pytest.approx((0.5, 1.0)[part])
    with pytest.raises(ValueError, match="sum of the mask is one"):
        ca.compute_gae_advantage_return(rewards, values, mask, 1.0, 0.95)


def estimator(name, rewards, groups, dtype=torch.float64, **kw):
    """verl's registered estimator ``name`` on one-token responses: one advantage per response."""
    from verl.trainer.config import AlgoConfig
    fn = ca.get_adv_estimator_fn(name)
    r = torch.tensor(rewards, dtype=dtype)[:, None]
    index = np.array([f"p{g}" for g in groups], dtype=object)
    adv, _ = fn(token_level_rewards=r, response_mask=torch.ones_like(r), index=index, config=AlgoConfig(**kw))
    return adv[:, 0].double().numpy()


def test_rloo_vectorized_zeroes_a_lone_response_that_rloo_keeps():
    # group p0 = (1, 0): R - mean of the other = +-1; lone p1 = 2: no others, baseline 0, advantage R = 2
    assert estimator("rloo", [1.0, 0.0, 2.0], [0, 0, 1]) == pytest.approx([1.0, -1.0, 2.0])
    assert estimator("rloo_vectorized", [1.0, 0.0, 2.0], [0, 0, 1]) == pytest.approx([1.0, -1.0, 0.0])


def test_gpg_scales_by_the_count_of_nonzero_rewards():
    # groups (1, 1) and (0, 1): only the second varies, so GPG's M = 2 of B = 4 and A = 2 * (R - mean) = (-1, 1)
    # there; verl counts the three non-zero rewards: alpha = 4 / 3
    adv = estimator("gpg", [1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1])
    assert adv == pytest.approx([0.0, 0.0, -2 / 3, 2 / 3])


def test_grpo_vectorized_computes_in_float32_whatever_the_dtype():
    # a constant group of 0.3 (no binary float holds it): float64 gives R - mean = 0 exactly; verl's group_mean_std
    # takes the mean and std in float32, a std of about 1e-8 against eps = 1e-6, so the advantage is not 0
    assert estimator("grpo", [0.3] * 3, [0] * 3) == pytest.approx([0.0] * 3, abs=1e-12)
    assert np.abs(estimator("grpo_vectorized", [0.3] * 3, [0] * 3)).max() > 1e-3


def _dppo(name, logp, old, adv, mask, **cfg):
    lp = t(logp).requires_grad_(True)
    loss, _ = ca.get_policy_loss_fn(name)(t(old), lp, t(adv), t(mask), "token-mean",
                                          actor_config(loss_agg_mode="token-mean", **cfg))
    loss.backward()
    return float(loss.detach()), lp.grad.numpy()


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_truncates_the_ratio_in_its_weight_at_clip_ratio_c(name):
    # mu = e^-5 = 0.0067, pi = 4 mu = 0.027: inside both trust regions for A = 1 (pi - mu = 0.02 < 0.15; the binary
    # KL 0.027 < 0.05); DPPO's gradient is -r A = -4. verl weighs with min(r, clip_ratio_c), 3 by default
    logp, old = [[-5.0 + math.log(4.0)]], [[-5.0]]
    delta = {"dppo_tv": 0.15, "dppo_kl": 0.05}[name]
    exact, exact_grad = spec.policy_loss(name, logp, old, [[1.0]], [[1.0]])
    assert float(exact_grad[0, 0]) == pytest.approx(-4.0)
    loss, grad = _dppo(name, logp, old, [[1.0]], [[1.0]], clip_ratio_low=delta, clip_ratio_high=delta)
    assert grad[0, 0] == pytest.approx(-3.0) and loss == pytest.approx(-3.0 * logp[0][0])
    loss, grad = _dppo(name, logp, old, [[1.0]], [[1.0]], clip_ratio_low=delta, clip_ratio_high=delta,
                       clip_ratio_c=1e9)
    assert grad[0, 0] == pytest.approx(-4.0) and loss == pytest.approx(float(exact))


def _rejected(rollout_rs, threshold, log_rho, mask):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask
    kept, _ = compute_rollout_rejection_mask(t(log_rho), t(mask), rollout_rs=rollout_rs,
                                             rollout_rs_threshold=threshold)
    return kept.numpy()


def test_rollout_rs_k1_bands_bound_the_inverse_weight_and_leave_rows_out_of_the_mask():
    # rows with prod rho = 3 and 1: seq_rs [0.5, 5] keeps both; verl's seq_sum_k1 '0.5_5.0' bounds
    # -log prod rho = log(pi_rollout / pi_old), so it keeps 1/rho in [0.5, 5], rho in [0.2, 2], and drops the first
    mask = [[1.0, 1.0], [1.0, 1.0]]
    log_rho = [[math.log(3.0), 0.0], [0.0, 0.0]]
    np.testing.assert_array_equal(_rejected("seq_sum_k1", "0.5_5.0", log_rho, mask), [[0, 0], [1, 1]])
    old = [[-1.0, -1.0], [-1.0, -1.0]]
    rollout = (np.array(old) - np.array(log_rho)).tolist()
    adv = [[1.0, 1.0], [-1.0, -1.0]]
    kw = {"beta": 0.0, "agg": "token_mean", "rollout_correction": "seq_rs", "rollout_logp": rollout}
    assert float(spec.policy_loss("grpo", old, old, adv, mask, mis_low=0.5, mis_high=5.0, **kw)[0]) == 0.0
    assert float(spec.policy_loss("grpo", old, old, adv, mask, mis_low=0.2, mis_high=2.0, **kw)[0]) == 0.5
    # the trainer then averages over the kept tokens only: 1 (row 2's -r A) where the reference's weight 0 keeps
    # row 1's two tokens in the token mean, 2 / 4 = 0.5
    loss, _ = _loss_fn("vanilla", old, old, adv, _rejected("seq_sum_k1", "0.5_5.0", log_rho, mask), clip_ratio_c=1e9)
    assert loss == pytest.approx(1.0)
    # the geometric mode keeps a row whose mean log rho lies in [log 0.8, log 1.25]: geo_rs's band, 1.25 = 1 / 0.8
    log_rho = [[math.log(1.2), math.log(1.2)], [math.log(1.5), math.log(1.5)]]
    np.testing.assert_array_equal(_rejected("seq_mean_k1", "0.8_1.25", log_rho, mask), [[1, 1], [0, 0]])


def test_rollout_rs_gives_nan_when_every_row_is_rejected_and_raises_on_a_batch_without_tokens():
    # a row of rho = 3 outside [0.5, 2]: the reference's loss is 0, verl's token mean over no kept token 0 / 0
    kept = _rejected("seq_sum_k1", "0.5_2.0", [[math.log(3.0)]], [[1.0]])
    assert math.isnan(_loss_fn("vanilla", [[-1.0]], [[-1.0]], [[1.0]], kept.tolist(), clip_ratio_c=1e9)[0])
    assert float(spec.policy_loss("grpo", [[-1.0]], [[-1.0]], [[1.0]], [[1.0]], beta=0.0, agg="token_mean",
                                  rollout_correction="seq_rs", mis_low=0.5, mis_high=2.0,
                                  rollout_logp=[[-1.0 - math.log(3.0)]])[0]) == 0.0
    with pytest.raises(ValueError, match="at least one valid token"):
        _rejected("seq_sum_k1", "0.5_2.0", [[0.0, 0.0]], [[0.0, 0.0]])


def test_gdpo_whitens_the_weighted_sum_over_the_batchs_tokens():
    from verl.trainer.config import AlgoConfig
    # two prompts of two responses, lengths 1, 3, 2, 2; rewards (1, 0), (0, 1), (1, 1), (0, 0), weights 1 and 0.5:
    # the weighted sums of the group advantages are +-(0.7071 - 0.3536) and +-(0.7071 + 0.3536); the reference
    # standardises the 4 responses' sums, verl the 8 tokens' (a long response counts thrice)
    mask = np.array([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]], dtype=float)
    rewards = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    config = AlgoConfig(gdpo_reward_keys=["a", "b"], gdpo_reward_weights=[1.0, 0.5])
    prompts = torch.zeros((4, 2), dtype=torch.long)
    adv, _ = ca.compute_gdpo_outcome_advantage(
        t(np.zeros((4, 3))), t(mask), np.array(["p0", "p0", "p1", "p1"], dtype=object), config=config,
        batch={"prompts": prompts, "attention_mask": torch.cat([torch.ones_like(prompts),
                                                                torch.as_tensor(mask, dtype=torch.long)], 1)},
        non_tensor_batch={"a": rewards[:, 0], "b": rewards[:, 1]})
    h = math.sqrt(0.5)
    sums = np.array([h - h / 2, -h + h / 2, h + h / 2, -h - h / 2])
    want = gpu.gdpo_advantages(t(rewards), 2, weights=[1.0, 0.5]).numpy()
    np.testing.assert_allclose(want, sums / sums.std(ddof=1), rtol=1e-5)
    tokens = np.repeat(sums, mask.sum(1).astype(int))
    got = adv.numpy()[mask > 0]
    np.testing.assert_allclose(got, (tokens - tokens.mean()) / tokens.std(ddof=1), rtol=1e-5)
    assert np.abs(got - np.repeat(want, mask.sum(1).astype(int))).max() > 0.1
