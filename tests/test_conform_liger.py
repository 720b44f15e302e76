"""Each difference the conformance report finds in Liger-Kernel's LigerFusedLinearGRPOLoss, reproduced through the
worker (its own virtualenv) against values computed by hand or by the exact reference (spec). The output layer is
the identity on two tokens with hidden states 0: every token's log-prob is -log 2 and d logp / d h = (1/2, -1/2),
so the gradient w.r.t. a token's log-prob is twice that w.r.t. its first hidden unit."""
from functools import partial

import numpy as np
import pytest
import trl_kernels
from conftest import exact_policy, target_worker


LOGP = -np.log(2.0)


@pytest.fixture(scope="module")
def worker():
    w = target_worker("liger")
    yield w
    w.close()


def call(worker, kw, log_ratio, adv, mask, ref_offset=None):
    """Liger's loss and d loss / d logp on log-probs LOGP, old = LOGP - log_ratio, ref = LOGP + ref_offset."""
    mask = np.array(mask, float)
    logp = np.full(mask.shape, LOGP)
    ref = logp + (0.0 if ref_offset is None else np.array(ref_offset, float))
    out = worker.call("loss", kw, hidden=np.zeros(mask.shape + (2,)),
                      weight=np.eye(2), ids=np.zeros(mask.shape, int), mask=mask, adv=np.array(adv, float),
                      old_logp=logp - np.array(log_ratio, float), ref_logp=ref)
    grad_h = np.array(out["grad_hidden"])
    assert grad_h[..., 1] == pytest.approx(-grad_h[..., 0], abs=1e-6, nan_ok=True)  # along d logp / d h only
    return out["loss"], 2.0 * grad_h[..., 0]


def exact(name, log_ratio, adv, mask, ref_offset=None, **hp):
    return exact_policy(name, LOGP, log_ratio, adv, mask, ref_offset, **hp)


@pytest.mark.parametrize("kw, name, hp", trl_kernels.SEQUENCE_MEAN_CASES)
def test_sequence_means_count_empty_completions(worker, kw, name, hp):
    trl_kernels.sequence_means_count_empty_completions(partial(call, worker), exact, kw, name, hp, rel=1e-6)


def test_dapo_divides_by_the_batch_tokens_not_per_group(worker):
    trl_kernels.dapo_divides_by_the_batch_tokens_not_per_group(partial(call, worker), exact)


def test_sequence_level_with_the_dapo_loss_weights_sequences_by_length(worker):
    trl_kernels.sequence_level_with_the_dapo_loss_weights_sequences_by_length(partial(call, worker), exact, rel=1e-6)


def test_the_defaults_are_dapo_without_clip_higher_and_with_a_kl_penalty(worker):
    # log r = 0.22 (1.2 < r = 1.25 < 1.28), A = 1, ref = logp + 0.2: Liger's defaults clip at 1.2 (no gradient) and add
    # 0.04 * k3 = 0.04 * (e^0.2 - 1.2), whose gradient is 0.04 * (1 - e^0.2); DAPO's clip-higher 0.28 would not
    # clip, and its beta is 0
    loss, grad = call(worker, {}, [[0.22]], [1.0], [[1]], [[0.2]])
    assert loss == pytest.approx(-1.2 + 0.04 * (np.exp(0.2) - 1.2), rel=1e-6)
    assert grad[0, 0] == pytest.approx(0.04 * (1 - np.exp(0.2)), rel=1e-5)
    assert exact("dapo", [[0.22]], [1.0], [[1]])[1][0, 0] == pytest.approx(-np.exp(0.22))


def test_cispo_caps_the_weight_at_epsilon_high_itself(worker):
    # r = e^2 = 7.39, A = 1: Liger's weight is min(r, 4) = 4 (loss -4 * A * logp = 4 log 2); MiniMax-M1 Eq. 5 caps
    # it at 1 + 4 = 5
    loss, grad = call(worker, {"loss_type": "cispo", "epsilon_high": 4.0, "beta": 0.0}, [[2.0]], [1.0], [[1]])
    assert loss == pytest.approx(4 * np.log(2.0), rel=1e-6) and grad[0, 0] == pytest.approx(-4.0, rel=1e-6)
    assert exact("cispo", [[2.0]], [1.0], [[1]])[1][0, 0] == pytest.approx(-5.0)


def test_the_bias_corrected_kl_gradient_is_lost_in_float32_far_from_the_reference(worker):
    # log r = 2, A = -1, ref = logp + 25: the policy term's gradient is r, the KL term's 0.04 * r * (k3 + 1 - e^25)
    # = -0.04 * 25 * r, so the exact gradient is 0; Liger's float32 forms r * e^25 = 5e11 twice and subtracts
    loss, grad = call(worker, {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": True},
                      [[2.0]], [-1.0], [[1]], [[25.0]])
    want, want_grad = exact("grpo", [[2.0]], [-1.0], [[1]], [[25.0]], beta=0.04, kl="k3_unbiased")
    assert want_grad[0, 0] == pytest.approx(0.0, abs=1e-3)
    assert loss == pytest.approx(want, rel=1e-6)
    assert abs(grad[0, 0]) > 100.0


def test_the_log_prob_gradient_is_read_back_from_the_layer_gradients():
    # gradients of sum(g * logp(h, W)) by autograd through log_softmax(h W^T): the target reads g back from them,
    # and refuses a weight gradient that g does not imply
    import torch

    from harness.conform.targets.liger import layer, logp_grad, output_weight, with_layer
    from harness.conform.targets.remote import TargetError
    from harness.conform.targets.unsloth import seq_batch
    b = with_layer(seq_batch(3, "typical"), 3)
    hidden, ids = b.extra["hidden"], b.extra["ids"]
    g = np.random.default_rng(0).normal(size=ids.shape)
    h = torch.tensor(hidden, requires_grad=True)
    w = torch.tensor(output_weight(), requires_grad=True)
    logp = torch.log_softmax(h @ w.T, -1).gather(-1, torch.as_tensor(ids)[..., None])[..., 0]
    (torch.tensor(g) * logp).sum().backward()
    out = {"grad_hidden": h.grad.numpy(), "grad_weight": w.grad.numpy()}
    _, jac, probs = layer(hidden, ids)
    assert logp_grad("liger", out, hidden, ids, jac, probs, 1e-9) == pytest.approx(g, rel=1e-9, abs=1e-12)
    out["grad_weight"] = out["grad_weight"] * 1.01
    with pytest.raises(TargetError, match="gradient w.r.t. the weight"):
        logp_grad("liger", out, hidden, ids, jac, probs, 1e-4)


def test_the_worker_runs_the_locked_version(worker):
    from harness.conform.targets.remote import ROOT
    lock = (ROOT / "harness/conform/targets/envs/liger.lock").read_text()
    pin = next(line.split("==")[1] for line in lock.splitlines() if line.startswith("liger_kernel=="))
    assert worker.versions()["liger"] == f"kernel {pin}"


def test_past_log_ratio_88_the_float32_ratio_overflows_to_nan(worker):
    # log r = 100, A = 1: the reference's ratio e^100 = 2.7e43 is clipped at 1.2 (loss -1.2, gradient 0); Liger's
    # float32 exp(100) is inf and its gradient NaN (inf * 0 in the clipped branch's backward)
    loss, grad = call(worker, {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.0}, [[100.0]], [1.0], [[1]])
    want, want_grad = exact("dapo", [[100.0]], [1.0], [[1]])
    assert want == pytest.approx(-1.28) and want_grad[0, 0] == 0.0
    assert loss == pytest.approx(-1.28, rel=1e-6) and np.isnan(grad[0, 0])


def test_at_an_exact_tie_the_float32_ratio_can_take_the_clipped_branch(worker):
    # the report's minimal input: hidden states h and token 25 through the target's output layer give logp, and old
    # is chosen so that exp(logp - old) = 0.8 = 1 - eps exactly in float64; A = -1. PPO's two terms are equal and the
    # reference's unclipped one wins the tie (float64, as the engine compares): gradient -A * r = 0.8. Liger's
    # float32 ratio lands on the clipped side: value 0.8 (to 1e-8), gradient 0
    import torch

    import gpu
    from harness.conform.targets.liger import layer, logp_grad, output_weight
    hidden = np.array([[[0.29612982386997405, -0.2913297499906789, 0.15602785950782458, -0.07074038835048281,
                         -0.33652713223238767, 0.06668989756909714, 0.16278015252874256, -0.20718452416416674]]])
    ids, old = np.array([[25]]), np.array([[-4.251176897924993]])
    logp, jac, probs = layer(hidden, ids)
    assert logp[0, 0] == pytest.approx(-4.474320449239203, abs=1e-12)
    assert torch.exp(torch.tensor(logp - old)).item() == 0.8
    leaf = torch.tensor(logp, requires_grad=True)
    want, _ = gpu.policy_loss("dapo", leaf, torch.tensor(old), -torch.ones(1, 1, dtype=torch.float64),
                              torch.ones(1, 1, dtype=torch.float64), agg="token_mean")
    want.backward()
    assert float(leaf.grad[0, 0]) == pytest.approx(0.8)
    out = worker.call("loss", {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.0}, hidden=hidden,
                      weight=output_weight(), ids=ids, mask=[[1.0]], adv=[-1.0], old_logp=old, ref_logp=logp)
    assert out["loss"] == pytest.approx(float(want.detach()), abs=1e-7)
    assert logp_grad("liger", out, hidden, ids, jac, probs, 1e-4)[0, 0] == 0.0
