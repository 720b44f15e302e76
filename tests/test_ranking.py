"""The ranking that decides a comparison (harness.reports.ranking): values read at an equal generation budget and at
equal optimiser updates, Holm over the pairs, tie groups, replication, metric disagreements, the gap sentences, the
few-seeds warning, grid labels, `cliplab sim`'s console and --json, and the plots' labels."""
import json
import warnings

import numpy as np
import pytest

from harness.reports.ranking import _letters, as_json, at_budget, rankings
from harness.reports.sim import LABELS, PANELS, plot_lines, ranking_lines, ranking_text
from harness.reports.stats import pairwise

SETTINGS = {"reward": "binary", "epochs": 1, "minibatches": 2, "group_size": 8, "env_seed": 0}


def _runs(finals: dict, steps: int = 4, generated: dict | None = None, pass_k: dict | None = None,
          rewards: dict | None = None, replication: dict | None = None) -> list[dict]:
    """Simulator-like runs: each label's accuracy_exact is 0.1 until the last step, then its value for the seed;
    ``finals`` the discovery seeds' values (seeds 0..n-1), ``replication`` the replication seeds' (next seeds)."""
    runs = []
    for set_name, values in (("discovery", finals), ("replication", replication or {})):
        for label, per_seed in values.items():
            first = 0 if set_name == "discovery" else len(finals[label])
            for i, v in enumerate(per_seed):
                gen = (generated or {}).get(label, 16)
                records = [{"step": t, "generated": gen, "trained": 16, "gen_per_trained": gen / 16,
                            "clip_frac": 0.01, "malformed": 0.002, "accuracy_exact": v if t == steps - 1 else 0.1,
                            "pass@64": (pass_k or {}).get(label, [0.5] * len(per_seed))[i] if t == steps - 1
                            else 0.4} for t in range(steps)]
                runs.append({"dir": "sweep", "label": label, "algo": label.split("[")[0], "params": {},
                             "seed": first + i, "env": "toy_lm", "set": set_name, "records": records,
                             "settings": {**SETTINGS, "reward": (rewards or {}).get(label, "binary")}})
    return runs


NOISE = np.array([0.01, -0.01, 0.02, -0.02, 0.0])


def test_holm_over_the_pairs_by_hand():
    # paired differences over 3 seeds (2 df, where P(|T| > t) = 1 - t / sqrt(2 + t^2)):
    # b - a = [1, 2, 2]: t = 5; c - a = [1, 2, 3]: t = 2 sqrt(3); c - b = [0, 0, 1]: t = 1
    a, b, c = np.zeros(3), np.array([1.0, 2, 2]), np.array([1.0, 2, 3])
    found = pairwise({"a": a, "b": b, "c": c}, paired=True, min_n=3)
    raw = {k: 1 - t / np.sqrt(2 + t * t) for k, t in ((("a", "b"), 5.0), (("a", "c"), 2 * np.sqrt(3)),
                                                     (("b", "c"), 1.0))}
    # Holm: the smallest times 3, the next times 2 (running max), the largest times 1
    assert found["a", "b"].p == pytest.approx(3 * raw["a", "b"], rel=1e-9)
    assert found["a", "c"].p == pytest.approx(2 * raw["a", "c"], rel=1e-9)
    assert found["b", "c"].p == pytest.approx(raw["b", "c"], rel=1e-9)
    # the detectable size is stated at Holm's strictest level (5% / 3): larger than at 5%
    from harness.reports.stats import detectable_effect
    ab = found["a", "b"]
    assert ab.detectable > detectable_effect(ab.se, ab.df) > 0
    assert pairwise({"a": a, "b": b}, paired=True)["a", "b"].kind == "too few"  # under MIN_SEEDS: not tested


def test_ties_share_a_letter_and_a_separated_leader_replicates():
    base = NOISE + 0.5
    finals = {"grpo": base + 0.3, "dr_grpo": base, "gspo": base[[1, 0, 3, 2, 4]]}  # gspo - dr_grpo has mean 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 5 seeds a set: no warning
        found = rankings(_runs(finals, replication=finals))
    rk = found[0]
    assert [rk.axis for rk in found] == ["generation budget", "optimiser updates"]
    groups = {s.label: s.group for s in rk.standings}
    assert rk.standings[0].label == "grpo" and groups == {"grpo": "a", "dr_grpo": "b", "gspo": "b"}
    assert rk.verdict == "grpo leads, ahead of every other label (Holm-adjusted 5%)."
    tie = next(p for p in rk.pairs if {p.ahead, p.behind} == {"dr_grpo", "gspo"})
    assert not tie.separable and tie.metric.p == 1.0
    assert rk.replicates is True and rk.test == "paired t"
    text = "\n".join(ranking_lines(found))
    assert "not detectable with 5 seeds (smallest detectable effect" in text and "no effect" not in text
    assert "The order replicates: each of the 2 separations holds on the replication seeds." in text


def test_tie_groups_are_not_transitive():
    # x and z are separable, y is separable from neither: x "a", y "ab", z "b"
    assert _letters(["x", "y", "z"], {("x", "z")}) == {"x": "a", "y": "ab", "z": "b"}


def test_a_reversed_replication_is_named():
    finals = {"grpo": NOISE + 0.8, "dr_grpo": NOISE + 0.5}
    rk = rankings(_runs(finals, replication={"grpo": NOISE + 0.5, "dr_grpo": NOISE + 0.8}))[0]
    assert rk.replicates is False
    assert rk.replication.startswith("The order does not fully replicate: 0 of 1 separations hold")
    assert "grpo over dr_grpo (replication: reversed)" in rk.replication
    assert [s.replication_rank for s in rk.standings] == [2, 1]


def test_values_are_read_at_equal_generation_and_at_equal_updates():
    # grpo generates 16 a step, dapo 48: 4 steps give grpo 48 before its last step, dapo 48 before its second;
    # dapo's accuracy climbs 0.2 a step, so at equal generation it is read at step 1, at equal updates at step 3
    runs = _runs({"grpo": NOISE + 0.5, "dapo": NOISE + 0.7}, generated={"dapo": 48}, rewards={"dapo": "pm1"})
    for r in runs:
        if r["label"] == "dapo":
            for t, rec in enumerate(r["records"]):
                rec["accuracy_exact"] = 0.1 + 0.2 * t + NOISE[r["seed"]]
    gen, upd = rankings(runs)
    by_gen = {s.label: s.metric.mean for s in gen.standings}
    by_upd = {s.label: s.metric.mean for s in upd.standings}
    assert gen.budget == 48 and by_gen["dapo"] == pytest.approx(0.3) and by_gen["grpo"] == pytest.approx(0.5)
    assert upd.budget == 3 * 2 and by_upd["dapo"] == pytest.approx(0.7)  # 3 steps x 1 epoch x 2 minibatches
    assert [s.label for s in gen.standings] == ["grpo", "dapo"] and upd.standings[0].label == "dapo"
    gap = gen.standings[1].gap
    assert gap.startswith("below grpo by 0.2 (the same in every seed pair)")
    assert ("differs from the leader in: 3 generated per trained response against 1 (the same generation trained "
            "it on fewer responses); reward pm1 1/-1/-1 against binary 1/0/0.") in gap
    assert "dapo 3x the fewest" in " ".join(ranking_text(gen))


def test_a_trainers_logged_updates_per_batch_count_where_runs_have_no_simulator_settings():
    # cliplab train runs carry no simulator settings: grpo logs 16 updates a step, dapo 4. The budget is the fewest
    # updates any label reached, dapo's 3 x 4 = 12 by its last evaluation; grpo made 16 in its first step, so it is
    # read at its first evaluation (0.1), dapo at its last (0.7)
    runs = _runs({"grpo": NOISE + 0.5, "dapo": NOISE + 0.7})
    for r in runs:
        r.pop("settings")
        for rec in r["records"]:
            rec["updates_per_batch"] = 16 if r["label"] == "grpo" else 4
    upd = rankings(runs)[1]
    assert upd.axis == "optimiser updates" and upd.budget == 3 * 4  # dapo's 3 trained steps of 4 updates
    by_upd = {s.label: s.metric.mean for s in upd.standings}
    assert by_upd["dapo"] == pytest.approx(0.7) and by_upd["grpo"] == pytest.approx(0.1)


def test_a_sparse_evaluation_is_interpolated_at_the_budget():
    used = np.array([[0.0, 32, 64, 96], [0, 32, 64, 96], [0, 60, 120, 180]])
    values = np.array([[0.1, np.nan, 0.5, 0.7], [0.1, 0.2, 0.3, np.nan], [np.nan, 0.3, 0.4, 0.5]])
    # 48 lies between the evaluations at 0 (0.1) and 64 (0.5): 0.1 + 0.4 * 48 / 64; then between 32 and 64
    # (0.2 + 0.1 / 2); the third seed has no evaluation within 48
    np.testing.assert_allclose(at_budget(used, values, 48.0), [0.4, 0.25, np.nan])
    np.testing.assert_allclose(at_budget(used[:2], values[:2], 200.0), [0.7, 0.3])  # past the last evaluation


def test_a_label_without_what_a_budget_counts_is_named_not_ranked_on_it():
    runs = _runs({"grpo": NOISE + 0.8, "dr_grpo": NOISE + 0.5, "gspo": NOISE + 0.6})
    for r in runs:
        if r["label"] == "gspo":
            for rec in r["records"]:
                del rec["trained"]
    gen, upd = rankings(runs)
    assert len(gen.standings) == 3 and not gen.left_out
    assert [s.label for s in upd.standings] == ["grpo", "dr_grpo"]
    assert upd.left_out == ["gspo (no optimiser updates logged)"]
    assert "Not ranked: gspo (no optimiser updates logged)." in ranking_text(upd)


def test_a_label_like_the_leader_in_every_measurement_says_so():
    rk = rankings(_runs({"grpo": NOISE + 0.8, "dr_grpo": NOISE + 0.5}))[0]
    assert rk.standings[1].gap.endswith("are the leader's (within 1.25x): the gap is in the update itself.")


def test_metrics_that_order_a_pair_differently_are_flagged():
    finals = {"grpo": NOISE + 0.6, "dr_grpo": NOISE + 0.5}
    rk = rankings(_runs(finals, pass_k={"grpo": NOISE + 0.4, "dr_grpo": NOISE[[1, 0, 3, 2, 4]] + 0.7}))[0]
    assert rk.pass_k == "pass@64" and rk.pairs[0].disagree == "both"
    # grpo - dr_grpo on pass@64: -0.3 + [0.02, -0.02, 0.04, -0.04, 0]: sd sqrt(0.001), t(0.975, 4) 2.776445
    assert (f"Metrics disagree: pass@64 puts dr_grpo ahead of grpo (-0.3 ± {2.776445 * np.sqrt(0.001 / 5):.3g} "
            "(paired, Holm p"
            in " ".join(ranking_text(rk)))
    same = rankings(_runs(finals))[0]
    assert same.pairs[0].disagree == "" and "Metrics disagree" not in " ".join(ranking_text(same))


def test_fewer_than_five_seeds_warn_once_and_read_n_a():
    finals = {"grpo": [0.5, 0.6, 0.7], "dr_grpo": [0.4, 0.5, 0.6]}
    with pytest.warns(UserWarning) as caught:
        found = rankings(_runs(finals))
    assert [str(w.message) for w in caught] == [
        "ranking: 3 seed(s) in a set, fewer than 5; its intervals read n/a (too few seeds) and no pair is tested"]
    text = "\n".join(ranking_lines(found))
    assert "n/a (too few seeds)" in text and "nan" not in text and "± 0 " not in text
    assert "grpo has the highest mean; with fewer than 5 seeds no pair is tested." in text
    assert "not tested (fewer than 5 seeds a side)" in text


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory):
    """A bandit sweep with a grid on DAPO, 10 seeds (5 + 5), 3 steps."""
    from harness.runs.sim import sim_command
    out = tmp_path_factory.mktemp("grid") / "sweep"
    sim_command("bandit", "grpo,dapo", "10", 3, ["dapo.eps_high=0.2,0.28"], str(out), workers=1, progress=False)
    return out


def test_grid_labels_are_ranked_and_json_carries_the_ranking(grid_sweep, capsys):
    from harness.runs.sim import sim_command
    capsys.readouterr()
    sim_command("bandit", "grpo,dapo", "10", 3, ["dapo.eps_high=0.2,0.28"], str(grid_sweep), json_out=True,
                workers=1, progress=False)  # resumes: every run is done
    out = json.loads(capsys.readouterr().out)
    assert set(out["algorithms"]) == {"grpo", "dapo[eps_high=0.2]", "dapo[eps_high=0.28]"}
    assert [r["axis"] for r in out["ranking"]] == ["generation budget", "optimiser updates"]
    for rk in out["ranking"]:
        assert {s["label"] for s in rk["standings"]} == set(out["algorithms"])
        assert len(rk["pairs"]) == 3 and rk["metric"] == "accuracy_exact" and rk["pass_k"] == "pass@64"
        assert {"mean", "half", "n"} <= set(rk["standings"][0]["metric"])


def test_the_console_prints_the_ranking_first(grid_sweep, capsys):
    from harness.runs.sim import sim_command
    capsys.readouterr()
    sim_command("bandit", "grpo,dapo", "10", 3, ["dapo.eps_high=0.2,0.28"], str(grid_sweep), workers=1,
                progress=False)
    out = capsys.readouterr().out
    assert out.startswith("ranking at equal generation budget (")
    assert out.index("ranking at equal optimiser updates") < out.index("summary at the end of each run")
    assert "dapo[eps_high=0.28]" in out.split("summary at the end")[0]


def test_as_json_writes_no_nan():
    with pytest.warns(UserWarning, match="fewer than 5"):
        found = rankings(_runs({"grpo": [0.5], "dr_grpo": [0.4]}))
    text = json.dumps(as_json(found), allow_nan=False)  # raises on a NaN
    assert '"half": null' in text


def test_plots_are_titled_and_labelled_with_units(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from harness.reports.rundirs import Groups
    seen = []
    close = plt.close

    def record(fig):
        seen.append([(ax.get_title(), ax.get_ylabel(), ax.get_xlabel()) for ax in fig.axes])
        close(fig)
    monkeypatch.setattr(plt, "close", record)
    runs = _runs({"grpo": NOISE + 0.5, "dapo": NOISE + 0.6}, generated={"dapo": 48})
    for r in runs:
        for rec in r["records"]:
            rec.update(entropy=1.0, rur=0.5)
    g = Groups(runs)
    lines = plot_lines(g, g.labels(), tmp_path / "c.png", "toy_lm: sweep", panels=("accuracy_exact", "entropy",
                                                                                     "rur", "gen_per_trained"))
    lines += plot_lines(g, g.labels(), tmp_path / "c_budget.png", "toy_lm: sweep", panels=("accuracy_exact",),
                        x="generated", budget=48)
    assert seen[0] == [("exact accuracy", "P(correct response)", "step"), ("entropy", "nats per token", "step"),
                       ("response utilisation (RUR)", "share of trained responses", "step"),
                       ("generated per trained response", "responses", "step")]
    assert seen[1] == [("exact accuracy", "P(correct response)", "responses generated (seed mean)")]
    assert len(set(lines)) == 2 and lines[1] == ("![toy_lm: sweep: exact accuracy by responses generated (seed "
                                                 "mean)](c_budget.png)")
    assert all(k in LABELS for k in PANELS)  # every default panel has its title and unit
