"""Each difference the conformance report finds in Unsloth's grpo_compute_loss, reproduced through the worker (its
own virtualenv) on the minimal input, against values computed by hand or by the exact reference (spec)."""
import numpy as np
import pytest
from conftest import exact_policy, target_worker


LOGP = -1.0  # the policy's log-prob of every token (CISPO's loss reads it)


@pytest.fixture(scope="module")
def worker():
    w = target_worker("unsloth")
    yield w
    w.close()


def call(worker, kw, log_ratio, adv, mask, ref_offset=None):
    """Unsloth's loss and gradient on log-probs LOGP, old = LOGP - log_ratio, ref = LOGP + ref_offset."""
    mask = np.array(mask, float)
    logp = np.full(mask.shape, LOGP)
    ref = logp + (0.0 if ref_offset is None else np.array(ref_offset, float))
    out = worker.call("loss", kw, logp=logp, old_logp=logp - np.array(log_ratio, float), ref_logp=ref,
                      adv=np.array(adv, float), mask=mask)
    return out["loss"], np.array(out["grad"])


def exact(name, log_ratio, adv, mask, ref_offset=None, **hp):
    return exact_policy(name, LOGP, log_ratio, adv, mask, ref_offset, **hp)


@pytest.mark.parametrize("kw, name, hp", [
    ({"loss_type": "grpo"}, "grpo", {"beta": 0.0}),
    ({"loss_type": "sapo"}, "sapo", {}),
    ({"loss_type": "dr_grpo", "max_completion_length": 8}, "dr_grpo", {"max_len": 8}),
    ({"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon_low": 3e-4, "epsilon_high": 4e-4},
     "gspo", {}),
])
def test_sequence_means_count_empty_completions(worker, kw, name, hp):
    # two completions, the second fully masked: the reference averages over the one non-empty completion,
    # Unsloth divides by both
    case = ([[0.1, -0.1], [0.0, 0.0]], [1.0, 1.0], [[1, 1], [0, 0]])
    loss, grad = call(worker, {**kw, "beta": 0.0}, *case)
    want, want_grad = exact(name, *case, **hp)
    assert abs(want) > 0.1
    assert loss == pytest.approx(want / 2, rel=1e-9)
    assert grad == pytest.approx(want_grad / 2, rel=1e-9, abs=1e-12)


def test_dapo_divides_by_the_batch_tokens_not_per_group(worker):
    # groups of one: 1 token with A = 1, 3 tokens with A = 0, on-policy
    case = ([[0.0, 0, 0], [0.0, 0.0, 0.0]], [1.0, 0.0], [[1, 0, 0], [1, 1, 1]])
    loss, _ = call(worker, {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.0}, *case)
    assert exact("dapo", *case)[0] == pytest.approx(-0.5)  # DAPO Eq. 8: the mean of the groups' token means
    assert loss == pytest.approx(-0.25) == pytest.approx(exact("dapo", *case, agg="token_mean")[0])


def test_cispo_caps_the_weight_at_epsilon_high_itself(worker):
    # r = e^2 = 7.39, A = 1: Unsloth's weight is min(r, 4) = 4 (loss -4 * A * logp = 4); MiniMax-M1 Eq. 5 caps it
    # at 1 + 4 = 5
    loss, grad = call(worker, {"loss_type": "cispo", "epsilon_high": 4.0, "beta": 0.0,
                               "num_items_in_batch": 1.0}, [[2.0]], [1.0], [[1]])
    assert loss == pytest.approx(4.0) and grad[0, 0] == pytest.approx(-4.0)
    assert exact("cispo", [[2.0]], [1.0], [[1]])[1][0, 0] == pytest.approx(-5.0)
    assert exact("cispo", [[2.0]], [1.0], [[1]], cap_mode="absolute")[0] == pytest.approx(loss)


@pytest.mark.parametrize("offset", [5.0, 25.0, -15.0])
def test_the_k3_term_is_clamped_at_10(worker, offset):
    # on-policy, A = 1, ref = logp + offset: k3 = e^offset - offset - 1 is 142, 7e10 and 14; Unsloth caps it at
    # 10, so the loss is -1 + 0.04 * 10 and the KL adds nothing to the gradient
    loss, grad = call(worker, {"loss_type": "grpo", "beta": 0.04}, [[0.0]], [1.0], [[1]], [[offset]])
    k3 = np.exp(offset) - offset - 1
    want, want_grad = exact("grpo", [[0.0]], [1.0], [[1]], [[offset]], beta=0.04)
    assert want == pytest.approx(-1 + 0.04 * k3) and want_grad[0, 0] == pytest.approx(-1 + 0.04 * (1 - np.exp(offset)))
    assert loss == pytest.approx(-1 + 0.04 * 10) and grad[0, 0] == pytest.approx(-1.0)


def test_below_the_clamp_the_kl_terms_agree(worker):
    # ref = logp + 0.5, log r = 0.1: plain k3 (the function's fallback) and the bias-corrected r * k3
    case = ([[0.1]], [1.0], [[1]], [[0.5]])
    for kw, kl in (({}, "k3"), ({"use_bias_correction_kl": True}, "k3_unbiased")):
        loss, grad = call(worker, {"loss_type": "grpo", "beta": 0.04, **kw}, *case)
        want, want_grad = exact("grpo", *case, beta=0.04, kl=kl)
        assert loss == pytest.approx(want, rel=1e-9) and grad == pytest.approx(want_grad, rel=1e-9)


def test_sequence_level_with_the_dapo_loss_weights_sequences_by_length(worker):
    case = ([[1e-4, 0, 0], [-1e-4, 1e-4, 0.0]], [1.0, -1.0], [[1, 0, 0], [1, 1, 1]])
    loss, grad = call(worker, {"loss_type": "dapo", "importance_sampling_level": "sequence", "epsilon_low": 3e-4,
                               "epsilon_high": 4e-4, "beta": 0.0}, *case)
    # GSPO Eq. 5: the mean over sequences of -s_i A_i, s_1 = e^1e-4, s_2 = 1: (-e^1e-4 + 1) / 2 ~ 0
    assert exact("gspo", *case)[0] == pytest.approx((1 - np.exp(1e-4)) / 2)
    # Unsloth weights each sequence by its tokens: (-1 * e^1e-4 + 3 * 1) / 4
    assert loss == pytest.approx((3 - np.exp(1e-4)) / 4, rel=1e-9)
    assert loss == pytest.approx(exact("gspo", *case, agg="token_mean")[0], rel=1e-9)


def test_the_worker_runs_the_locked_version(worker):
    from harness.targets.remote import ROOT
    lock = (ROOT / "harness/targets/envs/unsloth.lock").read_text()
    pin = next(line.split("==")[1] for line in lock.splitlines() if line.startswith("unsloth_zoo=="))
    assert worker.versions()["unsloth"] == f"zoo {pin}"
