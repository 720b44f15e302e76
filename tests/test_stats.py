"""harness.reports.stats against hand-worked values and a simulation of the power it states."""
import numpy as np
import pytest

from harness.reports.stats import detectable_effect, holm, paired_test, t_interval, welch_test


def test_t_interval_by_hand():
    iv = t_interval([1, 2, 3, 4, np.nan])  # the NaN is a missing seed: n counts 4
    # sd = sqrt(5/3), sem = sd / 2, t(0.975, 3) = 3.182446
    assert (iv.mean, iv.n) == (2.5, 4)
    assert iv.half == pytest.approx(3.182446 * np.sqrt(5 / 3) / 2, rel=1e-6)


def test_t_interval_uses_true_degrees_of_freedom_past_ten():
    x = np.arange(12.0)
    iv = t_interval(x)
    sem = x.std(ddof=1) / np.sqrt(12)
    assert iv.half / sem == pytest.approx(2.200985, rel=1e-6)  # t(0.975, 11), not 1.96


def test_paired_by_hand():
    c = paired_test([1, 2, 3], [2, 4, 5])
    # d = [1, 2, 2]: mean 5/3, sem 1/3, t = 5 on 2 df; for 2 df, P(|T| > t) = 1 - t / sqrt(2 + t^2)
    assert (c.kind, c.n_a, c.df) == ("paired", 3, 2)
    assert c.diff == pytest.approx(5 / 3)
    assert c.se == pytest.approx(1 / 3)
    assert c.p == pytest.approx(1 - 5 / np.sqrt(27), rel=1e-9)


def test_paired_drops_incomplete_pairs():
    c = paired_test([1, 2, 3, np.nan], [2, 4, 5, 9])
    assert c.n_a == 3 and c.diff == pytest.approx(5 / 3)


def test_welch_by_hand():
    c = welch_test([1, 2, 3, 4], [2, 4, 6])
    va, vb = (5 / 3) / 4, 4 / 3
    assert c.kind == "welch" and c.diff == pytest.approx(1.5)
    assert c.se == pytest.approx(np.sqrt(va + vb))
    assert c.df == pytest.approx((va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2))


def test_structural_zeros_are_not_tested():
    same = paired_test([0, 0, 0], [0, 0, 0])
    apart = welch_test([0.0, 0.0], [0.3, 0.3])
    assert same.kind == apart.kind == "structural"
    assert not same.significant() and not apart.significant()
    assert apart.diff == pytest.approx(0.3)


def test_too_few_values():
    assert paired_test([1.0], [2.0]).kind == "too few"
    assert welch_test([1.0], [2.0, 3.0]).kind == "too few"


def test_holm_by_hand():
    adj = holm([0.01, 0.04, 0.03, np.nan])
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06
    np.testing.assert_allclose(adj[:3], [0.03, 0.06, 0.06])
    assert np.isnan(adj[3])


def test_detectable_effect_tends_to_the_normal_formula():
    # z(0.975) + z(0.8) = 1.959964 + 0.841621
    assert detectable_effect(1.0, 1e7) == pytest.approx(2.801585, rel=1e-4)


def test_detectable_effect_has_the_stated_power():
    """At the detectable effect, a paired t test of 10 pairs rejects in 80% of simulated experiments."""
    rng = np.random.default_rng(0)
    n, sd, reps = 10, 1.0, 4000
    # the design's standard error, sd / sqrt(n), with n - 1 degrees of freedom
    effect = detectable_effect(sd / np.sqrt(n), n - 1)
    d = rng.normal(effect, sd, size=(reps, n))
    t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
    from scipy.stats import t as student
    rejected = np.abs(t) > student.ppf(0.975, n - 1)
    # the sd is estimated in each experiment, so the power is a little under 0.8 at the design sd; binomial se 0.006
    assert rejected.mean() == pytest.approx(0.8, abs=0.03)


def test_fit_recovers_the_entropy_law_and_its_interval():
    """R = -a e^H + b (Cui et al. 2505.22617, Eq. 1): exact data give a and b with no width; noisy data an interval
    that holds the truth, as wide as the linear regression of R on e^H says (the model is linear in a and b)."""
    from harness.reports.stats import fit
    law = lambda h, a, b: -a * np.exp(h) + b  # noqa: E731
    h = np.linspace(0.1, 1.5, 12)
    a, b = fit(law, h, law(h, 0.2, 0.9), p0=(0.1, 0.5))
    assert (a.mean, b.mean) == (pytest.approx(0.2), pytest.approx(0.9)) and a.half < 1e-6 and a.n == 12
    rng = np.random.default_rng(1)
    r = law(h, 0.2, 0.9) + rng.normal(0, 0.01, h.size)
    a, b = fit(law, h, r, p0=(0.1, 0.5))
    design = np.column_stack([-np.exp(h), np.ones_like(h)])
    coef, res, *_ = np.linalg.lstsq(design, r, rcond=None)
    cov = res[0] / (h.size - 2) * np.linalg.inv(design.T @ design)
    assert a.mean == pytest.approx(coef[0], rel=1e-6) and a.half == pytest.approx(2.228139 * np.sqrt(cov[0, 0]), rel=1e-4)
    assert abs(a.mean - 0.2) < a.half


def test_a_share_with_one_value_in_every_resample_is_that_value_without_a_warning():
    """SAS adds nothing at step 1 (no history): the share is 0 in every resample, and scipy's warning that the
    bootstrap distribution is degenerate does not reach the report's output."""
    import warnings

    from harness.reports.stats import share_interval
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert share_interval(np.zeros(10), np.arange(1.0, 11.0)) == (0.0, 0.0, 0.0)
        share, low, high = share_interval(np.arange(10.0), np.arange(1.0, 11.0))
    assert share == 45 / 55 and low < share < high
