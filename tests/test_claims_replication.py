"""Claims decided on the discovery seeds and re-checked on the replication seeds, with Holm's correction."""
import numpy as np

from harness.reports.claim_record import Kind
from harness.reports.claims import Family, compare, run_claims
from harness.reports.stats import holm, paired_test


def _runs(shift_discovery: float, shift_replication: float, n: int = 10) -> list[dict]:
    """DCPO under its ternary reward and the binary one; the binary runs' accuracy raised by a shift per set."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(2 * n):
        part = "discovery" if seed < n else "replication"
        shift = shift_discovery if seed < n else shift_replication
        base = 0.3 + 0.02 * rng.standard_normal()
        for label, params, acc in (("dcpo", {}, base), ("dcpo[reward=binary]", {"reward": "binary"},
                                                        base + shift + 0.01 * rng.standard_normal())):
            runs.append({"dir": "d", "label": label, "algo": "dcpo", "params": params, "seed": seed, "set": part,
                         "env": "toy_lm", "settings": None,
                         "records": [{"step": s, "accuracy_exact": acc, "malformed": 0.0} for s in range(10)]})
    return runs


def _dcpo_reward_record(runs):
    rs = run_claims(runs)
    return next(r for r in rs.records if r.claim.id == "dcpo_reward"), rs


def test_a_verdict_stands_only_where_both_sets_agree():
    rec, rs = _dcpo_reward_record(_runs(0.1, 0.1))
    assert rec.kind is Kind.REPRODUCED and rec.verdict_text() == "reproduced"
    assert rec.discovery.estimate.value > 0 and rec.replication.estimate.value > 0  # each set's own estimate
    assert rs.seeds == ("0-9", "10-19") and (rec.discovery.seeds, rec.replication.seeds) == rs.seeds
    rec, _ = _dcpo_reward_record(_runs(0.1, 0.0))
    assert rec.kind is Kind.NOT_REPLICATED
    assert (rec.discovery.verdict.kind, rec.replication.verdict.kind) == (Kind.REPRODUCED, Kind.NOT_DETECTABLE)
    assert rec.verdict_text().startswith("not replicated (discovery: reproduced; replication: not detectable with 10 "
                                         "seeds (smallest detectable effect")


def test_without_replication_seeds_no_claim_is_reproduced():
    runs = [r for r in _runs(0.1, 0.1) if r["set"] == "discovery"]
    rec, _ = _dcpo_reward_record(runs)
    assert rec.status == "discovery only" and not rec.comparable
    assert rec.verdict_text().startswith("discovery only: reproduced")


def test_the_family_holm_adjusts_in_the_order_of_its_tests():
    """Two passes over the same tests: the second gets Holm's adjusted p-values back, test by test."""
    rng = np.random.default_rng(1)
    pairs = [(rng.standard_normal(10), rng.standard_normal(10) + shift) for shift in (0.0, 0.5, 2.0)]
    family = Family(paired=True)
    from harness.reports.claims import FAMILY
    token = FAMILY.set(family)
    try:
        first = [compare(a, b)[2].cmp.p for a, b in pairs]
        family.adjust()
        second = [compare(a, b)[2].cmp.p for a, b in pairs]
    finally:
        FAMILY.reset(token)
    assert first == [paired_test(a, b).p for a, b in pairs]
    assert second == list(holm(first))
    assert all(s >= f for s, f in zip(second, first))


def test_claim_settings_show_what_the_algorithm_reads():
    """A regime lists the hyper-parameters its algorithm reads: KL-Cov's runs do not show Clip-Cov's share, and a
    rollout correction's bound shows beside the correction that reads it."""
    from harness.reports.claims import _setting
    rest = {"agg": "token_mean", "beta": 0, "clip_cov_ratio": 0.02, "kl_cov_ratio": 0.02, "lr": 0.1}
    assert _setting("kl_cov", rest) == "agg=token_mean, beta=0, kl_cov_ratio=0.02, lr=0.1"
    assert _setting("clip_cov", rest) == "agg=token_mean, beta=0, clip_cov_ratio=0.02, lr=0.1"
    # a whole float reads as an integer: YAML's 3.0 and --set's 3 are one setting
    assert _setting("grpo", {"tis_cap": 3.0, "mis_low": 0.2}, rollout_correction="tis") == "tis_cap=3"
    assert _setting("grpo", {"tis_cap": 3.0, "mis_low": 0.2}, rollout_correction="mis") == "mis_low=0.2"


def test_the_rollout_correction_claim_runs_on_runs_with_and_without_a_correction():
    from harness.reports.claims import claim_rollout_correction
    from harness.reports.rundirs import Groups
    runs = [{"dir": "d", "label": f"grpo[rollout_correction={rc}]", "algo": "grpo", "env": "toy_lm",
             "params": {"rollout_correction": rc}, "seed": s,
             "records": [{"accuracy_exact": 0.2 + 0.01 * t + 0.001 * s, "rc_weight_mean": 1.0, "rc_cut_frac": 0.0}
                         for t in range(4)]}
            for rc in (None, "tis") for s in range(3)]
    rows = claim_rollout_correction(Groups(runs))
    assert rows and rows[0].regime == "tis, defaults"


def test_a_replication_outside_the_claims_regime_names_the_value_that_fails():
    """The replication seeds' card fails a condition the discovery seeds' meets (headroom >= 0.1: sampled accuracy
    0.96 leaves 0.04): the record does not stand, and its replication verdict says which value failed, not only
    "not testable here"."""
    runs = _runs(0.1, 0.1)
    for run in runs:
        acc = 0.96 if run["set"] == "replication" else 0.5
        run["records"] = [{**rec, "accuracy": acc} for rec in run["records"]]
    rec, _ = _dcpo_reward_record(runs)
    assert rec.kind is Kind.NOT_REPLICATED and rec.replication.verdict.kind is Kind.NOT_TESTABLE
    assert rec.verdict_text().startswith("not replicated (discovery: reproduced; replication: not testable here (")
    assert "headroom is 0.04; the claim needs headroom >= 0.1" in rec.verdict_text()
