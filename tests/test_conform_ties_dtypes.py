"""No false "differs" on correct code: at a float tie on a clip bound either one-sided gradient (or torch.min's
half split) agrees, and a loss computed in float32 is held to float32's tolerance; a wrong loss still fails."""
import itertools

import numpy as np
import pytest
import torch

from harness.conform.cases import ROUNDINGS, TIE_STEP, TOLERANCE, at_ties, batch_of, tie_sides, tolerance_of
from harness.conform.engine import _diff, _expect, conform, conform_command, target_of
from harness.conform.targets import reference as ref

EPS_LOW, EPS_HIGH = 3e-4, 4e-4


def _seq_log_ratio(logp, old_logp, mask):
    return ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _mean_over_live_rows(per_row, mask):
    live = mask.sum(-1) > 0
    return per_row[live].mean() if live.any() else per_row.sum() * 0


def gspo_trl_style(logp, old_logp, adv, mask):
    """As TRL writes GSPO: one sequence weight per row broadcast over its tokens, torch.min of the two
    surrogates, per-sequence token means averaged over the rows that have tokens."""
    coef_1 = torch.exp(_seq_log_ratio(logp, old_logp, mask)).unsqueeze(-1)
    coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
    per_token = -torch.min(coef_1 * adv.unsqueeze(-1), coef_2 * adv.unsqueeze(-1)).expand_as(mask)
    return _mean_over_live_rows((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1), mask)


def gspo_verl_style(logp, old_logp, adv, mask):
    """As verl writes GSPO (GSPO-token's form): s_it = exp(logp - sg(logp) + sg(seq log-ratio)), torch.maximum
    of the two losses, seq-mean-token-mean."""
    seq = _seq_log_ratio(logp, old_logp, mask).detach().unsqueeze(-1)
    s = torch.exp(logp - logp.detach() + seq)
    a = adv.unsqueeze(-1)
    losses = torch.maximum(-a * s, -a * torch.clamp(s, 1 - EPS_LOW, 1 + EPS_HIGH))
    return _mean_over_live_rows((losses * mask).sum(-1) / mask.sum(-1).clamp(min=1), mask)


def gspo_plain_where(logp, old_logp, adv, mask):
    """GSPO with torch.where picking the smaller surrogate."""
    s = torch.exp(_seq_log_ratio(logp, old_logp, mask))
    low, high = s * adv, torch.clamp(s, 1 - EPS_LOW, 1 + EPS_HIGH) * adv
    return -_mean_over_live_rows(torch.where(low <= high, low, high), mask)


def gspo_plain_clamp_min(logp, old_logp, adv, mask):
    """GSPO with the clip as min/max against the bound picked by the advantage's sign."""
    s = torch.exp(_seq_log_ratio(logp, old_logp, mask))
    clipped = torch.where(adv > 0, torch.clamp(s, max=1 + EPS_HIGH), torch.clamp(s, min=1 - EPS_LOW))
    return -_mean_over_live_rows(torch.minimum(s * adv, clipped * adv), mask)


def gspo_length_weighted(logp, old_logp, adv, mask):
    """Wrong: the summed log-ratio (no 1/|o_i|) as the sequence's."""
    s = torch.exp(((logp - old_logp) * mask).sum(-1))
    surrogate = torch.min(s * adv, torch.clamp(s, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
    return -_mean_over_live_rows(surrogate, mask)


def grpo_trl_style(logp, old_logp, adv, mask):
    """As TRL writes GRPO (beta 0), empty rows left out of the mean."""
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 0.8, 1.2)
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    return _mean_over_live_rows((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1), mask)


def grpo_verl_style(logp, old_logp, adv, mask):
    """As verl writes the clip (without its dual clip): torch.maximum of the two losses."""
    ratio = torch.exp(logp - old_logp)
    losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))
    return _mean_over_live_rows((losses * mask).sum(-1) / mask.sum(-1).clamp(min=1), mask)


def grpo_plain_where(logp, old_logp, adv, mask):
    """The clipped branch chosen by comparing the ratio with the bounds."""
    r = torch.exp(logp - old_logp)
    clipped = ((adv > 0) & (r >= 1.2)) | ((adv < 0) & (r <= 0.8))
    per_token = -torch.where(clipped, torch.clamp(r, 0.8, 1.2) * adv, r * adv)
    return _mean_over_live_rows((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1), mask)


def grpo_token_mean(logp, old_logp, adv, mask):
    """Wrong for GRPO: the batch's token mean."""
    r = torch.exp(logp - old_logp)
    per_token = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def grpo_float32(logp, old_logp, adv, mask):
    """GRPO computed in float32; the log-ratio capped where float32's exponential overflows (88.7)."""
    logp, old_logp, adv, mask = (x.float() for x in (logp, old_logp, adv, mask))
    r = torch.exp(torch.clamp(logp - old_logp, max=88.0))
    per_token = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv)
    return _mean_over_live_rows((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1), mask)


def grpo_float32_token_mean(logp, old_logp, adv, mask):
    """Wrong for GRPO, in float32: the batch's token mean."""
    return grpo_token_mean(*(x.float() for x in (logp, old_logp, adv, mask)))


def grpo_bfloat16_nan(logp, old_logp, adv, mask):
    """Wrong in bfloat16: 0 / 0 on a row without tokens."""
    logp, old_logp, adv, mask = (x.bfloat16() for x in (logp, old_logp, adv, mask))
    r = torch.exp(torch.clamp(logp - old_logp, max=88.0))
    per_token = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv)
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


GSPO = "algorithm=gspo,adv_shape=seq"
GRPO = "algorithm=grpo,beta=0"


def _rows(fn, adapter, seeds=6):
    return {r["family"]: r for r in conform(fn, seeds=seeds, adapter=adapter)["rows"]}


@pytest.mark.parametrize("fn,adapter", [
    (gspo_trl_style, GSPO), (gspo_verl_style, GSPO), (gspo_plain_where, GSPO), (gspo_plain_clamp_min, GSPO),
    (grpo_trl_style, GRPO), (grpo_verl_style, GRPO), (grpo_plain_where, GRPO)])
def test_a_correct_loss_in_each_style_agrees_at_exact_ties(fn, adapter):
    rows = _rows(fn, adapter)
    assert {r["kind"] for r in rows.values()} == {"agrees"}, {f: r["findings"] for f, r in rows.items()}
    assert rows["ties"]["cases"] >= 2


def test_at_a_tie_either_one_sided_gradient_or_the_half_split_agrees_and_nothing_else():
    check = target_of(grpo_trl_style, GRPO).checks()[0]
    b = at_ties(batch_of(4, "typical"), check.reference.ties, 4)
    (value, grad), band = _expect(check, check.reference, b)
    ties = band[0][1] != band[1][1]  # where the branches' gradients differ: A > 0 at 1.2, A < 0 at 0.8
    sides, at = tie_sides(check.reference.ties, b, TOLERANCE)
    assert ties.any() and not (ties & ~at).any() and np.array_equal(at, sides[0].logp != b.logp)
    for pick in (band[0][1], band[1][1], (band[0][1] + band[1][1]) / 2):  # either branch, or torch.min's split
        assert max(_diff((value, np.where(ties, pick, grad)), (value, grad), band)) <= TOLERANCE
        assert max(_diff((value, np.where(ties, pick, grad)), (value, grad))) > TOLERANCE or np.array_equal(
            np.where(ties, pick, grad), grad)  # the reference's own choice is one of them
    wrong = np.where(ties, 2 * band[1][1] - band[0][1] + 1.0, grad)
    assert max(_diff((value, wrong), (value, grad), band)) > TOLERANCE
    assert max(_diff((value + 0.1, grad), (value, grad), band)) > TOLERANCE  # the value is continuous at a tie


def test_wrong_losses_still_differ_at_ties_and_elsewhere():
    rows = _rows(gspo_length_weighted, GSPO)
    assert rows["typical"]["kind"] == "differs" and rows["ties"]["kind"] == "differs"
    rows = _rows(grpo_token_mean, GRPO)
    assert rows["typical"]["kind"] == "differs" and rows["ties"]["kind"] == "differs"
    assert rows["typical"]["findings"][0]["name"] == "matches grpo[agg=token_mean, beta=0]"


def test_the_sides_of_a_tie_sit_just_inside_and_just_outside_its_bound_and_nowhere_else():
    conv = ref.policy("grpo", beta=0.0)
    b = at_ties(batch_of(4, "typical"), conv.ties, 4)
    (inside, outside), at = tie_sides(conv.ties, b, TOLERANCE)
    bound = np.where(np.exp(b.logp - b.old_logp) < 1, 0.8, 1.2)
    assert at.any() and np.allclose(np.exp(b.logp - b.old_logp)[at], bound[at], rtol=1e-12, atol=0)
    for side, way in ((inside, 1), (outside, -1)):  # towards r = 1, then away from it
        moved = side.logp - side.old_logp - np.log(bound)
        assert np.allclose(moved[at], way * TIE_STEP * -np.sign(np.log(bound[at])), rtol=1e-3, atol=0)
        assert np.array_equal(side.logp[~at], b.logp[~at])
    assert tie_sides(conv.ties, batch_of(4, "typical"), TOLERANCE)[0] == []  # no token at a bound: no band


def test_tolerances_per_dtype_follow_the_epsilon():
    import torch
    assert tolerance_of("float64") == TOLERANCE
    assert tolerance_of("float32") == ROUNDINGS * torch.finfo(torch.float32).eps
    assert tolerance_of("bfloat16") == ROUNDINGS * torch.finfo(torch.bfloat16).eps
    with pytest.raises(ValueError, match="dtype"):
        tolerance_of("int8")


def test_a_float32_loss_agrees_within_float32s_tolerance_and_a_wrong_one_differs():
    # at the ties float32's rounding picks a branch or, where r * A and clamp(r) * A round to one value, torch.min
    # halves the gradient; exp(100) has no float32 value: those cases are not compared
    rows = _rows(grpo_float32, GRPO)
    assert {r["kind"] for r in rows.values()} == {"agrees"}, {f: r["findings"] for f, r in rows.items()}
    assert rows["extreme"]["out_of_range"] >= 1 and rows["ties"]["tie_break"]
    rows = _rows(grpo_float32_token_mean, GRPO)
    assert rows["typical"]["kind"] == "differs"
    assert rows["typical"]["findings"][0]["name"] == "matches grpo[agg=token_mean, beta=0]"


def test_a_bfloat16_loss_is_held_to_finite_results():
    rows = _rows(grpo_bfloat16_nan, GRPO)
    assert rows["typical"]["kind"] == "differs"
    assert any("NaN" in f["name"] for f in rows["typical"]["findings"])


def test_a_finding_names_the_gradient_that_differs_and_its_region():
    rows = _rows(grpo_token_mean, GRPO)
    m = rows["typical"]["findings"][0]["minimal_input"]
    element = m["grad_differs"][0]
    grad, want = np.array(m["target_grad"]), np.array(m["reference_grad"])
    assert grad[element["row"], element["token"]] == pytest.approx(element["target"], abs=1e-12)
    assert want[element["row"], element["token"]] == pytest.approx(element["reference"], abs=1e-12)
    assert "A " in element["region"] and "the reference takes the" in element["region"]


def test_a_module_function_without_algorithm_is_a_usage_error_listing_them():
    from typer.testing import CliRunner

    from harness.cli import app
    with pytest.raises(ValueError, match="algorithm=NAME is required.*grpo.*gspo"):
        conform_command("mypkg.losses:grpo_loss", adapter="beta=0")  # refused before any import
    result = CliRunner().invoke(app, ["conform", "mypkg.losses:grpo_loss"])
    assert result.exit_code == 2 and "algorithm=NAME is required" in result.output, result.output


def test_the_closest_convention_stays_in_the_claimed_algorithms_family():
    from harness.conform.engine import settle
    from harness.conform.targets.reference import FAMILIES
    target = target_of(grpo_trl_style, "algorithm=gspo")
    report = settle(target, conform(target, seeds=3))
    closest = [r["closest"] for r in report["rows"] if r.get("closest")]
    assert closest and all(c.startswith("none close in gspo's family") or c.split("[")[0] in
                           FAMILIES["sequence ratio"] for c in closest), closest


DTYPES = ("float64", "float32", "bfloat16")


def dppo_tv_loss(dtype, masked_at_the_threshold):
    """DPPO-Binary-TV (delta 0.15) in ``dtype``, token mean: the reference keeps a token whose pi - mu equals the
    threshold, the other one-sided convention masks it."""
    def fn(logp, old_logp, adv, mask):
        lp, old, a, m = (x.to(getattr(torch, dtype)) for x in (logp, old_logp, adv, mask))
        moved = torch.exp(lp.detach()) - torch.exp(old)
        if masked_at_the_threshold:
            keep = torch.where(a > 0, moved < 0.15, moved > -0.15)
        else:
            keep = torch.where(a > 0, ~(moved > 0.15), ~(moved < -0.15))
        coef = torch.where(keep & (a != 0), torch.exp(torch.clamp(lp.detach() - old, max=80.0)) * a, 0.0)
        return -(coef * lp * m).sum() / m.sum().clamp(min=1)
    return fn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked_at_the_threshold", [False, True])
def test_dppo_either_side_of_its_threshold_agrees_in_each_dtype(dtype, masked_at_the_threshold):
    rows = _rows(dppo_tv_loss(dtype, masked_at_the_threshold), "algorithm=dppo_tv", seeds=6)
    assert rows["typical"]["kind"] == rows["ties"]["kind"] == "agrees", {f: r["findings"] for f, r in rows.items()}
    assert rows["ties"]["cases"] == 2
    if dtype == "float64":  # the other convention is named as a tie-break, not a difference
        assert bool(rows["ties"].get("tie_break")) == masked_at_the_threshold


def test_dppo_thresholds_are_placed_on_the_divergence_and_a_wrong_mask_still_differs():
    conv = ref.policy("dppo_tv")
    b = at_ties(batch_of(1, "typical"), conv.ties, 1)
    sides, at = tie_sides(conv.ties, b, TOLERANCE)
    moved = np.exp(b.logp) - np.exp(b.old_logp)
    assert at.any() and np.allclose(np.abs(moved[at]), 0.15, rtol=0, atol=1e-12)

    def ratio_clip_mask(logp, old_logp, adv, mask):  # PPO's ratio bounds 0.85 / 1.15 in place of the TV threshold
        r = torch.exp(logp.detach() - old_logp)
        keep = torch.where(adv > 0, r <= 1.15, r >= 0.85)
        return -(torch.where(keep, r * adv, 0.0) * logp * mask).sum() / mask.sum().clamp(min=1)
    assert _rows(ratio_clip_mask, "algorithm=dppo_tv", seeds=3)["typical"]["kind"] == "differs"
    check = target_of(ratio_clip_mask, "algorithm=dppo_tv").checks()[0]  # pi = exp(logp) a probability throughout
    above = False
    for family, seed in itertools.product(check.families, range(6)):
        b, raw = check.batch(seed, family), batch_of(seed, "extreme" if family == "extreme" else "typical")
        assert (b.logp[b.mask > 0] <= 0).all()
        above |= bool((raw.logp[raw.mask > 0] > 0).any())
        if family != "ties":
            np.testing.assert_allclose(b.logp - b.old_logp, raw.logp - raw.old_logp, atol=1e-12)
    assert above


def rejection_run(dtype, statistic, low, high, rejected_at_the_edge, rows_dropped=False):
    """GRPO (beta 0, token mean) with a rejection band on each row's weight (the product of rho, or its geometric
    mean) in ``dtype``: kept on the band's edge (the reference) or rejected there (the other convention);
    ``rows_dropped``: the rejected rows taken out of the token mean's count too (as verl's trainer does)."""
    def run(b):
        t = lambda x: torch.tensor(np.asarray(x, dtype=float), dtype=getattr(torch, dtype))  # noqa: E731
        logp = t(b.logp).requires_grad_(True)
        old, adv, mask, rollout = t(b.old_logp), t(b.adv), t(b.mask), t(b.extra["rollout_logp"])
        log_w = ((old - rollout) * mask).sum(1, keepdim=True)
        if statistic == "geometric_mean":
            log_w = log_w / mask.sum(1, keepdim=True).clamp(min=1)
        w = torch.exp(log_w)
        keep = (w > low) & (w < high) if rejected_at_the_edge else (w >= low) & (w <= high)
        r = torch.exp(logp - old)
        count = (mask * keep).sum() if rows_dropped else mask.sum()
        loss = (-torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv) * keep * mask).sum() / count.clamp(min=1)
        loss.backward()
        return float(loss.detach().double()), logp.grad.double().numpy(), b
    return run


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("correction,low,high", [("seq_rs", 0.5, 2.0), ("geo_rs", 0.8, 1.25)])
def test_a_rejection_band_either_side_of_its_edges_agrees_in_each_dtype(dtype, correction, low, high):
    from harness.conform.cases import Check, rollout_batch
    from harness.conform.engine import run_check
    from spec.registry import ROLLOUT_ROW_STATISTIC
    conv = ref.policy("grpo", beta=0.0, agg="token_mean", rollout_correction=correction, mis_low=low, mis_high=high)
    assert conv.ties["rollout_row"] == (ROLLOUT_ROW_STATISTIC[correction], low, high)
    for edge in (False, True):
        check = Check("grpo", "f", "k", rejection_run(dtype, ROLLOUT_ROW_STATISTIC[correction], low, high, edge),
                      conv, [], rollout_batch, families=("typical", "ties"), dtype=dtype)
        rows = {r["family"]: r for r in run_check(check, seeds=9)}
        assert {r["kind"] for r in rows.values()} == {"agrees"}, {f: r["findings"] for f, r in rows.items()}
        assert rows["ties"]["cases"] == 3
        if dtype == "float64":
            assert bool(rows["ties"].get("tie_break")) == edge
    wrong = Check("grpo", "f", "k", rejection_run(dtype, ROLLOUT_ROW_STATISTIC[correction], low / 2, high, False),
                  conv, [], rollout_batch, families=("typical",), dtype=dtype)
    assert dtype == "bfloat16" or run_check(wrong, seeds=6)[0]["kind"] == "differs"


def in_dtype(fn, dtype):
    """``fn`` computing in ``dtype``: its inputs cast, as a loss written for bf16 or fp32 training receives them."""
    def cast(logp, old_logp, adv, mask):
        return fn(*(x.to(getattr(torch, dtype)) for x in (logp, old_logp, adv, mask)))
    cast.__qualname__ = f"{fn.__name__}_{dtype}"
    return cast


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fn", [gspo_trl_style, gspo_verl_style, gspo_plain_where, gspo_plain_clamp_min])
def test_a_correct_gspo_in_each_style_agrees_in_float32_and_bfloat16(fn, dtype):
    rows = _rows(in_dtype(fn, dtype), GSPO)
    assert {r["kind"] for r in rows.values()} == {"agrees"}, {f: r["findings"] for f, r in rows.items()}
    assert rows["ties"]["cases"] >= 2 and rows["typical"]["tolerance"] == tolerance_of(dtype)


def test_rows_dropped_from_the_mean_at_a_band_edge_are_named_in_every_combination():
    # rejected at the edges: whether a tied row is kept changes every other row's share of the token mean, so only
    # the tied rows' combinations bound it (rows with tokens on the clip bounds are not among them)
    from harness.conform.cases import Check, rollout_batch
    from harness.conform.engine import run_check
    conv = ref.policy("grpo", beta=0.0, agg="token_mean", rollout_correction="seq_rs", mis_low=0.5, mis_high=2.0)
    check = Check("grpo", "f", "k", rejection_run("float64", "product", 0.5, 2.0, True, rows_dropped=True), conv,
                  [], rollout_batch, families=("ties",))
    row = run_check(check, seeds=30)[0]
    assert [f["name"] for f in row["findings"]] == [
        "leaves the rejected rows out of the loss mask (they count in no mean)"], row["findings"]
