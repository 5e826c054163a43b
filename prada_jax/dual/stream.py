"""Reads a stage-2 rollout as the request stream and schedule the clairvoyant bound compares.

The bound itself, its stream and plan types and the greedy online rule are the scheduling
primitive ``prada_jax.sched.clairvoyant``; this module only adapts the output of
``prada_jax.dual.rollout.make_rollout`` to it (``evals.open_loop_bound`` runs the comparison).
"""
from __future__ import annotations

import numpy as np

from prada_jax.sched.clairvoyant import Plan, Stream, make_stream, plan_value


def stream_from_rollout(out, env: int = 0) -> Stream:
    """The request stream one env saw in a stage-2 rollout (``prada_jax.dual.rollout.make_rollout``
    output ``out``; its ``batch`` is a SlotBatch [T, E, U]).

    Requests are the new nominations (``batch.fresh``) of env ``env``: arrival = the slot,
    value w = the threshold rule's run-now value ``batch.w`` [PRM units] (before any price),
    service k = ``batch.work`` [slots], bw = ``batch.b`` [Hz], all read at nomination (the env
    recomputes b and k for a queued request from the channel of the slot it starts in; the
    stream keeps the nomination's). Capacities: ``batch.capacity_units`` / ``capacity_bw``
    (M_t, B_t of the scenario). Order: by slot, then user slot. The stream arose under the
    scheduler that ran (closed loop); the bound then treats it as fixed (open loop).
    """
    b = out["batch"]
    fresh = np.asarray(b.fresh)[:, env]  # [T, U]
    t_idx, u_idx = np.nonzero(fresh)
    pick = lambda a: np.asarray(a)[:, env][t_idx, u_idx]  # noqa: E731
    return make_stream(t_idx, pick(b.w).astype(np.float64), np.rint(pick(b.work)),
                       pick(b.b).astype(np.float64),
                       np.rint(np.asarray(b.capacity_units)[:, env]),
                       np.asarray(b.capacity_bw, np.float64)[:, env])


def rollout_plan(stream: Stream, out, wait_cost: float, env: int = 0) -> Plan:
    """The schedule the rollout's own scheduler produced on :func:`stream_from_rollout`'s stream,
    valued under the same model (method "rollout").

    For a request nominated by user u in slot a, the env's ``decision`` [T, E, U] of user u is
    followed from slot a while it is 1 (queue); the first other decision resolves it: 2
    (immediate) without ``outage`` starts it in that slot, anything else (local, expiry,
    outage, end of the rollout) is local. Its value may differ from the env's reward: the
    model charges wait_cost per slot waited and uses nomination-time b and k.
    """
    dec = np.asarray(out["decision"])[:, env]  # [T, U]
    outage = np.asarray(out["outage"])[:, env]
    fresh = np.asarray(out["batch"].fresh)[:, env]
    t_idx, u_idx = np.nonzero(fresh)
    start = -np.ones(t_idx.shape[0], np.int64)
    for j, (a, u) in enumerate(zip(t_idx, u_idx)):
        t = int(a)
        while t < dec.shape[0] and dec[t, u] == 1:
            t += 1
        if t < dec.shape[0] and dec[t, u] == 2 and not outage[t, u]:
            start[j] = t
    return Plan(start, plan_value(stream, start, wait_cost), "rollout")
