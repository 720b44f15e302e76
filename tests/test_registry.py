"""The registry holds the reference's names, paper defaults and aggregation modes."""
import pytest

from spec.registry import AGG_MODES, ALGORITHMS, POLICY_ALGORITHMS, get_algorithm

# Paper defaults as the reference (and the papers) state them.
PAPER = {
    "ppo": dict(eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean"),
    "grpo": dict(eps_low=0.2, eps_high=0.2, beta=0.04, kl="k3", agg="seq_mean_token_mean"),
    "dr_grpo": dict(eps_low=0.2, eps_high=0.2, beta=0.0, agg="seq_mean_token_sum_norm"),
    "dapo": dict(eps_low=0.2, eps_high=0.28, beta=0.0, agg="group_token_mean"),
    "gspo": dict(eps_low=3e-4, eps_high=4e-4, agg="seq_mean"),
    "gspo_token": dict(eps_low=3e-4, eps_high=4e-4, agg="seq_mean_token_mean"),
    "dcpo": dict(eps_low=0.16, eps_high=0.2, r_max=10.0, dual_clip=10.0, agg="group_seq_sum_token_mean"),
    "sapo": dict(tau_pos=1.0, tau_neg=1.05, agg="seq_mean_token_mean"),
    "dpo": dict(beta=0.1),
}


def test_names_are_the_reference_names():
    assert set(ALGORITHMS) == set(PAPER)
    assert set(POLICY_ALGORITHMS) == set(PAPER) - {"dpo"}
    assert set(AGG_MODES) == {"token_mean", "group_token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                              "seq_mean_token_sum_norm", "group_seq_sum_token_mean", "seq_mean"}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_defaults(name):
    alg = get_algorithm(name)
    for key, value in PAPER[name].items():
        assert alg.defaults[key] == value, (name, key)
    assert alg.source


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="name: unknown algorithm 'grpoo'.*dcpo"):
        get_algorithm("grpoo")
