"""Each difference the conformance report finds in TRL's GRPOTrainer, reproduced through the trainer's own
``_compute_loss`` on a tiny random model, against the exact reference (spec)."""
import numpy as np
import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import spec  # noqa: E402
from harness.conform.engine import run_check  # noqa: E402
from harness.conform.cases import Batch  # noqa: E402
from harness.conform.targets.trl import Target, make_trainer, trl_run  # noqa: E402

TRAINERS = {}


def trainer(**config):
    key = tuple(sorted(config.items()))
    if key not in TRAINERS:
        TRAINERS[key] = make_trainer(**config)
    return TRAINERS[key]


def call(config, log_ratio, adv, mask, ref_offset=None, group_size=1):
    """TRL's loss and gradient, and the batch the trainer saw (its own log-probs, old = logp - log_ratio)."""
    log_ratio, mask = np.array(log_ratio, float), np.array(mask, float)
    adv = np.repeat(np.array(adv, float)[:, None], mask.shape[1], 1)
    ref = np.zeros_like(mask) if ref_offset is None else np.array(ref_offset, float)
    ids = np.arange(mask.size).reshape(mask.shape) % 50 + 4
    b = Batch(np.zeros_like(mask), -log_ratio, adv, mask, ref, group_size, {"ids": ids})
    return trl_run(trainer(**config))(b)


def exact(name, used, **hp):
    loss, grad = spec.policy_loss(name, used.logp, used.old_logp, used.adv, used.mask, group_size=used.group_size,
                                  ref_logp=used.ref_logp, **hp)
    return float(loss), grad.astype(float)


@pytest.mark.parametrize("loss_type, name, hp", [("grpo", "grpo", {"beta": 0.0}), ("sapo", "sapo", {}),
                                                 ("dr_grpo", "dr_grpo", {"max_len": 8})])
def test_sequence_means_count_empty_completions(loss_type, name, hp):
    # two completions, the second fully masked (e.g. mask_truncated_completions): the reference averages over the
    # one non-empty completion; TRL divides by both
    loss, grad, used = call({"loss_type": loss_type}, [[0.1, -0.1], [0.0, 0.0]], [1.0, 1.0], [[1, 1], [0, 0]])
    want, want_grad = exact(name, used, **hp)
    assert loss == pytest.approx(want / 2, rel=1e-6)
    assert grad == pytest.approx(want_grad / 2, rel=1e-6, abs=1e-9)
    assert abs(loss - want) > 0.1


def test_the_default_loss_is_dapo_with_token_mean_and_no_clip_higher():
    t = trainer()
    assert t.loss_type == "dapo" and t.epsilon_high == t.epsilon_low == 0.2  # the paper's clip-higher is 0.28
    # groups of one: 1 token with A = 1, 3 tokens with A = 0
    loss, _, used = call({}, [[0.0, 0, 0], [0.0, 0.0, 0.0]], [1.0, 0.0], [[1, 0, 0], [1, 1, 1]])
    assert exact("dapo", used)[0] == pytest.approx(-0.5)  # DAPO Eq. 8: per-group token means, averaged
    assert loss == pytest.approx(-0.25) == pytest.approx(exact("dapo", used, agg="token_mean")[0])


def test_bias_corrected_kl_changes_the_gradient_even_on_policy():
    # on-policy, ref = logp + 0.2: k3' = 1 - e^0.2 per token; TRL multiplies k3 by the ratio, whose gradient adds k3
    on_policy = dict(log_ratio=[[0.0]], adv=[1.0], mask=[[1]], ref_offset=[[0.2]])
    loss, grad, used = call({"loss_type": "grpo", "beta": 0.04}, **on_policy)
    want, want_grad = exact("grpo", used, beta=0.04)
    assert loss == pytest.approx(want, rel=1e-6)
    assert want_grad[0, 0] == pytest.approx(-1 + 0.04 * (1 - np.exp(0.2)))
    assert grad[0, 0] == pytest.approx(-1 + 0.04 * (-0.2), rel=1e-6)  # k3' + k3 = -(ref - logp) at r = 1
    loss, grad, used = call({"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False}, **on_policy)
    assert grad[0, 0] == pytest.approx(want_grad[0, 0], rel=1e-6)


def test_bias_corrected_kl_is_the_k3_unbiased_estimator():
    # off-policy (log r = 0.3), ref = logp + 0.2: TRL's corrected term is r * k3, the reference's k3_unbiased
    case = dict(log_ratio=[[0.3]], adv=[1.0], mask=[[1]], ref_offset=[[0.2]])
    loss, grad, used = call({"loss_type": "grpo", "beta": 0.04}, **case)
    want, want_grad = exact("grpo", used, beta=0.04, kl="k3_unbiased")
    plain, _ = exact("grpo", used, beta=0.04)
    assert loss == pytest.approx(want, rel=1e-6) and grad == pytest.approx(want_grad, rel=1e-6)
    assert abs(want - plain) > 1e-4


def test_cispo_caps_the_weight_at_epsilon_high_itself():
    # r = e^2 = 7.39, A = 1: TRL's weight is min(r, 4) = 4; MiniMax-M1 Eq. 5 (and verl) cap it at 1 + 4 = 5
    loss, grad, used = call({"loss_type": "cispo", "epsilon_high": 4.0}, [[2.0]], [1.0], [[1]])
    absolute = exact("cispo", used, cap_mode="absolute")
    paper = exact("cispo", used)
    assert grad[0, 0] == pytest.approx(-4.0, rel=1e-6) == pytest.approx(absolute[1][0, 0])
    assert paper[1][0, 0] == pytest.approx(-5.0) and loss == pytest.approx(absolute[0], rel=1e-6)


def test_delta_is_the_two_sided_clip():
    # A = -1, r = e = 2.72 > delta = 1.5: TRL's loss is -min(1.5 A, 1.2 A) = 1.5 with no gradient, as the reference
    loss, grad, used = call({"loss_type": "grpo", "delta": 1.5}, [[1.0]], [-1.0], [[1]])
    want, want_grad = exact("grpo", used, beta=0.0, delta=1.5)
    assert loss == pytest.approx(want, rel=1e-6) == pytest.approx(1.5)
    assert grad[0, 0] == 0.0 == want_grad[0, 0]


def test_sequence_level_with_the_dapo_loss_weights_sequences_by_length():
    config = {"loss_type": "dapo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}
    loss, grad, used = call(config, [[1e-4, 0, 0], [-1e-4, 1e-4, 0.0]], [1.0, -1.0], [[1, 0, 0], [1, 1, 1]])
    gspo = exact("gspo", used, eps_low=3e-4, eps_high=4e-4)
    length_weighted = exact("gspo", used, eps_low=3e-4, eps_high=4e-4, agg="token_mean")
    assert abs(loss - gspo[0]) > 0.1
    assert loss == pytest.approx(length_weighted[0], rel=1e-6) and grad == pytest.approx(length_weighted[1])


def test_the_engine_reports_the_empty_row_convention():
    target = Target()
    check = next(c for c in target.checks() if c.knob.startswith("loss_type='sapo'"))
    row = run_check(check, seeds=2)[0]
    assert row["kind"] == "differs"
    assert any("empty rows counted" in m for m in row["matches"])
    minimal = next(f for f in row["findings"] if "empty rows counted" in f["name"])["minimal_input"]
    assert 0 in [sum(r) for r in minimal["input"]["mask"]]  # the minimal input has an empty completion


# RLOOTrainer (the trl_rloo target)

def rloo(log_ratio, adv, mask, **config):
    """RLOOTrainer's loss and d loss / d per-token log-prob on a batch given by its log-ratios."""
    from harness.conform.targets.trl_rloo import loss_run, rloo_trainer
    key = ("rloo",) + tuple(sorted(config.items()))
    if key not in TRAINERS:
        TRAINERS[key] = rloo_trainer(**config)
    mask = np.array(mask, float)
    adv = np.repeat(np.array(adv, float)[:, None], mask.shape[1], 1)
    ids = np.arange(mask.size).reshape(mask.shape) % 50 + 4
    b = Batch(np.zeros_like(mask), -np.array(log_ratio, float), adv, mask, np.zeros_like(mask), 1, {"ids": ids})
    loss, grad, _ = loss_run(TRAINERS[key])(b)
    return loss, grad


def test_rloo_clips_the_summed_sequence_log_ratio():
    # two tokens with log r = 0.1 each, A = 1: the sequence ratio is e^0.2 = 1.221 > 1.2, clipped: loss -1.2, no
    # gradient; GSPO's length-normalised ratio e^0.1 = 1.105 would not be clipped
    loss, grad = rloo([[0.1, 0.1]], [1.0], [[1, 1]])
    assert loss == pytest.approx(-1.2, rel=1e-6) and np.abs(grad).max() == 0.0
    gspo = exact("gspo", Batch(np.array([[0.1, 0.1]]), np.zeros((1, 2)), np.ones((1, 2)), np.ones((1, 2)),
                               np.zeros((1, 2)), 1), eps_low=0.2, eps_high=0.2)
    assert gspo[0] == pytest.approx(-np.exp(0.1))
    loss, grad = rloo([[0.1, 0.1]], [1.0], [[1, 1]], epsilon_high=0.28)  # inside 1.28: r A, gradient r A per token
    assert loss == pytest.approx(-np.exp(0.2), rel=1e-6) and grad == pytest.approx(-np.exp(0.2) * np.ones((1, 2)))


def test_rloo_on_policy_is_reinforce_summed_over_tokens_and_averaged_over_every_row():
    # on-policy, A = (2, -1, 1) with the third completion empty: the gradient is -A_i / 3 on each token of row i
    # (REINFORCE on the sequence log-prob, 2402.14740 Sec. 3); the empty row adds -A_3 / 3 to the loss value
    loss, grad = rloo(np.zeros((3, 2)), [2.0, -1.0, 1.0], [[1, 1], [1, 0], [0, 0]])
    assert grad == pytest.approx(np.array([[-2 / 3, -2 / 3], [1 / 3, 0.0], [0.0, 0.0]]), rel=1e-6)
    assert loss == pytest.approx(-(2.0 - 1.0 + 1.0) / 3, rel=1e-6)


def test_rloo_advantage_is_the_leave_one_out_baseline():
    from harness.conform.targets.trl_rloo import advantage_run
    # rewards (1, 0, 0) in one group of 3: R_i - mean of the other two = (1, -0.5, -0.5)
    mask = np.ones((3, 2))
    adv = np.array([[1.0, 1], [0, 0], [0, 0]])
    got, _, _ = advantage_run(Batch(np.zeros((3, 2)), np.zeros((3, 2)), adv, mask, np.zeros((3, 2)), 3,
                                    {"ids": np.full((3, 2), 5)}))
    assert got[:, 0] == pytest.approx([1.0, -0.5, -0.5], rel=1e-6)
    assert got[:, 0] == pytest.approx(np.asarray(spec.group_advantages([1.0, 0, 0], 3, kind="rloo"), float))


def test_the_gradient_overflows_in_the_float32_log_probs():
    # log r = 100, A = -0.4, dual clip off: the loss is -r * A = 0.4 e^100 = 1.1e43 and so is its gradient (PPO's
    # unclipped branch for A < 0); TRL's value is right (float64 from the old log-probs on), but the gradient flows
    # into the trainer's float32 log-probs, where 1.1e43 is inf
    loss, grad, used = call({"loss_type": "dapo", "epsilon_high": 0.28}, [[100.0]], [-0.4], [[1]])
    want, want_grad = exact("dapo", used, agg="token_mean")
    assert want == pytest.approx(0.4 * np.exp(100)) and want_grad[0, 0] == pytest.approx(want)
    assert loss == pytest.approx(want, rel=1e-6) and np.isinf(grad[0, 0])


def test_gmpo_gives_an_empty_completion_the_weight_1():
    # two completions, the second fully masked, A = (1, 2): the first's geometric-mean ratio is e^0.1 (log-ratios
    # 0.1 and 0.1, inside the log-space clip 0.4); the empty one's is exp(0 / max(0, 1)) = 1, so TRL's mean over
    # both rows is (-e^0.1 - 2) / 2, where the reference averages over the non-empty completion: -e^0.1
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer
    key = ("gmpo",)
    if key not in TRAINERS:
        TRAINERS[key] = make_trainer(trainer_cls=GMPOTrainer, config_cls=GMPOConfig)
    mask = np.array([[1.0, 1.0], [0.0, 0.0]])
    b = Batch(np.zeros_like(mask), -np.full(mask.shape, 0.1), np.array([[1.0] * 2, [2.0] * 2]), mask,
              np.zeros_like(mask), 1, {"ids": np.array([[4, 5], [6, 7]])})
    loss, _, used = trl_run(TRAINERS[key])(b)
    assert exact("gmpo", used)[0] == pytest.approx(-np.exp(0.1), rel=1e-6)
    assert loss == pytest.approx((-np.exp(0.1) - 2) / 2, rel=1e-6)


def test_sigmoid_dpo_agrees_with_the_reference_on_one_pair():
    # chosen: sequence log-prob -1 (policy), -1.5 (reference); rejected: -2 and -1.5: the margin is 0.5 - (-0.5) = 1
    # and DPO's loss -log sigmoid(beta * 1) with beta 0.1 is 0.6444; its gradient -beta * sigmoid(-0.1) = -0.0475 on
    # each chosen token and +0.0475 on each rejected one
    from harness.conform.targets.trl import dpo_run, make_dpo_trainer
    mask = np.array([[1.0, 1.0], [1.0, 0.0]])
    b = Batch(np.array([[-0.5, -0.5], [-2.0, 0.0]]), np.zeros((2, 2)), np.zeros((2, 2)), mask,
              np.array([[-1.0, -0.5], [-1.5, 0.0]]), 2, {"ids": np.array([[4, 5], [6, 7]])})
    loss, grad, _ = dpo_run(make_dpo_trainer())(b)
    want = spec.dpo_loss([-1.0], [-2.0], [-1.5], [-1.5], beta=0.1)[0]
    assert loss == pytest.approx(float(want)) == pytest.approx(-np.log(1 / (1 + np.exp(-0.1))))
    g = 0.1 / (1 + np.exp(0.1))
    assert grad == pytest.approx(np.array([[-g, -g], [g, 0.0]]))


def test_luspo_counts_empty_completions_in_its_mean_over_sequences():
    # LUSPO's per-sequence loss times |o_i|, averaged: TRL divides by both completions, the second fully masked
    config = {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 2e-3, "epsilon_high": 2.5e-3}
    loss, grad, used = call(config, [[0.1, -0.1], [0.0, 0.0]], [1.0, 1.0], [[1, 1], [0, 0]])
    want, want_grad = exact("luspo", used)
    assert want == pytest.approx(-2.0)  # on policy: s = 1, -A |o| = -2 over the one non-empty completion
    assert loss == pytest.approx(want / 2, rel=1e-6) and grad == pytest.approx(want_grad / 2, rel=1e-6, abs=1e-9)


def test_vespo_clamps_each_tokens_log_ratio_before_the_rows_sum():
    import torch
    from trl import GRPOTrainer
    # a row of log-ratios 50 and -45: W = e^5, phi(W) = W^2 e^(3 (1 - W)) = e^(13 - 3 e^5), about 0; TRL sums the
    # log-ratios clamped to [-20, 20], 20 - 20 = 0: W = 1, phi = 1
    log_ratio, mask, adv = torch.tensor([[50.0, -45.0]]), torch.ones(1, 2), torch.ones(1, 1)
    phi = GRPOTrainer.get_gamma_weights(adv, log_ratio, mask, None)
    assert float(phi) == pytest.approx(1.0)
    _, grad = spec.policy_loss("vespo", [[50.0, -45.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    assert np.abs(np.asarray(grad, dtype=float)).max() < 1e-100
