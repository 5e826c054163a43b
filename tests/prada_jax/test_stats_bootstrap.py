"""``prada_jax.stats`` bootstraps against plain-loop references (the same draws, indexed one
replicate at a time) and simulations with a known answer."""
import numpy as np
import pytest

from prada_jax import stats


def _indices(counts: np.ndarray) -> np.ndarray:
    """A draw's indices from its count vector (each unit repeated as often as drawn)."""
    return np.repeat(np.arange(counts.size), counts.astype(int))


def test_two_way_bootstrap_count_form_equals_indexing():
    """Each replicate's count-vector mean equals the mean of the explicitly indexed draw."""
    rng = np.random.default_rng(3)
    d = rng.integers(-1, 2, size=(5, 12)).astype(float)
    S, P = d.shape
    for _ in range(20):
        si, pi = rng.integers(0, S, S), rng.integers(0, P, P)
        ws, wp = np.bincount(si, minlength=S), np.bincount(pi, minlength=P)
        assert ws @ d @ wp / (S * P) == pytest.approx(stats.explicit_replicate(d, si, pi))


def test_two_way_bootstrap_by_a_plain_loop_over_its_draws():
    """Percentiles, SE and the seeds-only bounds from a Python loop over the same draws
    (``two_way_counts``), each replicate indexed explicitly within the strata."""
    rng = np.random.default_rng(4)
    d = (rng.random((4, 9)) < 0.5).astype(float) - (rng.random((4, 9)) < 0.4)
    strata, n_boot = [4, 5], 300
    out = stats.two_way_bootstrap(d, strata, n_boot=n_boot, seed=8)
    ws, wp = stats.two_way_counts(4, strata, n_boot, 8)
    reps, seed_reps = [], []
    for r in range(n_boot):
        si = _indices(ws[r])
        pi = _indices(wp[r])
        assert len(pi) == 9 and sum(pi < 4) == 4     # four from the first set, five from the next
        reps.append(stats.explicit_replicate(d, si, pi))
        seed_reps.append(float(np.mean([d[s].mean() for s in si])))
    assert out["ci_low"] == pytest.approx(np.percentile(reps, 2.5))
    assert out["ci_high"] == pytest.approx(np.percentile(reps, 97.5))
    assert out["se"] == pytest.approx(np.std(reps, ddof=1))
    assert out["seed_only_ci_low"] == pytest.approx(np.percentile(seed_reps, 2.5))
    assert out["mean"] == pytest.approx(d.mean())


def test_two_way_bootstrap_covers_problem_sampling():
    """Seeds that agree but problems that vary: the seeds-only CI collapses, the two-way one
    does not; its SE matches the problems' standard error; the MDE is 2.80 SE."""
    rng = np.random.default_rng(0)
    per_problem = rng.choice([-1.0, 0.0, 1.0], size=400, p=[0.2, 0.5, 0.3])
    d = np.repeat(per_problem[None, :], 10, 0)
    out = stats.two_way_bootstrap(d, [200, 200], n_boot=3000, seed=1)
    assert out["mean"] == pytest.approx(per_problem.mean())
    assert out["seed_only_ci_high"] - out["seed_only_ci_low"] == pytest.approx(0.0, abs=1e-12)
    # stratified mean of two sets of 200: SE² = (var₁/200 + var₂/200) / 4
    se = np.sqrt((per_problem[:200].var() / 200 + per_problem[200:].var() / 200) / 4)
    assert out["se"] == pytest.approx(se, rel=0.15)
    assert out["ci_low"] < out["mean"] < out["ci_high"]
    assert out["mde"] == pytest.approx(2.8015852 * out["se"], rel=1e-6)
    assert stats.superior(out) == "pass" and stats.noninferior(out, 0.02) == "pass"
    with pytest.raises(ValueError):
        stats.two_way_bootstrap(d, [100, 100])


def test_two_way_ratio_bootstrap_by_a_plain_loop():
    """Ratio of means on the same draws for numerator and denominator; replicates with a
    denominator <= 0 dropped and counted."""
    rng = np.random.default_rng(5)
    num = rng.normal(0.05, 0.3, (3, 8))
    den = rng.normal(0.02, 0.3, (3, 8))
    out = stats.two_way_ratio_bootstrap(num, den, [8], n_boot=400, seed=2)
    ws, wp = stats.two_way_counts(3, [8], 400, 2)
    vals, dropped = [], 0
    for r in range(400):
        si, pi = _indices(ws[r]), _indices(wp[r])
        n, m = num[np.ix_(si, pi)].sum(), den[np.ix_(si, pi)].sum()
        if m > 0:
            vals.append(n / m)
        else:
            dropped += 1
    assert out["dropped_replicates"] == dropped > 0
    assert out["ci_low"] == pytest.approx(np.percentile(vals, 2.5))
    assert out["ci_high"] == pytest.approx(np.percentile(vals, 97.5))
    assert out["ratio"] == (pytest.approx(num.mean() / den.mean()) if den.mean() > 0 else None)
    assert stats.two_way_ratio_bootstrap(num, -np.abs(den), None, n_boot=50, seed=0)[
        "ci_low"] is None


def test_cluster_group_means_by_a_plain_loop():
    """Whole clusters resampled: per replicate and group, the mean over the drawn clusters'
    rows of that group (a cluster drawn twice counts twice)."""
    rng = np.random.default_rng(6)
    clusters = np.repeat(np.array([10, 11, 12, 13, 14, 15]), 4)
    groups = np.tile(np.arange(4), 6)
    keep = rng.random(24) < 0.8                     # ragged: not every cluster reaches every group
    clusters, groups = clusters[keep], groups[keep]
    values = rng.normal(-groups * 0.5, 1.0)
    out = stats.cluster_group_means(clusters, groups, values, n_boot=200, seed=3)
    W = stats.multinomial_counts(np.random.default_rng(3), 6, 200)
    ids = [10, 11, 12, 13, 14, 15]
    for r in range(200):
        drawn = [ids[i] for i in _indices(W[r])]
        for g in range(4):
            xs = [v for c in drawn for v, cc, gg in zip(values, clusters, groups)
                  if cc == c and gg == g]
            want = np.mean(xs) if xs else np.nan
            np.testing.assert_allclose(out["boot_mean"][r, g], want, rtol=1e-12)
    for g in range(4):
        assert out["mean"][g] == pytest.approx(values[groups == g].mean())
        assert out["n"][g] == (groups == g).sum()
        col = out["boot_mean"][:, g]
        assert out["ci_low"][g] == pytest.approx(np.percentile(col[np.isfinite(col)], 2.5))
    assert out["n_clusters"] == 6


def test_resample_indices_seed_bootstrap_covers_by_simulation():
    """A percentile seed bootstrap of a mean (``resample_indices``) covers a normal mean at
    about its level: n = 30, 90 % interval, 400 data sets (fixed seeds)."""
    rng = np.random.default_rng(7)
    hits = 0
    for k in range(400):
        x = rng.normal(2.0, 1.0, 30)
        reps = [x[idx].mean() for idx in stats.resample_indices(30, 300, k)]
        lo, hi = stats.percentile_interval(reps, stats.tail_percents(0.9))
        hits += lo <= 2.0 <= hi
    assert 0.83 < hits / 400 < 0.95
    assert stats.percentile_interval([]) == (None, None)
    draws = [1.0, 2.0, np.inf, 3.0]                  # inverted CDF: no interpolation into inf
    assert stats.percentile_interval(draws, (50, 100), method="inverted_cdf") == (2.0, np.inf)
