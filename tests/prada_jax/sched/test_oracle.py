"""Exact slot oracle: enumeration vs MILP vs closed forms (random small slots)."""
import numpy as np
import pytest

from prada_jax.sched import oracle


def _random_slot(rng, n, with_bw=True):
    w = rng.normal(0.0, 1.0, n)
    w_bar = w - rng.uniform(0.0, 1.5, n)  # queueing is worth less than running now
    b = rng.uniform(0.5, 3.0, n) if with_bw else np.zeros(n)
    valid = rng.uniform(size=n) < 0.85
    free_units = int(rng.integers(0, n + 1))
    free_bw = float(rng.uniform(0.0, 1.5 * b.sum() + 1e-3)) if with_bw else np.inf
    return w, w_bar, b, valid, free_units, free_bw


def _top_k_closed_form(w, w_bar, valid, k):
    """Only the unit limit: keep Σ max(w̄,0) and add the k largest positive g = w − max(w̄,0)."""
    base = np.maximum(w_bar, 0.0)
    g = np.sort((w - base)[valid])[::-1]
    return float(base[valid].sum() + np.sum(np.clip(g[:k], 0.0, None)))


@pytest.mark.parametrize("n", [1, 4, 7])
def test_enumeration_matches_milp(n):
    rng = np.random.default_rng(n)
    for _ in range(15):
        w, w_bar, b, valid, m, bw = _random_slot(rng, n)
        e = oracle.enumerate_slot(w, w_bar, b, m, bw, valid)
        p = oracle.milp_slot(w, w_bar, b, m, bw, valid)
        assert oracle.is_feasible(e.decision, b, m, bw, valid)
        assert oracle.is_feasible(p.decision, b, m, bw, valid)
        np.testing.assert_allclose(p.value, e.value, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(oracle.slot_value(e.decision, w, w_bar), e.value, atol=1e-12)


def test_unit_limit_only_matches_top_k():
    rng = np.random.default_rng(1)
    for n in (3, 9, 40):
        for _ in range(4):
            w, w_bar, b, valid, m, _ = _random_slot(rng, n, with_bw=False)
            want = _top_k_closed_form(w, w_bar, valid, m)
            sol = oracle.solve_slot(w, w_bar, None, m, np.inf, valid)
            assert sol.method == ("enumerate" if valid.sum() <= oracle.MAX_ENUM else "milp")
            np.testing.assert_allclose(sol.value, want, rtol=1e-9, atol=1e-9)


def test_never_negative_and_invalid_stay_local():
    rng = np.random.default_rng(2)
    w, w_bar = -rng.uniform(0.1, 1.0, 6), -rng.uniform(0.1, 1.0, 6)
    sol = oracle.enumerate_slot(w, w_bar, None, 3, np.inf)
    assert sol.value == 0.0 and np.all(sol.decision == oracle.LOCAL)
    valid = np.array([True, False, True, False, True, False])
    sol = oracle.milp_slot(np.ones(6), np.zeros(6), None, 10, np.inf, valid)
    np.testing.assert_array_equal(sol.decision, np.where(valid, oracle.IMMEDIATE, oracle.LOCAL))


def test_lagrangian_enumeration_is_per_candidate_argmax():
    rng = np.random.default_rng(3)
    for _ in range(20):
        w, w_bar, b, valid, _, _ = _random_slot(rng, 6)
        lam, mu = rng.uniform(0, 1), rng.uniform(0, 0.3)
        d, val = oracle.enumerate_lagrangian(w, w_bar, b, lam, mu, valid)
        opts = np.stack([np.zeros(6), w_bar, w - lam - mu * b], axis=1)
        np.testing.assert_allclose(val, opts.max(axis=1)[valid].sum(), atol=1e-12)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="w_bar"):
        oracle.enumerate_slot(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="MAX_ENUM"):
        oracle.enumerate_slot(np.zeros(12), np.zeros(12))
    with pytest.raises(ValueError, match="method"):
        oracle.solve_slot(np.zeros(2), np.zeros(2), method="greedy")
    with pytest.raises(ValueError, match="non-finite"):
        oracle.milp_slot(np.array([np.nan]), np.zeros(1))
