"""Baseline stage-2 schedulers: keep-local, offload-all, random, FIFO-greedy, RSD online PRM.

All share the signature of ``prada_jax.sched.base`` and return feasible decisions. Every rule
that admits requests here serves them in arrival order: the request that has waited longest
first (``wait_slots``), ties by user slot (docs/design.md §8: a baseline is served in arrival
order unless its row says otherwise). Admitting by user-slot index instead starves the users
in high slots (a finished user's slot is refilled by the next arrival, which then jumps the
queue), so a survivor's latency looks short exactly when the server is overloaded.
"""
from __future__ import annotations

import jax.numpy as jnp

from prada_jax.sched.base import (IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams, expired,
                                  greedy_fill_ranked, auto_rank)


def _finish(x: SchedInputs, sp: SchedParams, admitted, wants_queue):
    """Admitted → immediate; other requests that want to wait and have not expired → queue."""
    q = x.candidate & ~admitted & wants_queue & ~expired(x, sp)
    d = jnp.where(admitted, IMMEDIATE, jnp.where(q, QUEUE, LOCAL))
    return d.astype(jnp.int8)


def keep_local(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams):
    """Every request keeps its draft (the All-SLM system when all steps are nominated)."""
    del free_units, free_bw_hz, sp
    return jnp.zeros(x.candidate.shape, jnp.int8)


def _arrival_rank(x: SchedInputs):
    """[C] int32 service order: longest-waiting request first, ties by user slot."""
    return auto_rank(-x.wait_slots)


def offload_all(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams):
    """Immediate while resources last (oldest request first), else queue."""
    admitted = greedy_fill_ranked(x.candidate, _arrival_rank(x), x.bandwidth_hz, free_units,
                                  free_bw_hz)
    return _finish(x, sp, admitted, jnp.ones_like(x.candidate))


def random_sched(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams):
    """Each request picks local / queue / immediate uniformly (``floor(3·u_rand)``); immediates
    beyond the free resources are queued (the immediates admitted oldest first)."""
    choice = jnp.clip(jnp.floor(3.0 * x.u_rand).astype(jnp.int32), 0, 2)
    want = x.candidate & (choice == IMMEDIATE)
    admitted = greedy_fill_ranked(want, _arrival_rank(x), x.bandwidth_hz, free_units,
                                  free_bw_hz)
    wants_queue = (choice == QUEUE) | (choice == IMMEDIATE)
    return _finish(x, sp, admitted, wants_queue)


def fifo_greedy(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams):
    """First come first served: longest-waiting first (ties by user slot), immediate while
    resources last, else queue."""
    admitted = greedy_fill_ranked(x.candidate, _arrival_rank(x), x.bandwidth_hz, free_units,
                                  free_bw_hz)
    return _finish(x, sp, admitted, jnp.ones_like(x.candidate))


def rsd(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams):
    """Reward-guided speculative decoding with an online PRM: keep the draft if its PRM score is
    ≥ ``rsd_threshold`` (0.7), else run the LLM (immediate while resources last, oldest
    request first, else queue).

    The PRM's forward latency is charged by the env on every step when this rule is active.
    """
    want = x.candidate & (x.draft_prm < sp.rsd_threshold)
    admitted = greedy_fill_ranked(want, _arrival_rank(x), x.bandwidth_hz, free_units,
                                  free_bw_hz)
    return _finish(x, sp, admitted, want)
