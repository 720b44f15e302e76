"""The statistics every report uses, on scipy.stats: t intervals at the true degrees of freedom, paired and Welch
tests, Holm's correction across a report's claims (and a ranking's pairs), and the smallest effect the seeds could
detect."""
import functools
import warnings
from dataclasses import dataclass, replace

import numpy as np
from scipy import optimize, stats

LEVEL = 0.95  # two-sided intervals and tests at 5%
POWER = 0.8   # the power at which the detectable effect is stated
#: A ranking shows no interval over fewer seeds ("n/a (too few seeds)"): over one there is none, and over two to
#: four the spread that sets its width is itself too unsure to rank by (the 95% t factor is 12.7 at two seeds).
MIN_SEEDS = 5


def finite(x) -> np.ndarray:
    """The finite values of ``x`` as a float array (missing seeds are NaN and are not counted)."""
    x = np.asarray(x, float).ravel()
    return x[np.isfinite(x)]


@dataclass(frozen=True)
class Interval:
    """Mean of the finite values, the half-width of its t interval (NaN under two values), and how many there were."""
    mean: float
    half: float
    n: int


def t_interval(x, level: float = LEVEL) -> Interval:
    """Student t interval of the mean, n - 1 degrees of freedom."""
    x = finite(x)
    if x.size == 0:
        return Interval(float("nan"), float("nan"), 0)
    if x.size == 1:
        return Interval(float(x[0]), float("nan"), 1)
    sem = float(stats.sem(x))
    return Interval(float(x.mean()), float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * sem, int(x.size))


@dataclass(frozen=True)
class Comparison:
    """b - a: the difference, its standard error and interval half-width, the test's degrees of freedom and p-value,
    how many values each side used (pairs for a paired test), and the smallest |difference| the test detects with
    probability ``POWER`` at these n and this spread. ``kind`` is "paired", "welch", "structural" (both sides
    constant, or a paired difference the same in every pair: nothing to test against; p is 0 when they differ, 1
    when not) or "too few" (under two values a side)."""
    kind: str
    diff: float
    se: float
    half: float
    df: float
    p: float
    n_a: int
    n_b: int
    detectable: float

    def significant(self, alpha: float = 1 - LEVEL) -> bool:
        return self.kind in ("paired", "welch") and self.p < alpha


def detectable_effect(se: float, df: float, alpha: float = 1 - LEVEL, power: float = POWER) -> float:
    """The smallest true difference a two-sided t test at ``alpha`` rejects with probability ``power``, for a test
    statistic with standard error ``se`` and ``df`` degrees of freedom (noncentral t): ``se`` times the
    noncentrality that reaches ``power``, which depends on ``df``, ``alpha`` and ``power`` only."""
    if not (se > 0 and df > 0):
        return float("nan")
    return _detectable_ncp(float(df), alpha, power) * se


@functools.lru_cache(maxsize=256)  # a report's tests share a few degrees of freedom
def _detectable_ncp(df: float, alpha: float, power: float) -> float:
    crit = stats.t.ppf(1 - alpha / 2, df)

    def gap(ncp: float) -> float:  # the far tail is negligible for ncp > 0, and scipy's nct may give NaN there
        return stats.nct.sf(crit, df, ncp) + np.nan_to_num(stats.nct.cdf(-crit, df, ncp)) - power

    high = crit + 1.0
    while gap(high) < 0:  # widen the bracket step by step (the noncentral t's tails lose precision far out)
        high *= 2.0
    return float(optimize.brentq(gap, 0.0, high))


def _too_few(diff: float, n_a: int, n_b: int) -> Comparison:
    nan = float("nan")
    return Comparison("too few", diff, nan, nan, nan, nan, n_a, n_b, nan)


def _structural(diff: float, n_a: int, n_b: int) -> Comparison:
    return Comparison("structural", diff, 0.0, 0.0, float("nan"), 0.0 if diff != 0 else 1.0, n_a, n_b,
                      float("nan"))


def paired_test(a, b) -> Comparison:
    """b - a over the pairs where both are finite (seeds that pair): the paired t test, n - 1 degrees of freedom."""
    a, b = np.asarray(a, float).ravel(), np.asarray(b, float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired_test: a and b must have one value per pair, got {a.size} and {b.size}")
    keep = np.isfinite(a) & np.isfinite(b)
    d = b[keep] - a[keep]
    n = int(d.size)
    diff = float(d.mean()) if n else float("nan")
    if n < 2:
        return _too_few(diff, n, n)
    if np.all(d == d[0]):  # every pair moved by the same amount (both constant, say): no spread to test against
        return _structural(diff, n, n)
    res = stats.ttest_rel(b[keep], a[keep])
    se, df = float(stats.sem(d)), n - 1.0
    half = float(stats.t.ppf(0.5 + LEVEL / 2, df)) * se
    return Comparison("paired", diff, se, half, df, float(res.pvalue), n, n, detectable_effect(se, df))


def welch_test(a, b) -> Comparison:
    """b - a of independent samples (finite values only): Welch's t test, Welch-Satterthwaite degrees of freedom."""
    a, b = finite(a), finite(b)
    diff = float(b.mean() - a.mean()) if a.size and b.size else float("nan")
    if a.size < 2 or b.size < 2:
        return _too_few(diff, int(a.size), int(b.size))
    if np.all(a == a[0]) and np.all(b == b[0]):
        return _structural(diff, int(a.size), int(b.size))
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = float(np.sqrt(va + vb))
    df = float((va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)))
    res = stats.ttest_ind(b, a, equal_var=False)
    half = float(stats.t.ppf(0.5 + LEVEL / 2, df)) * se
    return Comparison("welch", diff, se, half, df, float(res.pvalue), int(a.size), int(b.size),
                      detectable_effect(se, df))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error), NaN entries (untested) left out of the family."""
    p = np.asarray(pvalues, float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    if idx.size == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    m = order.size
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out[order] = np.minimum(adjusted, 1.0)
    return out


def pairwise(samples: dict, paired: bool, min_n: int = MIN_SEEDS) -> dict[tuple[str, str], Comparison]:
    """Every pair (a, b) of ``samples`` ({name: values over seeds}, a before b in its order): b - a by
    ``paired_test`` where ``paired`` (the arrays aligned, one entry a seed), else ``welch_test``; the p-values
    Holm-adjusted over the pairs tested, and each detectable effect stated at Holm's strictest level (5% / the pairs
    tested), so that an effect that size is found with ``POWER`` wherever its p falls in Holm's order. A pair with
    under ``min_n`` values a side is "too few": not tested, no interval."""
    names = list(samples)
    found = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            x, y = np.asarray(samples[a], float), np.asarray(samples[b], float)
            c = paired_test(x, y) if paired and x.shape == y.shape else welch_test(x, y)
            found[a, b] = _too_few(c.diff, c.n_a, c.n_b) if min(c.n_a, c.n_b) < min_n else c
    adjusted = holm([c.p if c.kind in ("paired", "welch") else np.nan for c in found.values()])
    tested = int(np.isfinite(adjusted).sum())
    return {key: replace(c, p=float(p), detectable=detectable_effect(c.se, c.df, (1 - LEVEL) / tested))
            if np.isfinite(p) else c for (key, c), p in zip(found.items(), adjusted)}


def fit(model, x, y, p0) -> list[Interval]:
    """Least squares of ``y = model(x, *params)`` from ``p0`` (scipy.optimize.curve_fit) over the finite pairs: each
    parameter with the half-width of its 95% t interval (n - len(params) degrees of freedom), n the pairs used.
    Under len(params) + 1 pairs the half-widths are NaN."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n, k = int(x.size), len(p0)
    if n < k:
        return [Interval(float("nan"), float("nan"), n) for _ in p0]
    params, cov = optimize.curve_fit(model, x, y, p0=p0)
    crit = stats.t.ppf(0.5 + LEVEL / 2, n - k) if n > k else float("nan")
    return [Interval(float(p), float(crit * np.sqrt(c)) if n > k else float("nan"), n)
            for p, c in zip(params, np.diag(cov))]


def proportion_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a proportion k / n (scipy's binomtest); NaN for n = 0."""
    if n == 0:
        return float("nan"), float("nan")
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def share_interval(part, whole, level: float = LEVEL, seed: int = 0) -> tuple[float, float, float]:
    """mean(part) / mean(whole) over pairs (seeds) where both are finite, and its percentile bootstrap interval
    (scipy.stats.bootstrap resampling the pairs together, a fixed ``seed`` so that a report regenerates the same);
    NaN bounds under three pairs, when a resample's mean(whole) is 0, or when every resample gives one value."""
    part, whole = np.asarray(part, float).ravel(), np.asarray(whole, float).ravel()
    keep = np.isfinite(part) & np.isfinite(whole)
    part, whole = part[keep], whole[keep]
    if not part.size or whole.mean() == 0:
        return float("nan"), float("nan"), float("nan")
    share = float(part.mean() / whole.mean())
    if part.size < 3:
        return share, float("nan"), float("nan")
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)  # a degenerate resample: the bounds read NaN
        res = stats.bootstrap((part, whole), lambda p, w, axis: p.mean(axis) / w.mean(axis), paired=True,
                              vectorized=True, confidence_level=level, n_resamples=4999, method="percentile",
                              rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return share, (low if np.isfinite(low) else float("nan")), (high if np.isfinite(high) else float("nan"))
