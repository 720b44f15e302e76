"""Clip-higher and SAPO's temperatures per regime, each verdict with its mechanism row (fabricated runs with
hand-worked values): the clip-higher verdict reads the reward-relevant entropy where the runs log it, and the
mechanism row says whether the tokens the upper clip holds are exploration tokens (DAPO Fig. 3a)."""
import numpy as np
import pytest

from harness.reports.claim_record import Kind
from harness.reports.claims import (CLIP_ACTIVE, claim_clip_higher, claim_dcpo_tcr, claim_gspo_clips,
                                    claim_rollout_correction, claim_sapo, run_claims)
from harness.reports.rundirs import Groups

#: Per-seed noise of the fabricated entropies: mean 0, sample SD 0.01 * sqrt(10 / 9) over the 10 seeds.
WIGGLE = np.array([0.01, -0.01] * 5)


def _run(label, params, seed, records):
    return {"dir": "d", "label": label, "algo": params.get("algo", "grpo"),
            "params": {k: v for k, v in params.items() if k != "algo"}, "seed": seed, "set": "discovery",
            "env": "feature_lm", "settings": None, "records": records}


def _clip_runs(regime: dict, relevant_gain: float, total_noise: float, clip: dict) -> list[dict]:
    """GRPO with beta 0 at eps_high 0.2 and with no upper clip, 10 seeds: the unclipped runs' final reward-relevant
    entropy is the base's plus ``relevant_gain`` plus WIGGLE; the total entropy is 1 plus ``total_noise`` times a
    seed-dependent sign, alike in both; ``clip``: the eps_high 0.2 runs' up-clip metrics."""
    runs = []
    for seed in range(10):
        base_rel = 0.3 + 0.02 * (seed % 3)
        for hi, rel in ((0.2, base_rel), (100, base_rel + relevant_gain + WIGGLE[seed])):
            total = 1.0 + total_noise * (-1) ** (seed // 2) * (1 if hi == 0.2 else -1)
            stats = clip if hi == 0.2 else {"clip_up_frac": 0.0, "freed_frac": 0.02, "freed_pold_median": 0.12}
            # the reward-relevant entropy starts at 1 and falls (the card's entropy_relevant_fall: the regime
            # clip-higher needs), then ends at ``rel``
            records = [{"entropy": total, "entropy_relevant": 1.0 if step == 0 else rel, **stats}
                       for step in range(3)]
            params = {**regime, "beta": 0, "eps_high": hi}
            label = "grpo[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]"
            runs.append(_run(label, params, seed, records))
    return runs


EXPLORING = {"clip_up_frac": 0.01, "upclip_pold_median": 0.1, "upclip_pold_lt02": 0.8, "upclip_fork_share": 0.9}
SHARPENING = {"clip_up_frac": 0.002, "upclip_pold_median": 0.45, "upclip_pold_lt02": 0.2, "upclip_fork_share": 0.4}


def test_clip_higher_reads_the_relevant_entropy_and_states_each_regimes_mechanism():
    """Regime forks=1: +0.05 on the relevant entropy in every seed (differences 0.05 +- 0.01: mean 0.05, SD
    0.01 sqrt(10/9), t interval half-width t_{0.975, 9} 0.01 sqrt(10/9) / sqrt(10) = 2.2622 x 0.0033333 = 0.00754),
    while the total moves by +-0.2 (noise): reproduced, on the relevant entropy. Default regime: no relevant gain."""
    runs = _clip_runs({"forks": 1}, 0.05, 0.2, EXPLORING) + _clip_runs({}, 0.0, 0.2, SHARPENING)
    found = claim_clip_higher(Groups(runs))
    assert [r.regime for r in found] == ["grpo, beta=0", "grpo, beta=0: mechanism", "grpo, beta=0, forks=1",
                                         "grpo, beta=0, forks=1: mechanism"]  # the default regime first
    assert [r.mechanism for r in found] == [False, True, False, True]
    rows = {r.regime: r for r in found}
    rec = rows["grpo, beta=0, forks=1"]
    meas = rec.discovery.measured
    assert rec.kind is Kind.REPRODUCED
    assert "final reward-relevant entropy eps_high 0.2 0.318 ± " in meas  # 0.3 + 0.02 (4 x 0 + 3 x 1 + 3 x 2) / 10
    assert "no upper clip 0.368 ± " in meas
    est = rec.discovery.estimate  # the verdict's difference: 0.05 in every seed but for WIGGLE
    assert est.value == pytest.approx(0.05)
    assert est.what == "final reward-relevant entropy, no upper clip - eps_high 0.2"
    assert rows["grpo, beta=0"].verdict_text().startswith("not detectable with 10 seeds (smallest detectable effect ")
    rec = rows["grpo, beta=0, forks=1: mechanism"]
    meas = rec.discovery.measured
    assert rec.kind is Kind.REPRODUCED
    assert ("up-clipped 1% of tokens, their median pi_old 0.1, share with pi_old < 0.2 80%, 90% of them at forking "
            "positions") in meas
    assert "no upper clip: trained past 1.2 (A > 0) 2% of tokens, their median pi_old 0.12" in meas
    assert rec.reason == "most tokens the upper clip holds are exploration tokens"
    assert rec.attribution.startswith("the principle: ")
    assert rows["grpo, beta=0: mechanism"].kind is Kind.NOT_REPRODUCED
    assert "pi_old >= 0.2" in rows["grpo, beta=0: mechanism"].reason
    # the regime card's condition on the up-clipped tokens: 0.8 of them below pi_old 0.2 here, 0.2 in the default
    card = {c.condition.entry: c for c in rows["grpo, beta=0, forks=1: mechanism"].conditions}
    assert card["upclip_pold_lt02"].value == pytest.approx(0.8) and card["upclip_pold_lt02"].holds
    assert not next(c for c in rows["grpo, beta=0: mechanism"].conditions if c.condition.entry == "upclip_pold_lt02"
                    ).holds


def test_clip_higher_on_paired_seeds_gives_the_hand_worked_interval():
    """Within run_claims every label has the same seeds, so the difference is a paired t test."""
    runs = _clip_runs({"forks": 1}, 0.05, 0.2, EXPLORING)
    rec = next(r for r in run_claims(runs).records
               if r.claim.id == "clip_higher" and r.regime == "grpo, beta=0, forks=1")
    measured = rec.discovery.measured
    assert "no upper clip 0.368 ± " in measured and "(diff 0.05 ± 0.00754 (paired" in measured
    est = rec.discovery.estimate
    assert (est.test, est.half) == ("paired", pytest.approx(0.00754, abs=5e-6)) and est.p < 0.05
    assert rec.status == "discovery only" and rec.replication is None
    assert rec.verdict_text() == "discovery only: reproduced (no replication seeds)"


def test_a_bound_that_never_binds_leaves_the_mechanism_untestable():
    runs = _clip_runs({}, 0.0, 0.0, {"clip_up_frac": 0.0})
    rows = {r.regime: r for r in claim_clip_higher(Groups(runs))}
    assert rows["grpo, beta=0"].kind is Kind.NOT_TESTABLE
    assert rows["grpo, beta=0: mechanism"].kind is Kind.NOT_TESTABLE


def _sapo_runs(regime: dict) -> list[dict]:
    """SAPO at tau_pos/tau_neg 1/4 and 4/1: accuracy rises to 0.5 then falls 0.1 (1/4) or 0.2 (4/1) by the end."""
    runs = []
    for seed in range(10):
        for tp, tn, fall in ((1.0, 4.0, 0.1), (4.0, 1.0, 0.2)):
            acc = [0.3, 0.5, 0.5 - fall + 0.001 * WIGGLE[seed] * 100]
            records = [{"accuracy_exact": a, "entropy": 0.5, "decision_dev_q50": 0.1, "ratio_dev_median": 1e-9,
                        "ppo_zeroed_frac": 0.03} for a in acc]  # near-certain tokens hold r = 1: not the gates' scale
            params = {"algo": "sapo", **regime, "tau_pos": tp, "tau_neg": tn}
            label = "sapo[" + ",".join(f"{k}={v}" for k, v in sorted(params.items()) if k != "algo") + "]"
            runs.append(_run(label, params, seed, records))
    return runs


def test_sapo_states_each_regimes_mechanism_beside_its_verdict():
    """Gate weights at |r - 1| = 0.2: sech^2(0.1) = 0.990 (tau 1) and sech^2(0.4) = 1 / 1.0811^2 = 0.856 (tau 4)."""
    rows = claim_sapo(Groups(_sapo_runs({"staleness": 6}) + _sapo_runs({})))
    assert [r.regime for r in rows] == ["defaults", "defaults: mechanism", "staleness=6", "staleness=6: mechanism"]
    by = {r.regime: r for r in rows}
    assert by["staleness=6"].kind is Kind.REPRODUCED  # the paper's ordering falls 0.1 less from its peak
    rec = by["staleness=6: mechanism"]
    meas = rec.discovery.measured
    assert rec.kind is Kind.NA and rec.verdict_text() == "measured"
    assert rec.attribution.startswith("the principle: with tau_neg > tau_pos")
    assert "median |r - 1| on decision tokens 0.1 vs 0.1" in meas
    assert "[0.8, 1.2] in their advantage's direction 3% vs 3%" in meas
    assert "gate weights at |r - 1| = 0.2: tau 1.0 0.99, tau 4.0 0.856" in meas


def test_logs_without_the_up_clip_split_leave_the_mechanism_unmeasured():
    """verl's and TRL's logs have the clipped share but not its upper part or pi_old: no mechanism to state."""
    runs = _clip_runs({}, 0.0, 0.0, {"clip_frac": 0.05})
    rows = {r.regime: r for r in claim_clip_higher(Groups(runs))}
    assert rows["grpo, beta=0"].kind is not Kind.NOT_TESTABLE  # the clipped share stands in for the upper one
    assert rows["grpo, beta=0: mechanism"].kind is Kind.NOT_MEASURED
    assert rows["grpo, beta=0: mechanism"].command.startswith("cliplab sim ")


def _cov_runs(relevant_gain: float, total_gain: float) -> list[dict]:
    """GRPO and Clip-Cov at the same settings (beta 0, token mean), 10 seeds: Clip-Cov's final reward-relevant
    entropy is GRPO's plus ``relevant_gain`` plus WIGGLE, its total GRPO's plus ``total_gain`` (every seed); equal
    accuracy."""
    runs = []
    for seed in range(10):
        base_rel = 0.3 + 0.02 * (seed % 3)
        for algo, rel, total in (("grpo", base_rel, 1.0),
                                 ("clip_cov", base_rel + relevant_gain + WIGGLE[seed], 1.0 + total_gain)):
            params = {"algo": algo, "beta": 0, "agg": "token_mean", "clip_cov_ratio": 0.02}  # one sweep's grid point
            label = f"{algo}[agg=token_mean,beta=0,clip_cov_ratio=0.02]"
            records = [{"entropy": total, "entropy_relevant": rel, "accuracy_exact": 0.5, "cov_frac": 0.01}] * 3
            runs.append(_run(label, params, seed, records))
    return runs


def test_the_cov_claim_reads_the_relevant_entropy_with_the_total_beside_it():
    """Clip-Cov raises the total entropy by 0.3 on every seed (off-track, format contexts) but the reward-relevant
    entropy only by 0 +- WIGGLE (mean 0, half-width 0.00754): the verdict follows the relevant entropy, not the total;
    with +0.05 there it is reproduced."""
    from harness.reports.claims import claim_cov_entropy
    (rec,) = claim_cov_entropy(Groups(_cov_runs(0.0, 0.3)))
    meas = rec.discovery.measured
    assert rec.kind is Kind.NOT_DETECTABLE and rec.discovery.verdict.seeds == 10
    assert "final reward-relevant entropy clip_cov 0.318" in meas
    assert "final entropy clip_cov 1.3 ± " in meas and "(diff 0.3 (structural))" in meas  # the total, beside it
    (rec,) = claim_cov_entropy(Groups(_cov_runs(0.05, 0.0)))
    assert rec.kind is Kind.REPRODUCED


def _clip_share_runs(shares: dict) -> Groups:
    """One label per algorithm, 10 seeds, each step clipping shares[algo] of tokens (+-10% by seed)."""
    return Groups([_run(algo, {"algo": algo}, seed, [{"clip_frac": share * (1 + 0.1 * WIGGLE[seed] / 0.01)}] * 3)
                   for algo, share in shares.items() for seed in range(10)])


def test_clip_share_claims_on_ratios_that_never_reach_the_clip_are_not_testable():
    """GRPO clips 1e-5 of its tokens (the tiny tier at lr 2e-5): DCPO's 1e-6 is 10x below it and GSPO's 6% is 6000x
    above it, ratios of noise; from a baseline share of CLIP_ACTIVE (1e-4) up the ratios decide."""
    g = _clip_share_runs({"grpo": 1e-5, "dapo": 2e-5, "dcpo": 1e-6, "gspo": 0.06})
    for claim in (claim_dcpo_tcr, claim_gspo_clips):
        (rec,) = claim(g)
        assert rec.kind is Kind.NOT_TESTABLE, claim.__name__
        assert rec.reason.startswith("PPO-clip's ratios stay inside [1 - eps, 1 + eps]: GRPO clips 0.001% of its "
                                     "tokens")
        assert not rec.conditions[0].holds  # the card's clip_frac >= 0.003: GRPO's 1e-5 fails it
    assert "DAPO clips 0.002% of its tokens (under 0.01%)" in claim_dcpo_tcr(g)[0].reason
    g = _clip_share_runs({"grpo": CLIP_ACTIVE, "dapo": 2e-3, "dcpo": 5e-6, "gspo": 0.06})
    (tcr,), (gspo,) = claim_dcpo_tcr(g), claim_gspo_clips(g)
    assert tcr.kind is Kind.REPRODUCED and tcr.discovery.estimate.value == pytest.approx(20)  # min(1e-4, 2e-3) / 5e-6
    assert gspo.kind is Kind.REPRODUCED and gspo.discovery.estimate.value == pytest.approx(600)  # 0.06 / 1e-4


def test_a_regime_the_replication_seeds_did_not_run_stands_on_the_discovery_seeds_only():
    """The forks=1 regime on the discovery seeds only, the default regime on the replication seeds only: each
    record says which set it lacks, and none compares as a verdict."""
    runs = _clip_runs({"forks": 1}, 0.05, 0.2, EXPLORING)
    runs += [{**r, "seed": r["seed"] + 10, "set": "replication"} for r in _clip_runs({}, 0.0, 0.2, SHARPENING)]
    rec = next(r for r in run_claims(runs).records
               if r.claim.id == "clip_higher" and r.regime == "grpo, beta=0, forks=1")
    assert rec.status == "discovery only" and not rec.comparable
    assert rec.replication.verdict.kind is Kind.NOT_MEASURED and rec.replication.seeds == "10-19"
    assert rec.verdict_text() == "discovery only: reproduced (not run on the replication seeds)"


@pytest.mark.parametrize("mismatch, testable", [({"rollout_noise": 0.2}, True),
                                                ({"staleness": 2, "old_logp": "policy"}, True),
                                                ({"staleness": 2}, False),  # pi_old is the sampler's: weights are 1
                                                ({}, False)])
def test_a_rollout_correction_is_testable_under_noise_or_a_stale_sampler_whose_pi_old_is_recomputed(mismatch,
                                                                                                       testable):
    runs = [_run(f"grpo{kind or ''}", {"beta": 0, **mismatch, **({"rollout_correction": kind} if kind else {})},
                 seed, [{"accuracy_exact": 0.5 + 0.01 * WIGGLE[seed] * 100, "rc_weight_mean": 1.0,
                         "rc_cut_frac": 0.01}] * 3)
            for kind in (None, "tis") for seed in range(10)]
    rec = claim_rollout_correction(Groups(runs))[0]
    assert (rec.kind is not Kind.NOT_TESTABLE) is testable, rec.reason
    if mismatch.get("staleness") and testable:
        assert "a sampler 2 updates behind the policy that recomputes pi_old" in rec.attribution


def test_a_comparison_where_one_setting_runs_on_is_not_testable_naming_that_setting():
    """The regime's conditions read the baseline's card, and well-formedness every compared setting's: the
    unclipped runs 20% malformed (over the card's 10 steps: all 3 here) leave the comparison to the run-on."""
    from harness.reports.claim_record import regime_checked
    runs = _clip_runs({"forks": 1}, 0.05, 0.2, EXPLORING)
    for run in runs:
        for rec in run["records"]:
            rec["malformed"] = 0.2 if run["params"]["eps_high"] == 100 else 0.0
    rec = claim_clip_higher(Groups(runs))[0]
    checks = [k for k in rec.conditions if k.condition.entry == "malformed_max"]
    assert [(k.label, k.holds) for k in checks] == [("grpo[beta=0,eps_high=0.2,forks=1]", True),
                                                    ("grpo[beta=0,eps_high=100,forks=1]", False)]
    got = regime_checked(rec)
    assert got.kind is Kind.NOT_TESTABLE
    assert got.reason == ("grpo[beta=0,eps_high=100,forks=1]'s malformed_max is 0.2; the claim needs "
                          "malformed_max <= 0.03")
