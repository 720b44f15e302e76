"""The TRL loss conventions that the kernels built on it (Liger-Kernel, Unsloth) share, as checks on a target's
``call(kw, log_ratio, adv, mask)`` -> (loss, d loss / d logp) against ``exact(name, log_ratio, adv, mask, **hp)``
(the exact reference), both on a fixed policy log-prob."""
import numpy as np
import pytest

#: (the kernel's keyword arguments, the reference algorithm, its hyper-parameters) of the sequence-mean losses
SEQUENCE_MEAN_CASES = [
    ({"loss_type": "grpo"}, "grpo", {"beta": 0.0}),
    ({"loss_type": "sapo"}, "sapo", {}),
    ({"loss_type": "dr_grpo", "max_completion_length": 8}, "dr_grpo", {"max_len": 8}),
    ({"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon_low": 3e-4, "epsilon_high": 4e-4},
     "gspo", {}),
    ({"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon_low": 2e-3, "epsilon_high": 2.5e-3},
     "luspo", {}),
]


def sequence_means_count_empty_completions(call, exact, kw, name, hp, rel):
    # two completions, the second fully masked: the reference averages over the one non-empty completion, the
    # kernel divides by both
    case = ([[0.1, -0.1], [0.0, 0.0]], [1.0, 1.0], [[1, 1], [0, 0]])
    loss, grad = call({**kw, "beta": 0.0}, *case)
    want, want_grad = exact(name, *case, **hp)
    assert abs(want) > 0.1
    assert loss == pytest.approx(want / 2, rel=rel)
    assert grad == pytest.approx(want_grad / 2, rel=rel, abs=rel / 10)


def dapo_divides_by_the_batch_tokens_not_per_group(call, exact):
    # groups of one: 1 token with A = 1, 3 tokens with A = 0, on-policy
    case = ([[0.0, 0, 0], [0.0, 0.0, 0.0]], [1.0, 0.0], [[1, 0, 0], [1, 1, 1]])
    loss, _ = call({"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.0}, *case)
    assert exact("dapo", *case)[0] == pytest.approx(-0.5)  # DAPO Eq. 8: the mean of the groups' token means
    assert loss == pytest.approx(-0.25) == pytest.approx(exact("dapo", *case, agg="token_mean")[0])


def sequence_level_with_the_dapo_loss_weights_sequences_by_length(call, exact, rel):
    case = ([[1e-4, 0, 0], [-1e-4, 1e-4, 0.0]], [1.0, -1.0], [[1, 0, 0], [1, 1, 1]])
    loss, _ = call({"loss_type": "dapo", "importance_sampling_level": "sequence", "epsilon_low": 3e-4,
                    "epsilon_high": 4e-4, "beta": 0.0}, *case)
    # GSPO Eq. 5: the mean over sequences of -s_i A_i, s_1 = e^1e-4, s_2 = 1: (1 - e^1e-4) / 2 ~ 0; the kernel
    # weights each sequence by its tokens: (3 - e^1e-4) / 4
    assert exact("gspo", *case)[0] == pytest.approx((1 - np.exp(1e-4)) / 2)
    assert loss == pytest.approx((3 - np.exp(1e-4)) / 4, rel=rel)
    assert loss == pytest.approx(exact("gspo", *case, agg="token_mean")[0], rel=rel)
