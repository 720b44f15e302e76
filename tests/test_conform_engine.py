"""The conformance engine on user callables: verdicts, shrinking, what a target matches, reports, bad input."""
import json
import textwrap

import numpy as np
import pytest
import torch
from conftest import importable_module

from harness.conform.engine import (check_records, conform, conform_command, markdown, shrink, strict_json,
                                     verdict)
from harness.conform.cases import (EXTREME_LOG_RATIOS, TOLERANCE, Batch, at_ties, batch_of, far_ref,
                                   rollout_batch)
from harness.conform.targets import BUILTIN, load_target
from harness.conform.targets import reference as ref

MODULE = textwrap.dedent('''
    import torch

    def token_mean_dapo(log_prob, old_log_prob, advantages, response_mask):
        """DAPO's clip (0.2 / 0.28) averaged over all tokens of the batch, as the libraries do."""
        r = torch.exp(log_prob - old_log_prob)
        loss = -torch.min(r * advantages, torch.clamp(r, 0.8, 1.28) * advantages)
        return (loss * response_mask).sum() / response_mask.sum().clamp(min=1)

    def paper_grpo(logp, old_logp, adv, mask):
        """GRPO without KL: per-sequence token means, averaged over non-empty sequences."""
        r = torch.exp(logp - old_logp)
        loss = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv) * mask
        lens = mask.sum(1)
        keep = lens > 0
        return (loss.sum(1)[keep] / lens[keep]).mean() if keep.any() else loss.sum() * 0

    def as_tuple(logp, old_logp, adv, mask):
        return (paper_grpo(logp, old_logp, adv, mask), {"metric": 1.0})

    def clamped_grpo(logp, old_logp, adv, mask):
        """paper_grpo with the log-ratio clamped at +-20 before the exponential, as several libraries do."""
        log_r = torch.clamp(logp - old_logp, -20.0, 20.0)
        return paper_grpo(old_logp + log_r, old_logp, adv, mask)

    def float32_ratio_grpo(logp, old_logp, adv, mask):
        """paper_grpo with the ratio rounded to float32 (the clip then decides exact ties by that rounding)."""
        r = torch.exp((logp - old_logp).float()).double()
        loss = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv) * mask
        lens = mask.sum(1)
        keep = lens > 0
        return (loss.sum(1)[keep] / lens[keep]).mean() if keep.any() else loss.sum() * 0

    def raises_past_20(logp, old_logp, adv, mask):
        if ((logp - old_logp).abs() * mask).max() > 20:
            raise ZeroDivisionError("log-ratio too far")
        return paper_grpo(logp, old_logp, adv, mask)

    def two_args(x, y):
        return x

    def returns_text(logp, old_logp, adv, mask):
        return "loss"

    NOT_CALLABLE = 3
''')


@pytest.fixture(scope="module", autouse=True)
def user_module(tmp_path_factory):
    with importable_module(tmp_path_factory.mktemp("usercode"), "cliplab_user_losses", MODULE):
        yield


def test_a_paper_grpo_callable_agrees_and_a_tuple_is_unpacked():
    for name in ("paper_grpo", "as_tuple"):
        report = conform(f"cliplab_user_losses:{name}", seeds=8, adapter="algorithm=grpo,beta=0")
        assert {r["kind"] for r in report["rows"]} == {"agrees"}
        assert {r["family"] for r in report["rows"]} == {"typical", "extreme", "ties"}
        assert all(r["loss_diff"] <= TOLERANCE and r["grad_diff"] <= TOLERANCE for r in report["rows"])


def test_a_token_mean_dapo_is_found_to_match_token_mean_not_eq_8():
    report = conform("cliplab_user_losses:token_mean_dapo", seeds=6, adapter="algorithm=dapo")
    typical = next(r for r in report["rows"] if r["family"] == "typical")
    assert typical["kind"] == "differs" and typical["reference"] == "dapo"
    assert "dapo[agg=token_mean]" in typical["matches"]
    assert [f["name"] for f in typical["findings"]] == ["matches dapo[agg=token_mean]"]
    assert "is agg=token_mean (adapter agg=token_mean)" in typical["note"]  # the way out, not only a group size
    minimal = typical["findings"][0]["minimal_input"]
    # token_mean and group_token_mean differ only with two groups whose token counts differ: at least 2 rows and
    # 3 tokens, and the shrinker gets there
    assert minimal["rows"] == 2 and minimal["tokens"] == 3
    assert abs(minimal["reference_exact"] - minimal["reference"]) < 1e-12
    assert abs(minimal["target"] - minimal["reference"]) > TOLERANCE


def test_without_a_claimed_algorithm_the_engine_names_what_the_callable_computes():
    report = conform("cliplab_user_losses:token_mean_dapo", seeds=3)
    assert all(r["kind"] == "no reference" for r in report["rows"])
    assert all("dapo[agg=token_mean]" in r["matches"] for r in report["rows"])


def test_shrink_keeps_the_difference_and_only_removes():
    target = load_target("cliplab_user_losses:token_mean_dapo", "algorithm=dapo")
    check = target.checks()[0]
    batch = next(b for b in (batch_of(s, "typical") for s in range(50))
                 if abs(check.run(b)[0] - check.reference.fn(b)[0]) > 1e-3)
    small = shrink(check, batch, check.reference)
    assert small.mask.sum() <= batch.mask.sum() and len(small.mask) <= len(batch.mask)
    assert abs(check.run(small)[0] - check.reference.fn(small)[0]) > TOLERANCE


def test_conform_command_writes_markdown_and_json(tmp_path, capsys):
    report = conform_command("cliplab_user_losses:token_mean_dapo", json_out=True, out=tmp_path, seeds=4,
                             adapter="algorithm=dapo")
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"] == json.loads(json.dumps(strict_json(report["rows"])))
    md = (tmp_path / "cliplab_user_losses_token_mean_dapo.md").read_text()
    assert "matches dapo[agg=token_mean]" in md and "Minimal input" in md
    assert json.loads((tmp_path / "cliplab_user_losses_token_mean_dapo.json").read_text())["target"] == \
        report["target"]
    assert markdown(report) == md


@pytest.mark.parametrize("target, adapter, words", [
    ("no_such_module_xyz:f", None, "cannot import module 'no_such_module_xyz'"),
    ("cliplab_user_losses:missing", None, "has no callable 'missing'"),
    ("cliplab_user_losses:NOT_CALLABLE", None, "has no callable 'NOT_CALLABLE'"),
    ("cliplab_user_losses:two_args", None, "wrong signature two_args(x, y)"),
    ("cliplab_user_losses:returns_text", None, "expected a callable f(logp, old_logp, adv, mask"),
    ("cliplab_user_losses:paper_grpo", "algorithm=grpo,agg=token_sum", "unknown aggregation mode 'token_sum'"),
    ("cliplab_user_losses:paper_grpo", "algorithm=nope", "unknown algorithm 'nope'"),
    ("cliplab_user_losses:paper_grpo", "logp=log_prob", "has no parameter 'log_prob'"),
    ("cliplab_user_losses:paper_grpo", "colour=red", "unknown key 'colour'"),
    ("cliplab_user_losses:paper_grpo", "eps_high=0.28", "need algorithm=NAME"),
    ("cliplab_user_losses:paper_grpo", "algorithm=grpo,eps_low=-1", "eps_low: expected a number >= 0"),
    ("megatron", None, f"unknown target 'megatron'; expected one of {', '.join(BUILTIN)}, or module:function"),
    ("", None, f"expected one of {', '.join(BUILTIN)} or module:function"),
    ("verlx", None, "unknown target 'verlx' (did you mean 'verl'?)"),
    ("cliplab_user_losses:paper_grpo", "algorithm=grpoo", "unknown algorithm 'grpoo' (did you mean 'grpo'?)"),
    ("cliplab_user_losses:paper_grpo", "algorithm=grpo,eps_hihg=0.28", "unknown key 'eps_hihg' (did you mean "
                                                                       "'eps_high'?)"),
    ("verl", "algorithm=grpo", "only a module:function target takes an adapter"),
])
def test_bad_input_names_what_was_expected(target, adapter, words):
    with pytest.raises(ValueError) as err:
        load_target(target, adapter)
    assert words in str(err.value)


@pytest.mark.parametrize("seeds", [0, -3, 2.5, True])
def test_a_bad_seed_count_is_refused(seeds):
    with pytest.raises(ValueError, match="seeds: expected a positive integer"):
        conform_command("cliplab_user_losses:paper_grpo", seeds=seeds)


def test_reference_rows_counted_variant_differs_only_with_empty_rows():
    b = Batch(np.array([[-1.0], [-1.0]]), np.array([[-1.2], [-1.0]]), np.array([[1.0], [1.0]]),
              np.array([[1.0], [0.0]]), np.zeros((2, 1)), 1)
    full = ref.policy_value("grpo", {"beta": 0.0}, b)[0]
    counted = ref.policy_value("grpo", {"beta": 0.0}, b, rows_counted=True)[0]
    assert counted == pytest.approx(full / 2)


def test_minimal_input_shows_the_batch_extras():
    b = Batch(np.array([[-1.0]]), np.array([[-1.5]]), np.array([[1.0]]), np.array([[1.0]]), np.zeros((1, 1)), 1,
              {"rollout_logp": np.array([[-2.5]]), "ids": np.array([[7]])})
    out = b.to_json()
    assert out["rollout_logp"] == [[-2.5]] and out["ids"] == [[7]] and isinstance(out["ids"][0][0], int)
    assert json.loads(json.dumps(out))["old_logp"] == [[-1.5]]


def test_a_clamp_is_a_named_finding_with_its_minimal_input():
    report = conform("cliplab_user_losses:clamped_grpo", seeds=10, adapter="algorithm=grpo,beta=0")
    rows = {r["family"]: r for r in report["rows"]}
    assert rows["typical"]["kind"] == "agrees" and rows["ties"]["kind"] == "agrees"  # |log r| < 20 there
    extreme = rows["extreme"]
    assert extreme["kind"] == "differs"
    assert [f["name"] for f in extreme["findings"]] == ["clamps the log-ratio at +-20 (value frozen, gradient 0 "
                                                         "beyond)"]
    m = extreme["findings"][0]["minimal_input"]
    log_r = np.array(m["input"]["logp"]) - np.array(m["input"]["old_logp"])
    on = np.array(m["input"]["mask"]) > 0
    assert m["tokens"] == 1 and abs(log_r[on][0]) > 20  # one token past the clamp shows it
    assert abs(m["target"] - m["reference"]) > TOLERANCE * max(1.0, abs(m["reference"]))


def test_a_float32_ratio_agrees_at_exact_ties_with_its_tie_break_named():
    report = conform("cliplab_user_losses:float32_ratio_grpo", seeds=8, adapter="algorithm=grpo,beta=0")
    rows = {r["family"]: r for r in report["rows"]}
    assert rows["typical"]["kind"] == rows["ties"]["kind"] == "agrees"
    # float32(1.2) > 1.2 and float32(0.8) > 0.8: at r = 1.2 with A > 0 the float32 ratio is clipped (gradient 0)
    # where the reference's unclipped branch keeps -A * r / n: the other one-sided limit, a tie-break convention
    assert rows["ties"]["grad_diff"] <= TOLERANCE
    assert "takes the other branch" in rows["ties"]["tie_break"] and "tie-break" in verdict(rows["ties"])


def test_a_target_that_raises_is_a_finding_never_dropped():
    seeds = 12
    report = conform("cliplab_user_losses:raises_past_20", seeds=seeds, adapter="algorithm=grpo,beta=0")
    check = load_target("cliplab_user_losses:raises_past_20", "algorithm=grpo,beta=0").checks()[0]
    rows = {r["family"]: r for r in report["rows"]}
    assert rows["typical"]["kind"] == "agrees"
    far = [s for s in range(seeds) if (np.abs(check.batch(s, "extreme").logp - check.batch(s, "extreme").old_logp)
                                       * check.batch(s, "extreme").mask).max() > 20]
    extreme = rows["extreme"]
    assert far and extreme["kind"] == "raises" and extreme["cases"] == seeds - len(far)
    (raised,) = [f for f in extreme["findings"] if f["name"].startswith("raises")]
    assert raised["name"].startswith("raises ZeroDivisionError: log-ratio too far (at cliplab_user_losses.py:")
    assert raised["name"].endswith(f" on {len(far)} of {seeds} cases") and raised["max_err"] is None
    assert raised["minimal_input"]["tokens"] == 1 and "ZeroDivisionError" in raised["minimal_input"]["error"]


def test_check_records_merge_families_and_keep_every_distinct_finding():
    report = conform("cliplab_user_losses:clamped_grpo", seeds=10, adapter="algorithm=grpo,beta=0")
    (record,) = check_records(report)
    assert record["kind"] == "differs"
    assert [(f["name"].split(" (")[0], f["families"]) for f in record["findings"]] == \
        [("clamps the log-ratio at +-20", ["extreme"])]
    assert set(record["findings"][0]) >= {"name", "max_err", "minimal_input"}


def test_extreme_batches_reach_past_every_clamp_within_rows():
    seen, mixed = set(), False
    for seed in range(30):
        b = batch_of(seed, "extreme")
        far = np.abs(b.logp - b.old_logp) * (b.mask > 0)
        seen |= set(np.round(far[far >= 20], 6))
        mixed |= any(len(set(np.round(row[row >= 20], 6))) > 1 for row in far)
    assert seen == set(EXTREME_LOG_RATIOS) and mixed


def test_ties_are_exact_in_float64():
    hp_ties = ref.policy_ties("ppo", {"dual_clip": 3.0, "rollout_correction": "mis"})
    assert hp_ties == {"ratio": (0.8, 1.2, 3.0), "rollout": (0.5, 5.0)}
    b = at_ties(rollout_batch(3, "typical"), hp_ties, 3)
    ratio = torch.exp(torch.from_numpy(b.logp - b.old_logp)).numpy()
    rho = torch.exp(torch.from_numpy(b.old_logp - b.extra["rollout_logp"])).numpy()
    on = b.mask > 0
    assert np.isin(ratio[on], hp_ties["ratio"]).sum() >= on.sum() // 4
    assert np.isin(rho[on], hp_ties["rollout"]).sum() >= on.sum() // 4


def test_far_ref_and_ties_families_go_where_they_mean_something():
    from harness.conform.cases import Check
    fam = lambda conv: Check("x", "f", "k", None, conv).families  # noqa: E731
    assert fam(ref.policy("grpo")) == ("typical", "extreme", "far_ref", "ties")  # beta 0.04, clip bounds
    assert fam(ref.policy("sapo")) == ("typical", "extreme")  # beta 0, a smooth gate
    assert fam(ref.kl("k3")) == ("typical", "extreme", "far_ref")
    b = far_ref(batch_of(4, "typical"), 4)
    moved = np.abs(b.ref_logp - batch_of(4, "typical").ref_logp)
    assert set(np.round(moved[moved > 0], 6)) <= {5.0, 12.0, 25.0, 30.0} and (moved > 0).any()


def test_dcpo_ties_sit_exactly_on_the_bounds_of_each_tokens_q():
    import gpu
    ties = ref.policy_ties("dcpo", {})
    assert ties == {"dcpo": (0.16, 0.2, 10.0)}
    b = at_ties(batch_of(5, "typical"), ties, 5)
    lo, hi = gpu.dcpo_bounds(torch.from_numpy(np.exp(b.old_logp)), *ties["dcpo"])
    ratio = torch.exp(torch.from_numpy(b.logp - b.old_logp))
    on = torch.from_numpy(b.mask > 0)
    at_bound = ((ratio == lo) | (ratio == hi)) & on
    assert int(at_bound.sum()) >= int(on.sum()) // 4
