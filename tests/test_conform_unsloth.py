"""Each difference the conformance report finds in Unsloth's grpo_compute_loss, reproduced through the worker (its
own virtualenv) on the minimal input, against values computed by hand or by the exact reference (spec)."""
from functools import partial

import numpy as np
import pytest
import trl_kernels
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


@pytest.mark.parametrize("kw, name, hp", trl_kernels.SEQUENCE_MEAN_CASES)
def test_sequence_means_count_empty_completions(worker, kw, name, hp):
    trl_kernels.sequence_means_count_empty_completions(partial(call, worker), exact, kw, name, hp, rel=1e-9)


def test_dapo_divides_by_the_batch_tokens_not_per_group(worker):
    trl_kernels.dapo_divides_by_the_batch_tokens_not_per_group(partial(call, worker), exact)


def test_sequence_level_with_the_dapo_loss_weights_sequences_by_length(worker):
    trl_kernels.sequence_level_with_the_dapo_loss_weights_sequences_by_length(partial(call, worker), exact, rel=1e-9)


def test_cispo_caps_the_weight_at_epsilon_high_itself(worker):
    # r = e^2 = 7.39, A = 1: Unsloth's weight is min(r, 4) = 4 (loss -4 * A * logp = 4); MiniMax-M1 Eq. 5 caps it
    # at 1 + 4 = 5
    loss, grad = call(worker, {"loss_type": "cispo", "epsilon_high": 4.0, "beta": 0.0,
                               "num_items_in_batch": 1.0}, [[2.0]], [1.0], [[1]])
    assert loss == pytest.approx(4.0) and grad[0, 0] == pytest.approx(-4.0)
    assert exact("cispo", [[2.0]], [1.0], [[1]])[1][0, 0] == pytest.approx(-5.0)
    assert exact("cispo", [[2.0]], [1.0], [[1]], cap_mode="absolute")[0] == pytest.approx(loss)


@pytest.mark.parametrize("kw", [{"loss_type": "grpo"}, {"loss_type": "bnpo", "use_bias_correction_kl": True}])
@pytest.mark.parametrize("offset", [5.0, 25.0, -15.0])
def test_the_k3_term_is_clamped_at_10(worker, offset, kw):
    # on-policy, A = 1, ref = logp + offset: k3 = e^offset - offset - 1 is 142, 7e10 and 14 (r * k3 the same at
    # r = 1; one token, so bnpo's token mean is grpo's); Unsloth caps it at 10, so the loss is -1 + 0.04 * 10 and
    # the KL adds nothing to the gradient
    loss, grad = call(worker, {**kw, "beta": 0.04}, [[0.0]], [1.0], [[1]], [[offset]])
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


def test_the_worker_runs_the_locked_version(worker):
    from harness.conform.targets.remote import ROOT
    lock = (ROOT / "harness/conform/targets/envs/unsloth.lock").read_text()
    pin = next(line.split("==")[1] for line in lock.splitlines() if line.startswith("unsloth_zoo=="))
    assert worker.versions()["unsloth"] == f"zoo {pin}"


def test_the_trainer_passes_trls_bias_corrected_kl_where_the_function_defaults_to_plain_k3(worker):
    # Unsloth's trainer forwards TRL's GRPOConfig.use_bias_correction_kl (default True) to grpo_compute_loss, whose
    # own fallback is False: off-policy (log r = 0.5) with ref = logp + 0.5, r * k3 and k3 differ
    import trl

    from harness.conform.targets.remote import envs_dir
    from harness.conform.targets.unsloth import TRAINER_KL, Target
    assert trl.GRPOConfig.__dataclass_fields__["use_bias_correction_kl"].default is True
    source = next(envs_dir().glob("unsloth/lib/python*/site-packages/unsloth_zoo/rl_replacements.py")).read_text()
    assert 'kwargs["use_bias_correction_kl"] = getattr(trainer.args, "use_bias_correction_kl", False)' in source
    case = ([[0.5]], [1.0], [[1]], [[0.5]])
    trainer, _ = call(worker, {"loss_type": "grpo", "beta": 0.04, **TRAINER_KL}, *case)
    direct, _ = call(worker, {"loss_type": "grpo", "beta": 0.04}, *case)
    assert trainer == pytest.approx(exact("grpo", *case, beta=0.04, kl="k3_unbiased")[0], rel=1e-9)
    assert direct == pytest.approx(exact("grpo", *case, beta=0.04)[0], rel=1e-9) and abs(trainer - direct) > 1e-3
    checks = Target(worker).checks()
    with_beta = [c for c in checks if "beta=0.04" in c.knob and "loss_type" in c.call]
    assert all("'use_bias_correction_kl': True" in c.call or "use_bias_correction_kl=True" in c.call
               or "unset" in c.knob for c in with_beta)
    assert sum("unset" in c.knob for c in with_beta) == 1
