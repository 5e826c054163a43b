"""Oracle screening: the fewest offloads that reach a correct answer in each problem's step tree.

The ceiling of any screening policy on a trace set (docs/design.md §8; issue 51 item 4): a
screening policy only chooses, at each node it visits, between the SLM's draft (candidate 0,
keep) and the LLM's step (candidate 1, offload); the trace tree fixes what follows. Moving as the
env moves (``envs.population.successor``): candidate ``c`` at node ``n`` ends the solution if
``terminal[n, c]`` (right iff ``correct[n, c]``), else goes to ``child[n, c]``, or to
``fallback[n]`` where that child was not expanded.

Exact dynamic programming from the deepest nodes up (every edge goes from depth k to k + 1):

    cost(n, c) = c + (0 if correct[n, c] else ∞)      if terminal[n, c]
               = c + cost(next(n, c))                 otherwise
    cost(n)    = min(cost(n, 0), cost(n, 1))

``cost(n)`` is the minimum number of offloads on a path from ``n`` to a correct answer (∞: no
correct answer is reachable). With at most ``b`` offloads left, a correct answer is reachable
from ``n`` iff ``cost(n) ≤ b``, so the budgeted problem (a DP over (node, budget left)) is read
off the same costs:

    nominate[n, b] = cost(n, 1) < cost(n, 0)  and  cost(n, 1) ≤ b

i.e. take the branch of fewest offloads among those that reach a correct answer within the
budget, ties → keep. Following the table from a root with budget ``k`` reaches a correct answer
with exactly ``cost(root)`` offloads whenever ``cost(root) ≤ k``, and otherwise keeps every draft
(the SLM path; no spent offload could help). So the budget-``k`` oracle solves exactly the
problems whose minimum is ≤ k, each at its minimum: cheapest problems first, a curve over k.
(The rule "nominate iff keeping cannot reach within b but offloading can" solves the same
problems but can spend up to b offloads where fewer suffice; the rule above never does.)

The table has ``K + 1`` budget columns, ``K`` = the most steps any path takes (``max_depth +
1``), so column ``K`` is the unlimited oracle; a caller with ``b`` offloads left reads column
``min(b, K)``. Host-side NumPy (this module imports nothing from ``envs`` or ``evals``); the
evaluator (``evals.evaluate``'s ``oracle`` screen) ships the table to the device.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from prada_jax.traces.format import TraceSet

__all__ = ["NO_PATH", "OracleTables", "branch_costs", "oracle_tables", "follow", "walk",
           "problem_min_offloads", "budget_curve"]

#: ``min_offloads`` / ``branch_cost`` of a node from which no correct answer is reachable.
NO_PATH = -1
_INF = np.int64(1) << 40


class OracleTables(NamedTuple):
    """The oracle of one trace set (host NumPy).

    nominate: [N, K + 1] int8, 1 = offload the step at node n with b offloads left (column b;
      column K: unlimited). min_offloads: [N] int32, the fewest offloads from node n to a
      correct answer (``NO_PATH``: none reachable). branch_cost: [N, 2] int32, the same after
      taking candidate c at n (c counts: 1 for the LLM's step). max_budget: K.
    """

    nominate: np.ndarray
    min_offloads: np.ndarray
    branch_cost: np.ndarray
    max_budget: int


def _successors(traces: TraceSet, c: int) -> np.ndarray:
    child = np.asarray(traces.child)[:, c]
    return np.where(child >= 0, child, np.asarray(traces.fallback))


def branch_costs(traces: TraceSet) -> np.ndarray:
    """[N, 2] int64: the fewest offloads to a correct answer after taking candidate c at each
    node (the offload itself included), ``2**40`` where none is reachable."""
    depth = np.asarray(traces.depth)
    term = np.asarray(traces.terminal).astype(bool)
    corr = np.asarray(traces.correct).astype(bool)
    n = depth.shape[0]
    cost = np.full((n, 2), _INF, np.int64)
    node_cost = np.full(n, _INF, np.int64)
    nxt = [_successors(traces, c) for c in (0, 1)]
    for d in range(int(depth.max(initial=0)), -1, -1):
        idx = np.flatnonzero(depth == d)
        for c in (0, 1):
            t = term[idx, c]
            follow_on = np.where(nxt[c][idx] >= 0, node_cost[np.maximum(nxt[c][idx], 0)], _INF)
            sub = np.where(t, np.where(corr[idx, c], 0, _INF), follow_on)
            cost[idx, c] = np.where(sub >= _INF, _INF, sub + c)
        node_cost[idx] = cost[idx].min(axis=1)
    return cost


def oracle_tables(traces: TraceSet, max_budget: int | None = None) -> OracleTables:
    """The oracle's action table and minimum offloads (module docstring).

    Args:
      traces: a validated ``TraceSet`` (NumPy or JAX arrays).
      max_budget: K, the last budget column (None: ``max_depth + 1``, the most steps a path
        takes, so column K never binds). A smaller K makes column K a budget of K offloads.
    Returns:
      ``OracleTables``.
    """
    k = int(np.asarray(traces.depth).max(initial=0)) + 1 if max_budget is None else int(max_budget)
    if k < 0:
        raise ValueError(f"max_budget must be >= 0, got {max_budget}")
    cost = branch_costs(traces)
    b = np.arange(k + 1)[None, :]
    nominate = (cost[:, 1:2] < cost[:, 0:1]) & (cost[:, 1:2] <= b)
    node = cost.min(axis=1)
    as_i32 = lambda x: np.where(x >= _INF, NO_PATH, x).astype(np.int32)  # noqa: E731
    return OracleTables(nominate=nominate.astype(np.int8), min_offloads=as_i32(node),
                        branch_cost=as_i32(cost), max_budget=k)


def follow(traces: TraceSet, tables: OracleTables, node: int, budget: int
           ) -> tuple[bool, int, int]:
    """Follows the table from ``node`` with ``budget`` offloads (host, one path).

    Returns ``(correct, offloads, steps)`` of the solution it ends in.
    """
    child = np.asarray(traces.child)
    term = np.asarray(traces.terminal).astype(bool)
    corr = np.asarray(traces.correct).astype(bool)
    fb = np.asarray(traces.fallback)
    n, left, offloads, steps = int(node), int(budget), 0, 0
    while True:
        c = int(tables.nominate[n, min(max(left, 0), tables.max_budget)])
        offloads += c
        left -= c
        steps += 1
        if term[n, c]:
            return bool(corr[n, c]), offloads, steps
        n = int(child[n, c]) if child[n, c] >= 0 else int(fb[n])


def walk(traces: TraceSet, nominate: np.ndarray, budget: int | None = None
         ) -> dict[str, np.ndarray]:
    """Walks every problem's tree from its root under a screen (vectorised over problems; no
    env: every nomination is served).

    Args:
      traces: the trace set.
      nominate: [N] 0/1, a fixed screen (offload node n's step iff 1; e.g. a critic's ΔQ > θ),
        or [N, K + 1] a budgeted table read at column ``min(budget − offloads so far, K)``.
      budget: k offloads per problem for a table (None: column K, unlimited).
    Returns:
      dict of [P] int64: ``correct``, ``offloads``, ``steps``.
    """
    nom = np.asarray(nominate).astype(np.int64)
    child = np.asarray(traces.child)
    term = np.asarray(traces.terminal).astype(bool)
    corr = np.asarray(traces.correct).astype(np.int64)
    fb = np.asarray(traces.fallback)
    node = np.asarray(traces.root).astype(np.int64)
    p = node.size
    k_max = nom.shape[1] - 1 if nom.ndim == 2 else 0
    left = np.full(p, k_max if budget is None else int(budget), np.int64)
    out = {k: np.zeros(p, np.int64) for k in ("correct", "offloads", "steps")}
    live = np.ones(p, bool)
    for _ in range(int(np.asarray(traces.depth).max(initial=0)) + 2):
        if not live.any():
            break
        a = nom[node, np.clip(left, 0, k_max)] if nom.ndim == 2 else nom[node]
        a = np.where(live, a, 0)
        out["offloads"] += a
        out["steps"] += live
        left -= a
        ends = live & term[node, a]
        out["correct"] = np.where(ends, corr[node, a], out["correct"])
        nxt = child[node, a]
        nxt = np.where(nxt >= 0, nxt, fb[node])
        live &= ~ends
        node = np.where(live, nxt, node)
    if live.any():
        raise ValueError("a walk did not end within max depth + 1 steps (invalid trace set)")
    return out


def problem_min_offloads(traces: TraceSet, tables: OracleTables) -> np.ndarray:
    """[P] int32: the fewest offloads to a correct answer per problem (``NO_PATH``: none)."""
    return tables.min_offloads[np.asarray(traces.root)]


def budget_curve(traces: TraceSet, tables: OracleTables) -> dict[str, np.ndarray]:
    """The oracle's exact curve over the budget k = 0..K on the trace set's problems, each
    problem weighted once (no env: no outages, no contention, no timeouts).

    Returns ``{"budget" [K+1], "accuracy" [K+1], "offloads_per_problem" [K+1],
    "offload_share" [K+1]}`` (offload share = offloaded steps / steps over the problems).
    """
    acc, offl, share = [], [], []
    for k in range(tables.max_budget + 1):
        w = walk(traces, tables.nominate, k)
        acc.append(w["correct"].mean())
        offl.append(w["offloads"].mean())
        share.append(w["offloads"].sum() / w["steps"].sum())
    return {"budget": np.arange(tables.max_budget + 1), "accuracy": np.asarray(acc),
            "offloads_per_problem": np.asarray(offl), "offload_share": np.asarray(share)}
