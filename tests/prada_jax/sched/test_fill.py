"""The vectorised greedy fill equals a plain-Python greedy exactly: random slots with ties in
priority and bandwidth, each constraint tight alone and both together, edge cases; its jaxpr
does not grow with the number of candidates; it vmaps."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax.sched import base, fill


def _python_greedy(want, priority, bw, free_units, free_bw):
    """Serve by descending priority, ties by position; skip what does not fit."""
    order = sorted(range(len(want)), key=lambda i: (-priority[i], i))
    ok = [False] * len(want)
    units, left = int(free_units), float(free_bw)
    for i in order:
        if want[i] and units >= 1 and bw[i] <= left:
            ok[i] = True
            units -= 1
            left -= bw[i]
    return np.array(ok)


def _rank(priority):
    order = np.lexsort((np.arange(len(priority)), -np.asarray(priority)))
    rank = np.empty(len(priority), np.int32)
    rank[order] = np.arange(len(priority))
    return rank


_fill = jax.jit(fill.greedy_fill_ranked)
_passes = jax.jit(fill.fill_passes)
_seq = jax.jit(fill.greedy_fill_sequential)


def _slots(rng, n_slots):
    """Random slots; integer bandwidths (sums exact in float32) with many ties."""
    for s in range(n_slots):
        c = int(rng.choice([1, 2, 7, 33, 64, 200]))
        regime = s % 4   # 0 units tight, 1 bandwidth tight, 2 both, 3 loose
        want = rng.random(c) < rng.uniform(0.2, 1.0)
        priority = rng.integers(0, max(2, c // 3), c).astype(np.float32)  # ties
        bw = rng.integers(1, 12, c).astype(np.float32)                    # ties
        n_want = int(want.sum())
        mean_bw = 6.0
        units = {0: max(0, n_want // 3), 1: c + 1, 2: max(1, n_want // 2), 3: c + 1}[regime]
        free = {0: 1e6, 1: mean_bw * max(1, n_want // 3), 2: mean_bw * max(1, n_want // 3),
                3: 1e6}[regime]
        free = float(np.floor(free))
        yield want, priority, bw, units, free


def test_equals_python_greedy_on_random_slots():
    rng = np.random.default_rng(0)
    n_skip_passes = 0
    for want, pri, bw, units, free in _slots(rng, 400):
        ref = _python_greedy(want, pri, bw, units, free)
        # Slots of 1 and 2 candidates padded to 7, of 33 to 64, with requests that do not
        # want to run, ranked last (three shapes, three compilations per function).
        c = len(want)
        n = min(s for s in (7, 64, 200) if s >= c)
        want_p = np.concatenate([want, np.zeros(n - c, bool)])
        rank = np.concatenate([_rank(pri), np.arange(c, n, dtype=np.int32)])
        bw_p = np.concatenate([bw, np.ones(n - c, np.float32)])
        args = (jnp.asarray(want_p), jnp.asarray(rank), jnp.asarray(bw_p), jnp.int32(units),
                jnp.float32(free))
        got = np.asarray(_fill(*args))
        np.testing.assert_array_equal(got[:c], ref)
        seq = np.asarray(_seq(*args))
        np.testing.assert_array_equal(seq[:c], ref)
        assert not got[c:].any() and not seq[c:].any()
        n_skip_passes += int(_passes(*args)) > 1
    assert n_skip_passes > 50   # the multi-pass path (skipped requests) was exercised


def test_exact_ties_and_edges():
    # exact fit (b == bandwidth left) is admitted; a skip lets a later small one in
    want = jnp.array([True, True, True, True])
    rank = jnp.array([0, 1, 2, 3], jnp.int32)
    bw = jnp.array([3.0, 5.0, 2.0, 1.0])
    np.testing.assert_array_equal(_fill(want, rank, bw, jnp.int32(4), jnp.float32(5.0)),
                                  [True, False, True, False])
    np.testing.assert_array_equal(_fill(want, rank, bw, jnp.int32(4), jnp.float32(6.0)),
                                  [True, False, True, True])
    # no units, no bandwidth, nothing wanted
    assert not np.any(_fill(want, rank, bw, jnp.int32(0), jnp.float32(100.0)))
    assert not np.any(_fill(want, rank, bw, jnp.int32(9), jnp.float32(0.5)))
    assert not np.any(_fill(~want, rank, bw, jnp.int32(9), jnp.float32(100.0)))
    # units run out exactly at a bandwidth skip
    np.testing.assert_array_equal(_fill(want, rank, bw, jnp.int32(1), jnp.float32(2.0)),
                                  [False, False, True, False])


def test_base_greedy_fill_routes_through_passes_and_matches_on_float_slots():
    # Random float32 bandwidths (not exact sums): equal to the sequential loop on these slots.
    rng = np.random.default_rng(1)
    seq = _seq
    ranked, by_order = jax.jit(base.greedy_fill_ranked), jax.jit(base.greedy_fill)
    for c in (16, 1024):
        for _ in range(8):
            want = jnp.asarray(rng.random(c) < 0.6)
            rank = jnp.asarray(rng.permutation(c).astype(np.int32))
            bw = jnp.asarray(rng.uniform(0.2e6, 3e6, c).astype(np.float32))
            fu, fb = jnp.int32(c // 8 + 1), jnp.float32(1.6e6 * (c // 10 + 1))
            np.testing.assert_array_equal(ranked(want, rank, bw, fu, fb),
                                          seq(want, rank, bw, fu, fb))
            order = jnp.argsort(rank)
            np.testing.assert_array_equal(by_order(want, order, bw, fu, fb),
                                          seq(want, rank, bw, fu, fb))


def test_jaxpr_size_does_not_grow_with_candidates():
    def n_eqns(c):
        args = (jnp.ones(c, bool), jnp.arange(c, dtype=jnp.int32), jnp.ones(c), jnp.int32(3),
                jnp.float32(4.0))
        jaxpr = jax.make_jaxpr(base.greedy_fill_ranked)(*args)

        def count(j):
            return sum(1 + sum(count(sub.jaxpr if hasattr(sub, "jaxpr") else sub)
                               for sub in jax.core.jaxprs_in_params(e.params))
                       for e in j.eqns)
        return count(jaxpr.jaxpr)
    assert n_eqns(8) == n_eqns(1024)


@pytest.mark.parametrize("batch", [1, 17])
def test_vmap_matches_per_slot(batch):
    rng = np.random.default_rng(2)
    c = 50
    want = rng.random((batch, c)) < 0.7
    pri = rng.integers(0, 10, (batch, c)).astype(np.float32)
    bw = rng.integers(1, 9, (batch, c)).astype(np.float32)
    units = rng.integers(0, 30, batch).astype(np.int32)
    free = np.floor(rng.uniform(5, 120, batch)).astype(np.float32)
    ranks = np.stack([_rank(p) for p in pri])
    got = np.asarray(jax.jit(jax.vmap(fill.greedy_fill_ranked))(
        jnp.asarray(want), jnp.asarray(ranks), jnp.asarray(bw), jnp.asarray(units),
        jnp.asarray(free)))
    for i in range(batch):
        np.testing.assert_array_equal(got[i], _python_greedy(want[i], pri[i], bw[i], units[i],
                                                             free[i]))


_sorted_rank = jax.jit(fill.sorted_rank)
_priority_rank = jax.jit(base.priority_rank)


def test_sorted_rank_equals_pairwise_priority_rank():
    rng = np.random.default_rng(4)
    for c in (1, 9, 300):
        k1 = jnp.asarray(rng.integers(0, 4, c).astype(np.float32))
        k2 = jnp.asarray(rng.integers(0, 3, c).astype(np.float32))
        k2 = jnp.where(k1 > 2, jnp.inf, k2)
        np.testing.assert_array_equal(_sorted_rank(k1, k2), _priority_rank(k1, k2))
        np.testing.assert_array_equal(_sorted_rank(k1), _priority_rank(k1))
