"""Calibration metrics against independent references (scipy Mann-Whitney, plain loops)."""
import numpy as np
import pytest
from scipy import stats as sps

from evals import calibration_metrics as cm
from prada_jax.traces.testing import random_traces


def test_auc_matches_mann_whitney():
    rng = np.random.default_rng(0)
    for trial in range(10):
        k = 60
        y = rng.uniform(size=k) < 0.4
        s = np.round(rng.normal(size=k) + y, 1)   # rounding makes ties
        u = sps.mannwhitneyu(s[y], s[~y], alternative="two-sided").statistic
        np.testing.assert_allclose(cm.auc(s, y), u / (y.sum() * (~y).sum()), rtol=1e-12)


def test_auc_extremes():
    assert cm.auc([0.1, 0.2, 0.9, 0.8], [0, 0, 1, 1]) == 1.0
    assert cm.auc([0.9, 0.8, 0.1, 0.2], [0, 0, 1, 1]) == 0.0
    assert cm.auc([0.5] * 4, [0, 1, 0, 1]) == 0.5
    assert np.isnan(cm.auc([0.1, 0.2], [1, 1]))


def test_reliability_matches_loop():
    rng = np.random.default_rng(1)
    p = rng.uniform(size=500)
    y = (rng.uniform(size=500) < p ** 2).astype(float)
    rel = cm.reliability(p, y, n_bins=5)
    ece = 0.0
    for b in range(5):
        lo, hi = b / 5, (b + 1) / 5
        m = (p >= lo) & ((p < hi) if b < 4 else (p <= hi))
        assert rel.count[b] == m.sum()
        np.testing.assert_allclose(rel.mean_pred[b], p[m].mean(), rtol=1e-12)
        np.testing.assert_allclose(rel.frac_pos[b], y[m].mean(), rtol=1e-12)
        ece += m.mean() * abs(y[m].mean() - p[m].mean())
    np.testing.assert_allclose(rel.ece, ece, rtol=1e-12)


def _label_recursive(t, n, c, follow):
    while True:
        if t.terminal[n, c]:
            return int(t.correct[n, c])
        n = int(t.child[n, c]) if t.child[n, c] >= 0 else int(t.fallback[n])
        c = follow


@pytest.mark.parametrize("follow", [0, 1])
def test_continuation_labels_match_walk(follow):
    t = random_traces(seed=3, problems=6, depth=5)
    lab = cm.continuation_labels(t, follow)
    for n in range(t.num_nodes):
        for c in (0, 1):
            assert lab[n, c] == _label_recursive(t, n, c, follow)


def test_report_fields_and_informative_prm():
    t = random_traces(seed=4, problems=20, depth=4)
    # Random traces: correctness of terminal steps ~ Bernoulli(cand_prm), so the score AUC > 0.5.
    rep = cm.calibration_report(t)
    assert rep["n_steps"] == 2 * t.num_nodes
    assert rep["auc_prm_score"] > 0.5
    assert 0.0 <= rep["ece"] <= 1.0
    assert sum(rep["reliability"]["count"]) == rep["n_steps"]
