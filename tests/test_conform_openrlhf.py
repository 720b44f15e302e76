"""Each difference the conformance report finds in OpenRLHF, reproduced by calling its losses through the worker
(its own virtualenv), the agreements worked by hand, and the trainer-step handler. Values in the comments are worked
by hand from the formulas."""
import math

import numpy as np
import pytest
import torch
from conftest import target_worker

import gpu
import spec
from harness.conform.engine import run_check
from harness.conform.targets import load_target
from harness.conform.targets.remote import TargetError

E = math.e


@pytest.fixture(scope="module")
def worker():
    w = target_worker("openrlhf")
    yield w
    w.close()


def policy(worker, logp, old, adv, mask, rollout=None, **module):
    extra = {} if rollout is None else {"rollout_logp": rollout}
    out = worker.call("policy", module, logp=logp, old_logp=old, adv=adv, mask=mask, **extra)
    return out["loss"], np.asarray(out["grad"])


# ---- the differences -----------------------------------------------------------------------------------------------
def test_clip_higher_averages_over_all_tokens_of_the_batch_not_per_group(worker):
    # two groups of one response: 1 token with A = 1 and 3 tokens with A = 0, on-policy (r = 1)
    logp = [[-1.0, 0, 0], [-1.0, -1.0, -1.0]]
    adv, mask = [[1.0, 0, 0], [0.0, 0.0, 0.0]], [[1.0, 0, 0], [1.0, 1.0, 1.0]]
    loss, grad = policy(worker, logp, logp, adv, mask, clip_eps_high=0.28)
    assert loss == pytest.approx(-0.25)  # -1 / 4 tokens
    assert grad[0, 0] == pytest.approx(-0.25)
    eq8, _ = spec.policy_loss("dapo", logp, logp, adv, mask, group_size=1)
    assert float(eq8) == pytest.approx(-0.5)  # mean over groups of (-1/1, 0/3)


def test_the_default_clip_band_raises_rollout_weights_below_one_half(worker):
    # on-policy (r = 1), A = 1, rho = pi_old / pi_rollout = e^-2 = 0.135: OpenRLHF weighs the token by
    # clamp(rho, 0.5, 5) = 0.5; truncated IS (min(rho, 5)) keeps rho
    args = ([[-1.0]], [[-1.0]], [[1.0]], [[1.0]], [[1.0]])
    loss, grad = policy(worker, *args, is_correction_level="token", is_correction_mode="clip")
    assert loss == pytest.approx(-0.5) and grad[0, 0] == pytest.approx(-0.5)
    tis, _ = spec.policy_loss("ppo", *args[:4], rollout_logp=args[4], rollout_correction="tis", tis_cap=5.0)
    assert float(tis) == pytest.approx(-math.exp(-2))
    lower_at_0, _ = policy(worker, *args, is_correction_level="token", is_correction_mode="clip",
                           is_correction_threshold=[0.0, 5.0])
    assert lower_at_0 == pytest.approx(-math.exp(-2))


def test_sequence_mask_gates_the_geometric_mean_and_keeps_each_tokens_weight(worker):
    # on-policy, A = 1 on two tokens. log rho = (1, -1): geometric mean 1 (kept), each token weighted by its own
    # rho: -(e + 1/e) / 2; the reference's sequence MIS weighs both by the product rho = 1: -1
    logp, adv, mask = [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]]
    kw = {"is_correction_level": "seq", "is_correction_mode": "mask"}
    loss, _ = policy(worker, logp, logp, adv, mask, [[-1.0, 1.0]], **kw)
    assert loss == pytest.approx(-math.cosh(1.0))
    seq_mis, _ = spec.policy_loss("ppo", logp, logp, adv, mask, rollout_logp=[[-1.0, 1.0]],
                                  rollout_correction="seq_mis")
    assert float(seq_mis) == pytest.approx(-1.0)
    # log rho = (1, 1): geometric mean e is inside [0.5, 5], the product e^2 = 7.39 is not
    loss, _ = policy(worker, logp, logp, adv, mask, [[-1.0, -1.0]], **kw)
    assert loss == pytest.approx(-E)
    seq_mis, _ = spec.policy_loss("ppo", logp, logp, adv, mask, rollout_logp=[[-1.0, -1.0]],
                                  rollout_correction="seq_mis")
    assert float(seq_mis) == 0.0


@pytest.mark.parametrize("token_level", [True, False])
def test_a_batch_without_tokens_gives_nan_with_the_trainers_counts(worker, token_level):
    # batch_num_tokens (or global_batch_size) = 0 and the masked sum = 0: 0 / 0; the reference gives 0
    out = worker.call("policy", {"token_level_loss": token_level}, logp=[[-1.0]], old_logp=[[-1.0]], adv=[[1.0]],
                      mask=[[0.0]])
    assert math.isnan(out["loss"])
    assert float(spec.policy_loss("ppo", [[-1.0]], [[-1.0]], [[1.0]], [[0.0]])[0]) == 0.0


@pytest.mark.parametrize("module", [{}, {"token_level_loss": False},
                                    {"is_correction_level": "token", "is_correction_mode": "clip",
                                     "is_correction_threshold": [0.0, 2.0]},
                                    {"is_correction_level": "token", "is_correction_mode": "mask"}],
                         ids=["ppo", "grpo", "tis", "mis"])
def test_the_ppo_loss_clamps_the_log_ratio_at_20(worker, module):
    # log r = 25, A = -1, one token, rho = 1 (rollout = old): PPO's loss is -r * A = e^25 = 7.2e10 with gradient e^25
    # (unclipped for A < 0, and the weight rho = 1 in TIS and MIS); OpenRLHF clamps log r at 20: e^20, gradient 0
    loss, grad = policy(worker, [[0.0]], [[-25.0]], [[-1.0]], [[1.0]], [[-25.0]], **module)
    exact, exact_grad = spec.policy_loss("ppo", [[0.0]], [[-25.0]], [[-1.0]], [[1.0]])
    assert float(exact) == pytest.approx(math.exp(25)) and float(exact_grad[0, 0]) == pytest.approx(math.exp(25))
    assert loss == pytest.approx(math.exp(20)) and grad[0, 0] == 0.0


def test_gspo_with_per_token_advantages_differentiates_the_sequence_ratio(worker):
    # on-policy (s = 1), one row, A = (1, -1): GSPO-token (Eq. 13) gives each token the gradient -s * A_t / 2 =
    # (-0.5, 0.5); OpenRLHF multiplies the sequence ratio s = exp(mean log r) by each A_t, so the gradient is
    # -(A_1 + A_2) / 2 * ds / dlogp_t = 0 (the values agree: 0)
    logp, adv, mask = [[-1.0, -2.0]], [[1.0, -1.0]], [[1.0, 1.0]]
    loss, grad = policy(worker, logp, logp, adv, mask, policy_loss_type="gspo", clip_eps_low=3e-4,
                        clip_eps_high=4e-4)
    exact, exact_grad = spec.policy_loss("gspo_token", logp, logp, adv, mask)
    assert float(exact) == pytest.approx(0.0) and np.ravel(exact_grad.astype(float)) == pytest.approx([-0.5, 0.5])
    assert loss == pytest.approx(0.0) and np.ravel(grad) == pytest.approx([0.0, 0.0])


# ---- agreements, by hand -------------------------------------------------------------------------------------------
def test_dual_clip_caps_the_loss_of_negative_advantages(worker):
    # r = e^2, A = -3: PPO's loss is -r*A = 3e^2; the dual clip caps it at -3*A = 9 and its gradient vanishes
    args = ([[-2.0]], [[-4.0]], [[-3.0]], [[1.0]])
    loss, grad = policy(worker, *args)
    assert loss == pytest.approx(3 * E ** 2) and grad[0, 0] == pytest.approx(3 * E ** 2)
    loss, grad = policy(worker, *args, dual_clip=3.0)
    assert loss == pytest.approx(9.0) and grad[0, 0] == 0.0


def test_sample_level_is_the_mean_over_non_empty_sequences(worker):
    # on-policy: token loss -A; sequence means -2 and -5, the empty row is not counted: -3.5
    logp = [[-1.0, -1.0], [-1.0, 0.0], [0.0, 0.0]]
    adv, mask = [[1.0, 3.0], [5.0, 0.0], [7.0, 7.0]], [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]
    loss, grad = policy(worker, logp, logp, adv, mask, token_level_loss=False)
    assert loss == pytest.approx(-3.5)
    np.testing.assert_allclose(grad, [[-0.25, -0.75], [-2.5, 0.0], [0.0, 0.0]])


def test_gspo_clips_the_sequence_ratio(worker):
    # log-ratios 0.1 and 0.3: s = e^0.2 > 1 + 4e-4. A = 1: clipped, loss -(1 + 4e-4), no gradient;
    # A = -1: the unclipped -s*A wins, loss s, d s / d logp_t = s / 2
    logp, old, mask = [[-1.0, -1.0]], [[-1.1, -1.3]], [[1.0, 1.0]]
    kw = {"policy_loss_type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}
    loss, grad = policy(worker, logp, old, [[1.0, 1.0]], mask, **kw)
    assert loss == pytest.approx(-(1 + 4e-4)) and np.all(grad == 0.0)
    loss, grad = policy(worker, logp, old, [[-1.0, -1.0]], mask, **kw)
    assert loss == pytest.approx(math.exp(0.2))
    np.testing.assert_allclose(grad, [[math.exp(0.2) / 2] * 2])


PAIR = {"logp": [[-1.0, -2.0], [-3.0, -1.0]], "ref_logp": [[-2.0, -2.0], [-2.0, -2.0]], "mask": [[1.0, 1.0]] * 2}
# chosen -3 vs reference -4, rejected -4 vs -4: margin h = 1


@pytest.mark.parametrize("kw, loss, dh", [
    ({"beta": 0.1}, math.log1p(math.exp(-0.1)), -0.1 / (1 + math.exp(0.1))),
    ({"beta": 0.1, "label_smoothing": 0.1}, 0.9 * math.log1p(math.exp(-0.1)) + 0.1 * math.log1p(math.exp(0.1)),
     -0.09 / (1 + math.exp(0.1)) + 0.01 / (1 + math.exp(-0.1))),
    ({"beta": 0.1, "ipo": True}, 16.0, -8.0),  # (h - 1 / (2 * 0.1))^2, derivative 2 (h - 5)
])
def test_dpo_cdpo_and_ipo_in_closed_form(worker, kw, loss, dh):
    out = worker.call("dpo", kw, **PAIR)
    assert out["loss"] == pytest.approx(loss)
    np.testing.assert_allclose(out["grad"], [[dh, dh], [-dh, -dh]])  # d h / d chosen tokens = 1, rejected -1


# ---- the trainer step ----------------------------------------------------------------------------------------------
def test_step_splits_ranks_and_micro_batches_as_the_trainer(worker):
    # on-policy, A = 1, 3 tokens. dp 1, micro 1: gas 2, batch_num_tokens 3/2: micro losses -2/1.5 and -1/1.5,
    # each scaled by 1/gas. dp 2, micro 1: gas 1, batch_num_tokens 3, times dp_size 2: -4/3 and -2/3, then the
    # mean over ranks. Both give the token mean -1 and the gradient -1/3 per token.
    arrays = {"logp": [[-1.0, -1.0], [-1.0, 0.0]], "old_logp": [[-1.0, -1.0], [-1.0, 0.0]],
              "adv": [[1.0, 1.0], [1.0, 0.0]], "mask": [[1.0, 1.0], [1.0, 0.0]]}
    for dp, micro_losses in ((1, [[-4 / 3, -2 / 3]]), (2, [[-4 / 3], [-2 / 3]])):
        out = worker.call("policy_step", {"micro_batch_size": 1, "dp_size": dp}, **arrays)
        np.testing.assert_allclose(out["micro_losses"], micro_losses)
        assert out["loss"] == pytest.approx(-1.0)
        np.testing.assert_allclose(out["grad"], [[-1 / 3, -1 / 3], [-1 / 3, 0.0]])


@pytest.mark.parametrize("token_level, agg", [(True, "token_mean"), (False, "seq_mean_token_mean")])
def test_step_gradient_is_the_whole_batch_mean_for_any_split(worker, token_level, agg):
    rng = np.random.default_rng(7)
    mask = (rng.random((8, 5)) < 0.6).astype(float)
    logp, adv = rng.normal(-1.0, 0.3, (8, 5)), rng.normal(0.0, 1.0, (8, 5))
    old = logp + rng.normal(0.0, 0.2, (8, 5))
    lp = torch.tensor(logp, requires_grad=True)
    gpu.policy_loss("ppo", lp, torch.tensor(old), torch.tensor(adv), torch.tensor(mask), agg=agg)[0].backward()
    for dp, micro in ((1, 8), (2, 2), (4, 1), (1, 2)):
        out = worker.call("policy_step", {"module": {"token_level_loss": token_level}, "micro_batch_size": micro,
                                          "dp_size": dp}, logp=logp, old_logp=old, adv=adv, mask=mask)
        np.testing.assert_allclose(out["grad"], lp.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_step_refuses_a_batch_that_does_not_split(worker):
    one = [[0.0]] * 3
    with pytest.raises(TargetError, match="openrlhf: ValueError: micro_batch_size: 3 rows do not split"):
        worker.call("policy_step", {"micro_batch_size": 2, "dp_size": 1}, logp=one, old_logp=one, adv=one, mask=one)
    with pytest.raises(TargetError, match="dp_size: expected a positive integer, got 0"):
        worker.call("policy_step", {"micro_batch_size": 1, "dp_size": 0}, logp=one, old_logp=one, adv=one, mask=one)


# ---- the target ----------------------------------------------------------------------------------------------------
def test_engine_finds_the_token_mean_of_clip_higher(worker):
    from harness.conform.targets.openrlhf import Target
    check = next(c for c in Target(worker).checks() if c.algorithm == "dapo")
    rows = run_check(check, seeds=3)
    # on every family; the extreme one with the log-ratio clamp on top (a finding of its own)
    assert all(r["kind"] == "differs" and r["matches"][0].startswith("dapo[agg=token_mean]") for r in rows)


def test_missing_environment_names_its_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv("CLIPLAB_TARGET_ENVS", str(tmp_path))
    with pytest.raises(ValueError, match="`make target-openrlhf`"):
        load_target("openrlhf")


def kl(worker, logp, ref_logp, old_logp=None, **kw):
    out = worker.call("kl", {"dtype": "float64", **kw}, logp=logp, ref_logp=ref_logp, mask=np.ones(np.shape(logp)),
                      **({} if old_logp is None else {"old_logp": old_logp}))
    return np.asarray(out["value"]), np.asarray(out["grad"])


def test_every_kl_estimator_is_clamped_to_10(worker):
    # logp - ref = 30 nats: k1 = 30 and k2 = 450 (spec); OpenRLHF clamps both values at 10, and the gradient to 0
    for name, want in (("k1", 30.0), ("k2", 450.0)):
        value, grad = kl(worker, [[0.0]], [[-30.0]], kl_estimator=name)
        assert float(spec.kl([0.0], [-30.0], name)[0]) == pytest.approx(want)
        assert value[0, 0] == 10.0 and grad[0, 0] == 0.0


def test_unbiased_gradient_weighs_k2s_gradient_by_the_capped_ratio(worker):
    # logp - ref = 0.5, logp - old = 3: k1's value 0.5; gradient w * (logp - ref) with w = min(e^3, 10) = 10
    value, grad = kl(worker, [[0.0]], [[-0.5]], [[-3.0]], kl_estimator="k1", unbiased_gradient=True)
    assert value[0, 0] == pytest.approx(0.5) and grad[0, 0] == pytest.approx(10 * 0.5)


def advantages(worker, estimator, rewards, mask, group_size):
    out = worker.call("advantage", {"estimator": estimator, "group_size": group_size, "dtype": "float64"},
                      rewards=rewards, mask=mask)
    return np.asarray(out["advantages"], dtype=float) * np.asarray(mask)


def test_reinforce_whitens_by_the_biased_variance(worker):
    # two one-token responses with rewards 1 and 0: returns (1, 0), mean 0.5; OpenRLHF divides by the square root of
    # the biased variance 0.25, giving (1, -1); REINFORCE++'s whitening by the unbiased std (0.707) gives +-0.707
    got = advantages(worker, "reinforce", [1.0, 0.0], [[1.0], [1.0]], 1)
    want = gpu.reinforce_pp_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.ones(2, 1,
                                                                                                 dtype=torch.float64))
    assert got[:, 0] == pytest.approx([1.0, -1.0])
    assert want[:, 0].numpy() == pytest.approx([2 ** -0.5, -2 ** -0.5], rel=1e-6)


def test_rloo_with_one_response_per_prompt_divides_by_zero(worker):
    # n_samples_per_prompt = 1: the leave-one-out baseline (sum - R) / (n - 1) is 0 / 0; RLOO's baseline of a lone
    # response is taken as 0 by the reference (advantage R)
    got = advantages(worker, "rloo", [1.0, 0.5], [[1.0], [1.0]], 1)
    assert np.isnan(got).all()


# ---- the installed API ---------------------------------------------------------------------------------------------

#: PolicyLoss's keyword parameters in openrlhf 0.11.0 (models/loss.py of its wheel).
POLICY_LOSS_0_11_0 = ["clip_eps_low", "clip_eps_high", "dual_clip", "token_level_loss", "policy_loss_type",
                      "enable_vllm_is_correction", "vllm_is_truncated_threshold", "vllm_is_correction_type"]


class EarlierWorker:
    """A worker whose openrlhf is 0.11.0, as far as the target's start-up asks."""

    def versions(self):
        return {"openrlhf": "0.11.0", "torch": torch.__version__}

    def call(self, op, kw=None, **arrays):
        assert op == "signature"
        return {"PolicyLoss": POLICY_LOSS_0_11_0}

    def close(self):
        pass


def test_an_openrlhf_with_the_earlier_importance_sampling_keywords_is_named_in_one_line():
    from harness.conform.targets.openrlhf import Target
    with pytest.raises(ValueError) as info:
        Target(worker=EarlierWorker())
    message = str(info.value)
    assert "\n" not in message and "openrlhf 0.11.0" in message
    assert "enable_vllm_is_correction -> is_correction_level" in message
    assert "vllm_is_truncated_threshold -> is_correction_threshold" in message


def test_every_policy_loss_keyword_the_target_passes_is_one_it_checks(worker):
    import re

    from harness.conform.targets.openrlhf import POLICY_KEYWORDS, Target
    passed = {k for c in Target(worker=worker).checks() if c.call.startswith("PolicyLoss(")
              for k in re.findall(r"(\w+)=", c.call)}
    assert passed <= set(POLICY_KEYWORDS) <= set(worker.call("signature")["PolicyLoss"])
