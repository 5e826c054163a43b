"""``prada_jax.stats`` power: the t-based MDE against SciPy (test dependency) and the noncentral
t, and ``variance_components`` / ``planned_mde`` against a simulation with known variance
components, plain loops and the two-way bootstrap's own SE."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from prada_jax import stats


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
    d = np.array([0.1, np.nan, 0.3, 0.2])          # mde_of_differences drops non-finite seeds
    assert stats.mde_of_differences(d) == pytest.approx(
        stats.min_detectable_effect(float(np.std([0.1, 0.3, 0.2], ddof=1)), 3))


def _sim(rng, S, P, vs, vp, ve):
    return (rng.normal(0, math.sqrt(vs), (S, 1)) + rng.normal(0, math.sqrt(vp), (1, P))
            + rng.normal(0, math.sqrt(ve), (S, P)))


def test_components_recover_known_variances():
    rng = np.random.default_rng(0)
    est = [stats.variance_components(_sim(rng, 60, 400, 0.004, 0.09, 0.02)) for _ in range(20)]
    for key, true in (("seed", 0.004), ("problem", 0.09), ("interaction", 0.02)):
        mean = np.mean([e[key] for e in est])
        assert mean == pytest.approx(true, rel=0.12), (key, mean)


def test_components_by_plain_loops():
    rng = np.random.default_rng(1)
    d = (rng.random((4, 7)) < 0.3).astype(float) - (rng.random((4, 7)) < 0.2)
    S, P = d.shape
    m = sum(map(sum, d.tolist())) / (S * P)
    r = [sum(row) / P for row in d.tolist()]
    c = [sum(d[s][p] for s in range(S)) / S for p in range(P)]
    ss_res = sum((d[s][p] - r[s] - c[p] + m) ** 2 for s in range(S) for p in range(P))
    ms_res = ss_res / ((S - 1) * (P - 1))
    ms_s = P * sum((x - m) ** 2 for x in r) / (S - 1)
    ms_p = S * sum((x - m) ** 2 for x in c) / (P - 1)
    out = stats.variance_components(d)
    assert out["interaction"] == pytest.approx(ms_res)
    assert out["seed"] == pytest.approx(max(0.0, (ms_s - ms_res) / P))
    assert out["problem"] == pytest.approx(max(0.0, (ms_p - ms_res) / S))


@pytest.mark.parametrize("vs,vp,ve", [(1e-4, 0.006, 0.1), (5e-4, 0.08, 0.05)])
def test_planned_mde_matches_the_bootstrap_and_solves_for_problems(vs, vp, ve):
    """The two-way bootstrap's MDE equals the components' with the interaction counted three
    times (the pigeonhole over-count); counted once it is visibly smaller where the interaction
    dominates."""
    rng = np.random.default_rng(2)
    d = _sim(rng, 20, 512, vs, vp, ve)
    comp = stats.variance_components(d)
    boot = stats.two_way_bootstrap(d, [256, 256], n_boot=4000, seed=3)
    k = stats.BOOTSTRAP_INTERACTION
    assert stats.planned_mde(comp, 20, 512, k) == pytest.approx(boot["mde"], rel=0.08)
    if 2 * ve / 20 > vp:   # interaction-dominated: once-counted is below the bootstrap
        assert stats.planned_mde(comp, 20, 512) < 0.85 * boot["mde"]
    for f in (1.0, k):
        n = stats.problems_for_mde(comp, 0.02, 20, f)
        assert stats.planned_mde(comp, 20, n, f) == pytest.approx(0.02, rel=1e-9)
    assert comp["seed"] > 20 * (0.001 / 2.8) ** 2     # the seed term alone exceeds 0.001:
    assert stats.problems_for_mde(comp, 0.001, 20) == math.inf
    assert stats.planned_mde(comp, math.inf, math.inf) == 0.0
    with pytest.raises(ValueError, match="2 seeds"):
        stats.variance_components(d[:1])
