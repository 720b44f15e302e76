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
    # the 2026 modes: LUSPO's clip widths (its Sec. 5.1), DPPO's thresholds as the authors' verl recipe sets them
    "luspo": dict(eps_low=2e-3, eps_high=2.5e-3, agg="seq_mean_token_sum"),
    "vespo": dict(vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0, agg="token_mean"),
    "dppo_tv": dict(eps_low=0.15, eps_high=0.15, agg="token_mean"),
    "dppo_kl": dict(eps_low=0.05, eps_high=0.05, agg="token_mean"),
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


# Another valid value of each hyper-parameter (beside its default), for the reads() test (eps_low and eps_high small
# enough that DPPO's divergence thresholds, not only the ratio clips, move on the batch there).
OTHER = {"eps_low": 0.001, "eps_high": 0.01, "kl": "k1", "max_len": 7, "tau_pos": 3.0, "tau_neg": 0.3, "r_max": 2.0,
         "dual_clip": 1.5, "delta": 4.0, "cap_mode": "absolute", "clip_cov_ratio": 0.5, "clip_cov_lb": -5.0,
         "clip_cov_ub": 50.0, "cov_seed": 3, "kl_cov_ratio": 0.5, "kl_cov_coef": 3.0, "tis_cap": 1.1,
         "mis_low": 0.9, "mis_high": 1.2, "opsm_delta": 0.1, "vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 1.0,
         "vespo_lambda_neg": 0.5}


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
@pytest.mark.parametrize("base", [{}, {"beta": 0.1}, {"rollout_correction": "tis"}, {"rollout_correction": "mis"}])
def test_reads_names_what_the_loss_reads(name, base):
    """A hyper-parameter outside ``reads`` changes nothing (or is refused with its name); the clip's and selection's
    ones inside it do change a token-ratio loss or its gradient on a batch with ratios far from 1."""
    import numpy as np

    import sim
    rng = np.random.default_rng(0)
    logp = -rng.exponential(1.0, (4, 6))
    old = np.minimum(logp + rng.normal(0, 1.5, (4, 6)), -1e-3)  # log-probs (DCPO's q needs pi_old <= 1)
    batch = dict(logp=logp, old_logp=old, adv=rng.normal(size=(4, 6)), mask=np.ones((4, 6)), group_size=2,
                 ref_logp=logp + rng.normal(0, 0.5, (4, 6)), rollout_logp=old + rng.normal(0, 0.5, (4, 6)))
    alg = get_algorithm(name)
    if alg.defaults["agg"] == "seq_mean_token_sum_norm":
        base = {**base, "max_len": 6}
    reads = alg.reads(base)

    def run(**hp):
        try:
            loss, grad, _ = sim.policy_loss(name, batch["logp"], batch["old_logp"], batch["adv"], batch["mask"],
                                            group_size=2, ref_logp=batch["ref_logp"],
                                            rollout_logp=batch["rollout_logp"] if base.get("rollout_correction")
                                            else None, **{**base, **hp})
        except ValueError as exc:
            assert next(iter(hp)) in str(exc)
            return None
        return loss, grad

    loss0, grad0 = run()
    for key, value in OTHER.items():
        got = run(**{key: value})
        if key not in reads:
            assert got is None or (got[0] == loss0 and np.array_equal(got[1], grad0)), key
        elif alg.ratio == "token" and key in ("eps_low", "eps_high", "tau_pos", "tau_neg", "kl", "tis_cap", "mis_low",
                                              "mis_high"):
            assert got is not None and (got[0] != loss0 or not np.array_equal(got[1], grad0)), key
