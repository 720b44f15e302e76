"""The simulator's regime-card step metrics (spec.regime.STEP_METRICS): each against a value worked out by hand on
a small batch, or against a property it must have in a run."""
import numpy as np
import pytest

from sim.loop import run_stack
from harness.reports.regime import label_card
from sim.metrics import CLIP_KEYS, DEFINITIONS, StepClips, _medians, _Picks, _quantiles, summarise_run
from spec.regime import ENTRIES, NOT_APPLICABLE, STEP_METRICS, reduce_values

# two responses of five tokens; the last token of the second is padding
P_OLD = np.array([[0.1, 0.5, 0.95, 0.3, 0.05], [0.6, 0.15, 0.92, 0.4, 0.7]])
RATIO = np.array([[1.5, 1.1, 1.01, 0.7, 0.6], [1.3, 0.45, 0.99, 1.0, 0.75]])
ADV = np.array([[1.0, 1.0, 1.0, -1.0, 0.0], [-1.0, -1.0, -1.0, 0.0, 2.0]])
MASK = np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 0.0]])
GRPO = {"eps_low": 0.2, "eps_high": 0.2}


def _add(clips, rows=slice(None), on_policy=False):
    old = np.log(P_OLD[rows])
    return clips.add(old + np.log(RATIO[rows]), old, ADV[rows], MASK[rows], on_policy=on_policy)


def test_card_metrics_of_a_hand_built_batch():
    """9 trained tokens, 2 with A = 0. Bounds [0.8, 1.2]: up-clipped (A > 0, r > 1.2): the one at pi_old 0.1;
    down-clipped (A < 0, r < 0.8): those at pi_old 0.3 and 0.15 (r 1.3 with A < 0 is not clipped). Decision
    tokens (A != 0, pi_old < 0.9): |r - 1| = 0.5, 0.1, 0.3, 0.3, 0.55, so the median is 0.3 and the 90th
    percentile 0.5 + 0.6 (0.55 - 0.5) = 0.53; with the two near-certain tokens (|r - 1| = 0.01) the median of
    all seven is still 0.3."""
    clips = StepClips("grpo", GRPO)
    _add(clips, on_policy=True)
    s, = clips.summary()
    assert s["zero_adv_frac"] == pytest.approx(2 / 9)
    assert s["clip_frac_active"] == pytest.approx(3 / 7)
    assert s["clip_up_frac"] == pytest.approx(1 / 9) and s["clip_low_frac"] == pytest.approx(2 / 9)
    assert s["decision_dev_q50"] == pytest.approx(0.3) and s["decision_dev_q90"] == pytest.approx(0.53)
    assert s["decision_frac"] == pytest.approx(5 / 9)  # those five of the nine trained tokens
    assert s["decision_clip_frac"] == pytest.approx(3 / 5) and s["decision_clip_up_frac"] == pytest.approx(1 / 5)
    assert s["ratio_dev_median"] == pytest.approx(0.3)
    assert s["upclip_pold_median"] == pytest.approx(0.1) and s["upclip_pold_lt02"] == 1.0
    assert s["lowclip_pold_median"] == pytest.approx(0.225) and s["lowclip_pold_lt02"] == 0.5
    assert s["on_policy_frac"] == 1.0
    assert s["trunc_frac"] is None  # GRPO has no truncated weight
    _add(clips)  # the same tokens again, off-policy: the shares stay, half the token updates were on-policy
    again, = clips.summary()
    assert again["on_policy_frac"] == 0.5
    assert all(again[k] == pytest.approx(s[k]) for k in ("zero_adv_frac", "clip_frac_active", "lowclip_pold_lt02"))


def test_stacked_blocks_are_counted_each_on_its_own():
    """Two stacked runs of one response each give what each gives alone."""
    both = StepClips("grpo", GRPO, blocks=2)
    _add(both, on_policy=np.array([True, False]))
    for i, got in enumerate(both.summary()):
        alone = StepClips("grpo", GRPO)
        _add(alone, slice(i, i + 1), on_policy=i == 0)
        assert got == alone.summary()[0]


def test_every_blocks_median_and_quantile_from_one_sort_are_numpys():
    """The per-block medians and 90th percentiles taken at once from one sorted grid are np.median's and
    np.quantile's of each block alone, bit for bit: ties, inf, NaN, one value, none, over several updates."""
    rng = np.random.default_rng(5)
    for _ in range(40):
        blocks = int(rng.integers(1, 6))
        picks, alone = _Picks(blocks), [[] for _ in range(blocks)]
        for _ in range(int(rng.integers(1, 4))):
            counts = rng.integers(0, 5, blocks)
            values = rng.choice([0.0, 0.1, 0.25, 0.3, 1.7, np.inf, np.nan], size=counts.sum(),
                                p=[0.2, 0.2, 0.2, 0.2, 0.1, 0.05, 0.05]) + rng.random(counts.sum()) * (rng.random() < 0.5)
            picks.add(values, counts)
            for i, part in enumerate(np.split(values, np.cumsum(counts)[:-1])):
                alone[i].append(part)
        grid, n, nan = picks.sorted()
        with np.errstate(invalid="ignore"):
            medians, q90 = _medians(grid, n, nan), _quantiles(grid, n, nan, 0.9)
            for i, parts in enumerate(alone):
                x = np.concatenate(parts)
                want = (np.median(x), np.quantile(x, 0.9)) if x.size else (np.nan, np.nan)
                assert np.array_equal([medians[i], q90[i]], want, equal_nan=True)


@pytest.mark.parametrize("algo", ["sapo", "cispo", "gpg"])
def test_clip_statistics_are_none_without_a_hard_clip(algo):
    clips = StepClips(algo, {"eps_low": 0.2, "eps_high": 0.2})
    _add(clips)
    s, = clips.summary()
    assert all(s[k] is None for k in CLIP_KEYS)
    assert s["zero_adv_frac"] == pytest.approx(2 / 9)


@pytest.mark.parametrize("algo,has_clip", [("sapo", False), ("cispo", False), ("gpg", False), ("kl_cov", False),
                                            ("vespo", False), ("grpo", True), ("gmpo", True), ("dppo_tv", True)])
def test_clip_frac_is_none_where_the_loss_clips_nothing(algo, has_clip):
    """SAPO's soft gate, CISPO's truncated weight, VESPO's kernel, GPG and KL-Cov hold no token: their clip_frac is
    None at every step and in the run's summary (not 0), and the regime card reads it "n/a"; GRPO's clip, GMPO's
    log-space clip and DPPO's trust region give a share. Stale rollouts, so that ratios move off 1."""
    recs, = run_stack("feature_lm", algo, [0], 2, {**SMALL, "staleness": 1, "minibatches": 2, "lr": 0.3})
    summary = summarise_run(recs)
    if has_clip:
        assert all(0 <= r["clip_frac"] <= 1 for r in recs) and summary["clip_frac"] is not None
        return
    assert all(r["clip_frac"] is None for r in recs) and summary["clip_frac"] is None
    card = label_card([{"algo": algo, "records": recs}])
    assert card["clip_frac"].text("clip_frac") == NOT_APPLICABLE


def test_definitions_are_the_cards():
    for key in ("zero_adv_frac", "clip_frac_active", "decision_dev_q50", "decision_dev_q90", "decision_frac",
                "decision_clip_frac", "decision_clip_up_frac", "lowclip_pold_median",
                "lowclip_pold_lt02", "trunc_frac", "updates_per_batch", "on_policy_frac", "staleness"):
        assert DEFINITIONS[key] is STEP_METRICS[key]


SMALL = {"n_prompts": 16, "batch_prompts": 4, "group_size": 4, "eval_every": 100}


def test_staleness_and_updates_per_batch_count_optimiser_updates():
    """Rollouts two steps old, 1 epoch of 2 minibatches: the sampler is 0, 2, 4, 4 updates behind the batch's first
    update; only step 0's first update is on-policy."""
    recs, = run_stack("feature_lm", "grpo", [0], 4, {**SMALL, "staleness": 2, "epochs": 1, "minibatches": 2})
    assert [r["staleness"] for r in recs] == [0, 2, 4, 4]
    assert [r["updates_per_batch"] for r in recs] == [2] * 4
    assert 0 < recs[0]["on_policy_frac"] < 1 and [r["on_policy_frac"] for r in recs[1:]] == [0.0] * 3


def test_on_policy_updates_have_ratio_one():
    """Staleness 0, one minibatch: the first of two epochs trains on-policy (half the token updates); with one
    epoch every update is on-policy, so every ratio is exactly 1 and nothing clips."""
    two, = run_stack("feature_lm", "grpo", [1], 2, {**SMALL, "staleness": 0, "epochs": 2, "minibatches": 1})
    assert [r["on_policy_frac"] for r in two] == [0.5, 0.5] and [r["updates_per_batch"] for r in two] == [2, 2]
    one, = run_stack("feature_lm", "grpo", [1], 2, {**SMALL, "staleness": 0, "epochs": 1, "minibatches": 1})
    for r in one:
        assert r["on_policy_frac"] == 1.0 and r["staleness"] == 0
        assert r["decision_dev_q50"] == 0.0 and r["decision_dev_q90"] == 0.0 and r["clip_frac"] == 0.0


def test_trunc_frac_is_cispos_only():
    """CISPO's weight capped at 1.01 (eps_high 0.01) on stale rollouts truncates some tokens; GRPO has none."""
    over = {**SMALL, "staleness": 1, "minibatches": 2, "lr": 0.3, "eps_high": 0.01}
    cispo, = run_stack("feature_lm", "cispo", [0], 3, over)
    grpo, = run_stack("feature_lm", "grpo", [0], 3, over)
    assert all(isinstance(r["trunc_frac"], float) for r in cispo) and cispo[-1]["trunc_frac"] > 0
    assert all(r["trunc_frac"] is None for r in grpo)


@pytest.mark.parametrize("explore,exploring", [("exploration", True), ("sharpening", False)])
def test_explore_presets_place_the_up_clipped_tokens(explore, exploring):
    """GRPO over the card's early window (100 steps), two seeds in two draws stacked: the card's upclip_pold_lt02
    (each seed's mean over its steps, then over seeds) is at least 0.5 under "exploration" and below 0.5 under
    "sharpening" (measured about 0.75 and 0.2 on these seeds); about 3 CPU-s each."""
    seeds = [305, 310]
    recs = run_stack("feature_lm", "grpo", seeds, 100, {"explore": explore, "eval_every": 1000}, draws=[61, 62])
    entry = ENTRIES["upclip_pold_lt02"]
    share = np.mean([reduce_values(entry, {r["step"]: r["upclip_pold_lt02"] for r in rs}) for rs in recs])
    assert (share >= 0.5) == exploring
