"""Shared types of the stage-2 schedulers: per-candidate inputs, multipliers, decision codes.

Every scheduler is a pure function with one signature::

    decide(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams) -> decision [C] int8

over ``C`` candidate slots (the env passes one per user slot, with a ``candidate`` mask), where
``decision`` is ``LOCAL`` (0, keep the draft), ``QUEUE`` (1, wait for a later slot) or
``IMMEDIATE`` (2, upload, run on the LLM, download). Non-candidates get ``LOCAL`` (ignored).
Every scheduler here returns decisions that respect ``free_units`` and ``free_bw_hz``; the env
enforces the hard limits again whatever a scheduler returns.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct

from prada_jax.sched import fill as _fill

#: The three decisions of a request, the one definition every module uses.
LOCAL, QUEUE, IMMEDIATE = 0, 1, 2


@struct.dataclass
class SchedInputs:
    """Per-candidate scalars a nomination carries to the server (all ``[C]``).

    Attributes:
      candidate: bool, this slot holds a request to decide (new nomination or queued).
      gain: float32, quality gain ΔQ the nomination carries (PRM units; the edge critic's
        Q(s,1) − Q(s,0)).
      delay_s: float32, D_i = upload + server compute + download delay if run now (s).
      bandwidth_hz: float32, b_i, bandwidth the request needs while it runs (Hz).
      wait_slots: int32, slots this request has already waited in the queue.
      ctx_tokens: int32, context tokens the request would upload.
      snr: float32, this slot's linear uplink SNR of the user.
      draft_prm: float32, PRM score of the prefix + the SLM draft (only the RSD rule reads it).
      u_rand: float32 in [0, 1), per-candidate uniform noise (only the random rule reads it).
      queue_len: int32 scalar, requests waiting in the queue at the start of the slot.
      comm_s: float32, upload + download delay if run now (s), the part of ``delay_s`` a
        ``coarse``-trained policy's ΔQ did not charge (``prada_jax.sched.threshold``);
        ``None`` (callers that build inputs by hand) means no communication delay.
      num_servers_t: int32 scalar, server units available this slot, M_t under the env's
        scenario schedule (``envs.edge.slot_conditions``); the expected queue wait divides by
        it. ``None`` (callers that build inputs by hand) means the nominal M of
        ``SchedParams.num_servers``.
    """

    candidate: Any
    gain: Any
    delay_s: Any
    bandwidth_hz: Any
    wait_slots: Any
    ctx_tokens: Any
    snr: Any
    draft_prm: Any
    u_rand: Any
    queue_len: Any
    comm_s: Any = None
    num_servers_t: Any = None


@struct.dataclass
class SchedParams:
    """Scheduler constants and multipliers (array leaves: change or learn them without recompiling).

    Attributes:
      lambda_s: price of one server unit (PRM units), ≥ 0.
      mu: price of bandwidth (PRM units per Hz), ≥ 0.
      beta: quality–latency trade-off β (PRM units per second of delay).
      tau_s: slot length τ (s).
      num_servers: M, nominal server units (the expected queue wait q_i = queue_len / M uses
        ``SchedInputs.num_servers_t``, the units of this slot, when the inputs carry it).
      max_wait_slots: a request that has waited this many slots is kept local.
      rsd_threshold: RSD rule keeps the draft if its PRM score ≥ this (default 0.7).
      policy_true_reward: bool, the screening policy was trained with the env's ``true``
        reward (else ``coarse``); decides which costs the threshold rule still adds to ΔQ
        (``prada_jax.sched.threshold``). Read from the policy's ``policy_meta.json``.
    """

    lambda_s: Any = 0.0
    mu: Any = 0.0
    beta: Any = 0.2
    tau_s: Any = 0.05
    num_servers: Any = 4
    max_wait_slots: Any = 20
    rsd_threshold: Any = 0.7
    policy_true_reward: Any = False


def priority_rank(*keys):
    """[C] int32 rank of each candidate when sorted ascending by ``keys`` (lexicographic, first
    key most significant), ties by position. Pairwise comparisons (C² work, no sort op): for
    the small C of a slot this is much cheaper than a sort on CPU, and it vectorises under vmap.

    Args:
      keys: one or more [C] arrays (no NaN).
    """
    c = keys[0].shape[0]
    idx = jnp.arange(c)
    before = idx[None, :] < idx[:, None]  # j before i on a full tie
    for k in reversed(keys):
        kj, ki = k[None, :], k[:, None]
        before = (kj < ki) | ((kj == ki) & before)
    return jnp.sum(before.astype(jnp.int32), axis=1)


#: Above this many candidates per slot ``auto_rank`` ranks by one stable sort (C log C); at or
#: below it by C² pairwise comparisons, which are cheaper there under vmap (measured with
#: ``benchmarks.sched_vs_milp``, 256 slots vmapped on the 2-core CPU: C = 32: pairwise 4.4×
#: the sort's slots/s, C = 128: 1.2×, C = 256: the sort 3.8×, C = 1024: 14×; docs/BENCHMARKS.md).
#: Both give the same ranks (ties by user slot), so no decision depends on it.
SORT_ABOVE = 128


def auto_rank(*keys):
    """[C] int32 rank ascending by ``keys`` (first most significant), ties by position:
    ``fill.sorted_rank`` if C > ``SORT_ABOVE`` else ``priority_rank`` (C is static). Every rule
    ranks through this, so its cost stays C log C at thousands of user slots (the pairwise
    form allocates C² booleans: 4·U² bytes at U = 100 000 is 40 GB)."""
    if keys[0].shape[0] > SORT_ABOVE:
        return _fill.sorted_rank(*keys)
    return priority_rank(*keys)


def greedy_fill_ranked(want, rank, bandwidth_hz, free_units, free_bw_hz):
    """``greedy_fill`` with the priority given as a rank ([C] int32, a permutation of 0..C-1).

    Runs as a few vectorised passes (``prada_jax.sched.fill``): no code unrolled over C, the
    same admitted set as the one-by-one loop (``fill.greedy_fill_sequential``).
    """
    return _fill.greedy_fill_ranked(want, rank, bandwidth_hz, free_units, free_bw_hz)


def greedy_fill(want, order, bandwidth_hz, free_units, free_bw_hz):
    """Admits requests one by one in ``order`` while a server unit and the bandwidth remain.

    A request that does not fit is skipped (later, smaller ones may still fit).

    Args:
      want: [C] bool, requests asking to run now.
      order: [C] int32, a permutation of ``range(C)``: ``order[k]`` is the k-th in priority.
      bandwidth_hz: [C] float32, bandwidth each request needs.
      free_units: int32 scalar, server units free this slot.
      free_bw_hz: float32 scalar, bandwidth free this slot (Hz).

    Returns:
      [C] bool, admitted requests; their count ≤ ``free_units`` and bandwidth sum ≤ ``free_bw_hz``.
    """
    c = want.shape[0]
    rank = jnp.zeros((c,), jnp.int32).at[order].set(jnp.arange(c, dtype=jnp.int32))
    return greedy_fill_ranked(want, rank, bandwidth_hz, free_units, free_bw_hz)


def prefix_admit(want, bandwidth_hz, free_units, free_bw_hz):
    """[C] bool: ``want`` truncated in position order where the running totals (over all wanted
    requests up to and including this one) exceed the free resources. Admits everything when the
    wanted set fits; never exceeds the limits. Vectorised (cumsum), used by the env as a safety
    net behind the scheduler."""
    cu = jnp.cumsum(want.astype(jnp.int32))
    cb = jnp.cumsum(jnp.where(want, bandwidth_hz.astype(jnp.float32), 0.0))
    return want & (cu <= free_units) & (cb <= free_bw_hz)


def expired(x: SchedInputs, sp: SchedParams):
    """[C] bool: requests that have waited ``max_wait_slots`` and must be resolved locally."""
    return x.wait_slots >= sp.max_wait_slots
