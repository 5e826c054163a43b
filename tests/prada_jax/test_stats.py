"""CI computation against scipy.stats, knee detection against a brute-force reading."""
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


@pytest.mark.parametrize("n", [3, 5, 8, 16, 40])
def test_min_detectable_effect_matches_scipy(n):
    """MDE = (t_{.975, n-1} + t_{.8, n-1}) · sd / sqrt(n) with scipy's quantiles, and the exact
    power of the two-sided paired t-test at that effect (scipy's noncentral t) is ≈ 80%."""
    sd = 0.013
    got = stats.min_detectable_effect(sd, n)
    df = n - 1
    want = (sps.t.ppf(0.975, df) + sps.t.ppf(0.8, df)) * sd / np.sqrt(n)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    crit = sps.t.ppf(0.975, df)
    nc = got / sd * np.sqrt(n)
    power = sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc)
    assert abs(power - 0.8) < (0.03 if n >= 5 else 0.06), power
    # Half the effect is detected far less often: the formula is not a constant.
    nc2 = nc / 2
    assert sps.nct.sf(crit, df, nc2) + sps.nct.cdf(-crit, df, nc2) < 0.45


def test_paired_mde_uses_the_sd_of_the_differences():
    rng = np.random.default_rng(0)
    base = rng.normal(0.5, 0.1, 8)
    a = base + rng.normal(0.01, 0.004, 8)
    d = a - base
    np.testing.assert_allclose(stats.paired_mde(a, base),
                               stats.min_detectable_effect(d.std(ddof=1), 8), rtol=1e-12)
    assert np.isnan(stats.paired_mde([1.0], [0.0]))
    with pytest.raises(ValueError):
        stats.min_detectable_effect(1.0, 8, power=1.0)
