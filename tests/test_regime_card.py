"""The regime card (spec/regime.py, harness/reports/regime.py): its windows and reductions on hand-worked runs,
"n/a" for clip statistics an algorithm cannot have, and claim conditions that name the value that fails them."""
import pytest

from harness.reports.claim_record import Kind, card_gap, checks_on, finding, regime_checked
from harness.reports.regime import card_lines, run_set_card
from spec.regime import CARD, CLIP_BINDS, ENTRIES, WELL_FORMED, Condition, STEP_METRICS, reduce_values, window_steps


def _run(label, algo, **curves):
    steps = len(next(iter(curves.values())))
    return {"label": label, "algo": algo,
            "records": [{"step": s, **{k: v[s] for k, v in curves.items()}} for s in range(steps)]}


def test_every_card_entry_reads_a_step_metric_every_layer_logs():
    assert {e.metric for e in CARD} <= set(STEP_METRICS)
    assert len(ENTRIES) == len(CARD)


def test_windows_are_the_first_and_last_tenth_and_the_first_100_steps():
    steps = list(range(1, 251))
    assert window_steps(steps, "start") == list(range(1, 26))
    assert window_steps(steps, "end") == list(range(226, 251))
    assert window_steps(steps, "early") == list(range(1, 101))
    assert window_steps([3], "start") == [3]  # at least one step


def test_reductions_by_hand():
    # 20 steps: accuracy 0.0, 0.05, ..., 0.95; start = steps 0-1 (mean 0.025), end = steps 18-19 (mean 0.925)
    acc = {s: s / 20 for s in range(20)}
    assert reduce_values(ENTRIES["accuracy_start"], acc) == pytest.approx(0.025)
    assert reduce_values(ENTRIES["headroom"], acc) == pytest.approx(1 - 0.925)
    # entropy 2.0 for the first two steps, 0.5 for the last two: fall = 1 - 0.5 / 2 = 0.75
    ent = {s: 2.0 if s < 2 else (0.5 if s >= 18 else 1.0) for s in range(20)}
    assert reduce_values(ENTRIES["entropy_fall"], ent) == pytest.approx(0.75)
    assert reduce_values(ENTRIES["malformed_max"], {0: 0.01, 1: 0.04, 2: None}) == 0.025  # fewer than 10 steps
    spikes = {s: (0.04 if s in (3, 15) else 0.01) for s in range(30)}  # one 4-in-128 step is not a collapse
    assert reduce_values(ENTRIES["malformed_max"], spikes) == pytest.approx(0.013)
    assert reduce_values(ENTRIES["malformed_max"], {**spikes, 20: 0.1, 21: 0.1}) == pytest.approx(0.031)
    assert reduce_values(ENTRIES["clip_frac"], {0: None}) is None


def test_card_averages_seeds_and_marks_clips_an_algorithm_cannot_have():
    runs = [_run("grpo", "grpo", clip_frac=[0.01] * 10, accuracy=[0.3] * 10),
            _run("grpo", "grpo", clip_frac=[0.03] * 10, accuracy=[0.5] * 10),
            _run("sapo", "sapo", clip_frac=[0.0] * 10, accuracy=[0.4] * 10)]
    cards = run_set_card(runs)
    assert cards["grpo"]["clip_frac"].value == pytest.approx(0.02)
    assert cards["grpo"]["clip_frac"].seeds == 2
    assert cards["grpo"]["accuracy_start"].value == pytest.approx(0.4)
    sapo = cards["sapo"]["clip_frac"]
    assert not sapo.applicable and sapo.text("clip_frac") == "n/a"  # a soft gate: not "0"
    assert all(cards["sapo"][e].text(e) == "n/a" for e in ("decision_clip_frac", "decision_clip_up_frac"))
    assert cards["grpo"]["trunc_frac"].text("trunc_frac") == "n/a"
    assert cards["grpo"]["malformed_max"].text("malformed_max") == "not logged"
    table = "\n".join(card_lines(cards))
    assert "| clip_frac | 2% | n/a |" in table and "Not logged by these runs:" in table


def _checks(cards, label, *conditions):
    return checks_on(cards[label], label, conditions)


def test_a_claim_whose_card_fails_a_condition_is_not_testable_naming_the_value():
    runs = [_run("grpo", "grpo", clip_frac=[1e-5] * 10, malformed=[0.01] * 10),
            _run("dapo", "dapo", clip_frac=[0.01] * 10, malformed=[0.2] * 10),
            _run("sapo", "sapo", clip_frac=[0.0] * 10, malformed=[0.0] * 10)]
    cards = run_set_card(runs)
    got = regime_checked(finding("r", Kind.REPRODUCED, "x", conditions=_checks(cards, "grpo", CLIP_BINDS, WELL_FORMED)))
    assert got.kind == Kind.NOT_TESTABLE and got.reason == "grpo's clip_frac is 1e-05; the claim needs clip_frac >= 0.0001"
    got = regime_checked(finding("r", Kind.REVERSED, "x", conditions=_checks(cards, "dapo", CLIP_BINDS, WELL_FORMED)))
    assert got.kind == Kind.NOT_TESTABLE and got.reason == "dapo's malformed_max is 0.2; the claim needs malformed_max <= 0.03"
    # a value that rounds to the threshold reads with the digits that show it fails
    nearly = _run("grpo", "grpo", clip_frac=[0.0099996] * 10, malformed=[0.0300004] * 10)
    cards = {**cards, **run_set_card([nearly])}
    got = regime_checked(finding("r", Kind.REPRODUCED, "x", conditions=_checks(cards, "grpo", WELL_FORMED)))
    assert got.reason == "grpo's malformed_max is 0.0300004; the claim needs malformed_max <= 0.03"
    # SAPO has no hard clip: its "n/a" clip share neither passes nor fails the condition
    assert regime_checked(finding("r", Kind.REPRODUCED, "x", conditions=_checks(cards, "sapo", CLIP_BINDS))).kind \
        == Kind.REPRODUCED


def test_a_condition_on_an_unknown_entry_is_refused():
    with pytest.raises(ValueError, match="entry: expected one of"):
        Condition("clip_fraction", ">=", 0.1, "x")


def test_two_tiers_records_match_only_where_their_condition_entries_lie_within_tolerance():
    runs = [_run("tier", "grpo", clip_frac=[0.004] * 10, accuracy=[0.3] * 10),
            _run("sim", "grpo", clip_frac=[0.012] * 10, accuracy=[0.35] * 10),
            _run("close", "grpo", clip_frac=[0.006] * 10, accuracy=[0.25] * 10)]
    cards = run_set_card(runs)
    headroom = Condition("headroom", ">=", 0.1, "x")
    rec = {lbl: finding("r", Kind.REPRODUCED, "x", conditions=_checks(cards, lbl, CLIP_BINDS, headroom))
           for lbl in cards}
    assert card_gap(rec["tier"], rec["sim"]) == "regime cards differ: clip_frac 0.004 vs 0.012"  # 3x: beyond 2x
    assert card_gap(rec["tier"], rec["close"]) is None  # 1.5x and 0.05 apart: within
    bare = finding("r", Kind.REPRODUCED, "x")
    assert card_gap(bare, bare) is None  # a claim that needs no particular regime
    assert card_gap(rec["tier"], finding("r", Kind.REPRODUCED, "x", conditions=_checks(cards, "sim", WELL_FORMED))) \
        == "no regime card entry measured in both"


def test_environments_compare_the_clip_ratios_per_decision_token_where_both_measured_them():
    """The tier's responses are mostly tokens that cannot move, the simulator's are not: 30x apart per token, the
    clip ratios match per decision token, and the cards are compared there; a record without them (a cluster log)
    is compared per token."""
    runs = [_run("tier", "grpo", clip_frac=[0.003] * 10, decision_clip_frac=[0.15] * 10),
            _run("sim", "grpo", clip_frac=[0.09] * 10, decision_clip_frac=[0.2] * 10),
            _run("log", "grpo", clip_frac=[0.09] * 10)]
    cards = run_set_card(runs)
    rec = {lbl: finding("r", Kind.REPRODUCED, "x", conditions=_checks(cards, lbl, CLIP_BINDS)) for lbl in cards}
    assert rec["tier"].conditions[0].across_value == pytest.approx(0.15)
    assert card_gap(rec["tier"], rec["sim"]) is None
    assert card_gap(rec["tier"], rec["log"]) == "regime cards differ: clip_frac 0.003 vs 0.09"
    far = _run("far", "grpo", clip_frac=[0.003] * 10, decision_clip_frac=[0.6] * 10)
    far_rec = finding("r", Kind.REPRODUCED, "x", conditions=_checks(run_set_card([far]), "far", CLIP_BINDS))
    assert card_gap(rec["tier"], far_rec) == "regime cards differ: decision_clip_frac 0.15 vs 0.6"
