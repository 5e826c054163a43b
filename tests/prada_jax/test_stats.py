"""prada_jax.stats intervals: t quantiles and CIs against scipy.stats (a test dependency), coverage by
simulation, the decision rules read off an interval, knee detection against a brute-force reading."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from prada_jax import stats


@pytest.mark.parametrize("df", [1, 2, 3, 4, 9, 29, 200])
@pytest.mark.parametrize("q", [0.6, 0.9, 0.975, 0.995])
def test_t_ppf_matches_scipy(df, q):
    np.testing.assert_allclose(stats.t_ppf(q, df), sps.t.ppf(q, df), rtol=1e-9)
    np.testing.assert_allclose(stats.t_ppf(1 - q, df), sps.t.ppf(1 - q, df), rtol=1e-9)


@pytest.mark.parametrize("t", [-5.0, -1.3, 0.0, 0.4, 2.2, 30.0])
def test_t_cdf_matches_scipy(t):
    for df in (1, 3, 7.5):
        np.testing.assert_allclose(stats.t_cdf(t, df), sps.t.cdf(t, df), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("n", [2, 3, 5, 12])
@pytest.mark.parametrize("conf", [0.9, 0.95, 0.99])
def test_mean_ci_matches_scipy_interval(n, conf):
    x = np.random.default_rng(n).normal(3.0, 2.0, size=n)
    ci = stats.mean_ci(x, confidence=conf)
    lo, hi = sps.t.interval(conf, n - 1, loc=np.mean(x), scale=sps.sem(x))
    np.testing.assert_allclose([ci.low, ci.high], [lo, hi], rtol=1e-9)
    assert ci.n == n and math.isclose(ci.mean, float(np.mean(x)))


def test_mean_ci_edge_cases():
    one = stats.mean_ci([2.0])
    assert one.mean == 2.0 and math.isnan(one.half_width)
    empty = stats.mean_ci([float("nan")])
    assert empty.n == 0 and empty.fmt() == "n/a"
    const = stats.mean_ci([1.0, 1.0, 1.0])
    assert const.half_width == 0.0
    # Non-finite seeds are dropped, not propagated.
    assert stats.mean_ci([1.0, np.nan, 3.0]).n == 2
    with pytest.raises(ValueError, match="confidence"):
        stats.mean_ci([1.0, 2.0], confidence=1.5)


def test_paired_ratio_ci():
    a = np.array([0.8, 0.9, 0.85, 0.7])
    b = np.array([1.0, 1.0, 0.9, 0.0])  # the zero denominator drops that seed
    ci = stats.paired_ratio_ci(a, b)
    r = np.array([0.8, 0.9, 0.85 / 0.9])
    lo, hi = sps.t.interval(0.95, 2, loc=r.mean(), scale=sps.sem(r))
    np.testing.assert_allclose([ci.mean, ci.low, ci.high], [r.mean(), lo, hi], rtol=1e-9)
    with pytest.raises(ValueError, match="paired"):
        stats.paired_ratio_ci([1.0], [1.0, 2.0])


def _knee_bruteforce(xs, ys, tol):
    pts = sorted(zip(xs, ys))
    for i, (x, y) in enumerate(pts):
        if all((y - y2) / abs(y) < tol for _, y2 in pts[i + 1:]):
            return x
    return None


def test_find_knee():
    xs = [1, 2, 4, 8, 16]
    ys = [10.0, 6.0, 4.0, 3.9, 3.85]   # saturates after 4
    assert stats.find_knee(xs, ys) == 4.0
    assert stats.find_knee(xs[::-1], ys[::-1]) == 4.0  # order of the grid does not matter
    assert stats.find_knee(xs, [5.0] * 5) == 1.0       # flat: the knee is the smallest value
    assert stats.find_knee([1, 2, 3], [3.0, 2.0, 1.0]) == 3.0  # never saturates in the grid
    assert stats.find_knee([], []) is None
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = list(rng.choice(50, size=6, replace=False) + 1)
        y = list(rng.uniform(1, 10, size=6))
        assert stats.find_knee(x, y, 0.05) == _knee_bruteforce(x, y, 0.05)


def test_to_json_dict_is_strict_json_with_none_where_undefined():
    import json
    one = stats.mean_ci([0.7])                     # a single seed: no interval
    d = one.to_json_dict()
    assert d["mean"] == 0.7 and d["n"] == 1
    assert d["ci_low"] is None and d["ci_high"] is None and d["ci_half_width"] is None
    json.dumps(d, allow_nan=False)                 # strict JSON
    x = np.array([0.2, 0.4, 0.9])
    lo, hi = sps.t.interval(0.95, 2, loc=x.mean(), scale=sps.sem(x))
    d = stats.mean_ci(x).to_json_dict()
    np.testing.assert_allclose([d["ci_low"], d["ci_high"]], [lo, hi], rtol=1e-9)
    assert stats.finite_or_none(float("inf")) is None and stats.finite_or_none(3) == 3
    assert stats.finite_or_none(float("nan")) is None and stats.finite_or_none("nan") == "nan"


def test_paired_diff_ci_is_the_t_interval_of_the_differences():
    a = np.array([0.8, 0.9, np.nan, 0.7, 0.75])
    b = np.array([0.7, 0.85, 0.6, 0.72, 0.5])
    d = np.array([0.1, 0.05, -0.02, 0.25])          # the NaN seed is dropped
    ci = stats.paired_diff_ci(a, b)
    lo, hi = sps.t.interval(0.95, 3, loc=d.mean(), scale=sps.sem(d))
    np.testing.assert_allclose([ci.mean, ci.low, ci.high], [d.mean(), lo, hi], rtol=1e-9)
    assert ci.n == 4
    with pytest.raises(ValueError, match="paired"):
        stats.paired_diff_ci([1.0], [1.0, 2.0])


def test_mean_ci_covers_by_simulation():
    """Coverage of the 90 % interval over 4000 normal samples of n = 6 (fixed seed): within
    3 binomial sd of 0.90."""
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(4000):
        ci = stats.mean_ci(rng.normal(1.5, 3.0, 6), confidence=0.9)
        hits += ci.low <= 1.5 <= ci.high
    assert abs(hits / 4000 - 0.9) < 3 * math.sqrt(0.9 * 0.1 / 4000)


@pytest.mark.parametrize("lo,hi,ni,sup", [(0.01, 0.05, "pass", "pass"),
                                          (-0.01, 0.05, "pass", "unresolved"),
                                          (-0.03, 0.05, "unresolved", "unresolved"),
                                          (-0.06, -0.03, "fail", "fail"),
                                          (-0.03, -0.01, "unresolved", "fail"),
                                          (-0.019, -0.001, "pass", "fail"),
                                          (-0.05, 0.01, "unresolved", "unresolved"),
                                          (None, 0.05, "unresolved", "unresolved")])
def test_decision_rules_read_off_the_interval(lo, hi, ni, sup):
    d = {"ci_low": lo, "ci_high": hi}
    assert stats.noninferior(d, 0.02) == ni and stats.superior(d) == sup
