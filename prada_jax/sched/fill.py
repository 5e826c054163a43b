"""The stage-2 greedy fill as a few vectorised passes (sort, prefix sums), not a C-step loop.

The greedy fill admits requests one by one in priority order while a server unit and enough
bandwidth remain; a request that does not fit is skipped and later, smaller ones may still
fit (``greedy_fill_sequential`` is that loop, one step per candidate). This module computes
the same admitted set with a ``lax.while_loop`` of *passes*, each O(C) vectorised work:

1. candidates are put in priority order (one gather by the rank);
2. a pass starts at position ``p`` with the exact remaining units ``u`` and bandwidth ``R``
   of the sequential fill at ``p``. Every wanted request after ``p`` with ``b > R`` is
   skipped by the sequential fill too (the remaining bandwidth never grows), so it is pruned;
   the others are assumed admitted, and prefix sums give their running unit count and
   bandwidth;
3. the first position ``q`` where the assumption breaks is found (running bandwidth above
   ``R`` or running count above ``u``): everything assumed before ``q`` is exactly what the
   sequential fill admits. A unit overflow ends the fill; a bandwidth overflow skips ``q``
   and the next pass starts at ``q + 1`` with the bandwidth left there.

So the number of passes is one plus the number of skipped requests that fit the bandwidth
left at the start of their pass (at most C; a handful on typical slots, see
``fill_passes``), each pass a cumsum and a few elementwise ops: no code unrolled over C, the
compiled size does not depend on C, and it vectorises under ``vmap``.

Equality with the sequential fill: exact whenever the bandwidth sums are exact in float32
(e.g. integer bandwidths with sums below 2**24, as in the tests). With arbitrary float32
bandwidths the two differ only where a request's fit is within float32 rounding of the
bandwidth left (the prefix sum and the running subtraction round differently).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["greedy_fill_ranked", "greedy_fill_sorted", "greedy_fill_sequential",
           "fill_passes", "rank_from_order", "sorted_rank"]


def rank_from_order(order):
    """[C] int32 rank (position in priority) from ``order`` (``order[k]`` = k-th in priority)."""
    c = order.shape[0]
    return jnp.zeros((c,), jnp.int32).at[order].set(jnp.arange(c, dtype=jnp.int32))


def sorted_rank(*keys):
    """[C] int32 rank when sorted ascending by ``keys`` (first key most significant), ties by
    position: the same as ``prada_jax.sched.base.priority_rank`` but by one stable sort
    (C log C) instead of C² pairwise comparisons, for large slots (C = 1024: the pairwise form
    is ~10⁶ comparisons per key and dominates the threshold rule, most of all under vmap).

    Args:
      keys: one or more [C] arrays (no NaN).
    """
    c = keys[0].shape[0]
    # jnp.lexsort: last key most significant, stable (ties keep position order)
    order = jnp.lexsort(tuple(reversed(keys)))
    return rank_from_order(order.astype(jnp.int32)) if c else jnp.zeros((0,), jnp.int32)


def _fill_sorted(want, bw, free_units, free_bw_hz):
    """(admitted [C] bool, passes int32) for candidates already in priority order."""
    c = want.shape[0]
    idx = jnp.arange(c, dtype=jnp.int32)
    want = jnp.asarray(want, bool)
    bw = jnp.asarray(bw, jnp.float32)

    def cond(st):
        return ~st[4]

    def body(st):
        p, r, u, taken, _, passes = st
        active = (idx >= p) & want & (bw <= r)
        cb = jnp.where(active, bw, 0.0)
        s_incl = jnp.cumsum(cb)
        cnt_incl = jnp.cumsum(active.astype(jnp.int32))
        bad = active & ((s_incl > r) | (cnt_incl > u))
        any_bad = jnp.any(bad)
        q = jnp.where(any_bad, jnp.argmax(bad).astype(jnp.int32), c)
        taken = taken | (active & (idx < q))
        qm1 = jnp.clip(q - 1, 0, c - 1)
        used_bw = jnp.where(q > 0, s_incl[qm1], 0.0)       # admitted in [p, q)
        used_n = jnp.where(q > 0, cnt_incl[qm1], 0)
        qc = jnp.minimum(q, c - 1)
        units_hit = any_bad & (cnt_incl[qc] > u)
        done = ~any_bad | units_hit | (q + 1 >= c)
        return (q + 1, r - used_bw, u - used_n, taken, done, passes + 1)

    init = (jnp.int32(0), jnp.asarray(free_bw_hz, jnp.float32),
            jnp.asarray(free_units, jnp.int32), jnp.zeros((c,), bool),
            jnp.asarray(c == 0), jnp.int32(0))
    out = jax.lax.while_loop(cond, body, init)
    return out[3], out[5]


def greedy_fill_sorted(want, bandwidth_hz, free_units, free_bw_hz):
    """The greedy fill of candidates given in priority order (position 0 first).

    Args:
      want: [C] bool, requests asking to run now.
      bandwidth_hz: [C] float32, bandwidth each needs (Hz).
      free_units: int32 scalar, server units free.
      free_bw_hz: float32 scalar, bandwidth free (Hz).

    Returns:
      [C] bool admitted, in the same (priority) order.
    """
    return _fill_sorted(want, bandwidth_hz, free_units, free_bw_hz)[0]


def greedy_fill_ranked(want, rank, bandwidth_hz, free_units, free_bw_hz):
    """The greedy fill with the priority given as a rank ([C] int32, a permutation of 0..C-1;
    rank 0 is served first). Same contract as ``prada_jax.sched.base.greedy_fill``: returns
    [C] bool admitted (in candidate order), count ≤ ``free_units``, bandwidth ≤ ``free_bw_hz``.
    """
    c = want.shape[0]
    order = jnp.zeros((c,), jnp.int32).at[rank].set(jnp.arange(c, dtype=jnp.int32))
    ok_sorted = greedy_fill_sorted(want[order], bandwidth_hz.astype(jnp.float32)[order],
                                   free_units, free_bw_hz)
    return ok_sorted[rank]


def fill_passes(want, rank, bandwidth_hz, free_units, free_bw_hz):
    """int32 number of vectorised passes ``greedy_fill_ranked`` runs on this slot."""
    c = want.shape[0]
    order = jnp.zeros((c,), jnp.int32).at[rank].set(jnp.arange(c, dtype=jnp.int32))
    return _fill_sorted(want[order], bandwidth_hz.astype(jnp.float32)[order], free_units,
                        free_bw_hz)[1]


def greedy_fill_sequential(want, rank, bandwidth_hz, free_units, free_bw_hz):
    """The same fill as a C-step ``lax.fori_loop`` (one candidate per step, in rank order):
    the definition the passes reproduce, kept as a reference and for the benchmark."""
    c = want.shape[0]
    order = jnp.zeros((c,), jnp.int32).at[rank].set(jnp.arange(c, dtype=jnp.int32))
    bw = bandwidth_hz.astype(jnp.float32)

    def body(k, carry):
        ok, units, bw_left = carry
        i = order[k]
        take = want[i] & (units >= 1) & (bw[i] <= bw_left)
        return (ok.at[i].set(take), units - take.astype(jnp.int32),
                jnp.where(take, bw_left - bw[i], bw_left))

    init = (jnp.zeros(want.shape, bool), jnp.asarray(free_units, jnp.int32),
            jnp.asarray(free_bw_hz, jnp.float32))
    return jax.lax.fori_loop(0, c, body, init)[0]
