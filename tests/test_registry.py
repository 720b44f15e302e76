"""The registry holds the reference's names, paper defaults and aggregation modes."""
import pytest

from spec.contract import resolve_hparams
from spec.registry import AGG_MODES, ALGORITHMS, POLICY_ALGORITHMS, get_algorithm

# Paper defaults as the reference (and the papers) state them.
PAPER = {
    "ppo": dict(eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean"),
    "grpo": dict(eps_low=0.2, eps_high=0.2, beta=0.04, kl="k3", agg="seq_mean_token_mean"),
    "dr_grpo": dict(eps_low=0.2, eps_high=0.2, beta=0.0, agg="seq_mean_token_sum_norm"),
    "dapo": dict(eps_low=0.2, eps_high=0.28, beta=0.0, agg="group_token_mean"),
    "gspo": dict(eps_low=3e-4, eps_high=4e-4, agg="seq_mean"),
    "gspo_token": dict(eps_low=3e-4, eps_high=4e-4, agg="seq_mean_token_mean"),
    "dcpo": dict(eps_low=0.16, eps_high=0.2, r_max=10.0, agg="group_seq_sum_token_mean"),
    "sapo": dict(tau_pos=1.0, tau_neg=1.05, agg="seq_mean_token_mean"),
    "dpo": dict(beta=0.1),
    # beyond the seeds (reference "Beyond the seeds")
    "cispo": dict(eps_low=1.0, eps_high=4.0, cap_mode="relative", agg="token_mean"),
    "gmpo": dict(eps_low=0.4, eps_high=0.4, agg="seq_mean"),
    "gpg": dict(agg="token_mean"),
    "clip_cov": dict(clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0, agg="token_mean"),
    "kl_cov": dict(kl_cov_ratio=2e-3, kl_cov_coef=1.0, agg="token_mean"),
}
ADVANTAGE = {"ppo": "gae", "dr_grpo": "dr_grpo", "dcpo": "sas", "gpg": "gpg"}
ROLLOUT = {"tis_cap": 2.0, "mis_low": 0.5, "mis_high": 5.0, "rollout_correction": None, "delta": None}


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
    if name != "dpo":
        assert alg.advantage == ADVANTAGE.get(name, "grpo")
        assert {k: alg.defaults[k] for k in ROLLOUT} == ROLLOUT


@pytest.mark.parametrize("r_max", [5.0, 10.0, 20.0])
def test_dcpo_dual_clip_follows_r_max(r_max):
    """The reference: DCPO's dual-clip constant follows r_max unless dual_clip is given."""
    assert resolve_hparams("dcpo", {"r_max": r_max})["dual_clip"] == r_max
    assert resolve_hparams("dcpo", {"r_max": r_max, "dual_clip": 3.0})["dual_clip"] == 3.0


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="name: unknown algorithm 'grpoo'.*dcpo"):
        get_algorithm("grpoo")
