"""A fair clock for OPD against ReOPD (issue 35, item 3), a measurement of ``studies.reopd_kg``:
what one supervised turn costs each method, from the trainer's per-update cost records
(:func:`prada_jax.distill.opd.cost_summary`'s ``per_update``), with the simulated tool latency
added arithmetically instead of slept.

The issue-24 clock was unfair both ways: it slept the tool latency once per *call*, serially
across all episodes and seeds; it left ReOPD's teacher scoring of the replayed prefixes out of
ReOPD's cost (it compared rollout seconds only); and it charged OPD's jitted step for the rows
of its static batch that carry no turn. Here, per update u:

* OPD (timed with no sleep, ``opd.tool_latency_s = 0``)::

      w_u(L) = rollout_s_u + L · tool_rounds_u + scoring_s_u + update_s_u · turns_u / rows

  ``tool_rounds_u``: agent-turn rounds in which some episode of some seed called the tool
  (the trainer ORs each micro-step's turn mask over the seeds, so the calls of one turn run
  concurrently across episodes and seeds: one latency per round, not per call);
  ``rows``: the static rows of one update's batch over all seeds and micro-steps
  (``opd.episodes × max_turns × seeds × grad_accum``), of which only ``turns_u`` carry a turn;
* ReOPD: ``w_u = rollout_s_u + scoring_s_u + update_s_u`` (its scoring forwards every
  replayed prefix through the teacher; every row of its batch is a supervised turn).

Seconds per supervised turn, with statistic ``"median"`` (the median over timed updates of
``w_u / turns_u``; the verdict statistic, as in the issue-24 addendum) or ``"sum"``
(``Σ w_u / Σ turns_u``). The ratio is OPD's over ReOPD's. In teacher compute, each method's
``teacher_tokens_forwarded`` per supervised turn (OPD forwards each episode once for all its
turns; ReOPD forwards prefix + action per turn): their ratio is the speed ratio a run whose
only cost is the teacher's forward passes would see. The break-even latency ``L*`` is the
smallest ``L >= 0`` at which the ratio reaches ``target`` (4 in the paper): closed form for
``"sum"``, bisection for ``"median"`` (each ``w_u(L)/turns_u`` grows with ``L``, so the
median does too).
"""
from __future__ import annotations

import math
import statistics
from typing import Sequence

TARGET = 4.0   # the paper's speed claim: ReOPD at least 4x faster per supervised turn


def _timed(costs: Sequence[dict]) -> list[dict]:
    return [c for c in costs if c.get("timed") and c["supervised_turns"] > 0]


def opd_work(c: dict, latency_s: float, rows: int) -> float:
    """Fair seconds of one OPD update record ``c`` at tool latency ``latency_s`` [s per turn
    round], its jitted step charged for its ``supervised_turns`` of ``rows`` static rows."""
    frac = min(1.0, c["supervised_turns"] / rows) if rows > 0 else 1.0
    return (c["rollout_s"] + latency_s * c.get("tool_rounds", 0) + c["scoring_s"]
            + c["update_s"] * frac)


def reopd_work(c: dict) -> float:
    """Seconds of one ReOPD update record: generation + teacher scoring (prefixes included) +
    the step."""
    return c["rollout_s"] + c["scoring_s"] + c["update_s"]


def per_turn(costs: Sequence[dict], work, stat: str = "median") -> float | None:
    """Seconds per supervised turn over the timed updates with turns (None when none)."""
    t = _timed(costs)
    if not t:
        return None
    if stat == "sum":
        return sum(work(c) for c in t) / sum(c["supervised_turns"] for c in t)
    return float(statistics.median(work(c) / c["supervised_turns"] for c in t))


def teacher_tokens_per_turn(costs: Sequence[dict]) -> float | None:
    """Teacher tokens forwarded per supervised turn, over every update (counts, not times)."""
    turns = sum(c["supervised_turns"] for c in costs)
    return sum(c["teacher_tokens_forwarded"] for c in costs) / turns if turns else None


def ratio(opd: Sequence[dict], reopd: Sequence[dict], latency_s: float, rows: int,
          stat: str = "median") -> float | None:
    """OPD / ReOPD fair seconds per supervised turn at ``latency_s`` (None without timings)."""
    o = per_turn(opd, lambda c: opd_work(c, latency_s, rows), stat)
    r = per_turn(reopd, reopd_work, stat)
    return o / r if o is not None and r else None


def break_even_latency(opd: Sequence[dict], reopd: Sequence[dict], rows: int,
                       target: float = TARGET, stat: str = "median") -> float | None:
    """The smallest tool latency ``L >= 0`` [s per turn round] at which :func:`ratio` reaches
    ``target``: 0 if it already does at 0; ``inf`` if OPD makes no tool round; None without
    timings."""
    r = per_turn(reopd, reopd_work, stat)
    t = _timed(opd)
    if not r or not t:
        return None
    if ratio(opd, reopd, 0.0, rows, stat) >= target:
        return 0.0
    rounds = sum(c.get("tool_rounds", 0) for c in t)
    if rounds == 0:
        return math.inf
    if stat == "sum":   # (W0 + L·R) / T = target·r  =>  L = (target·r·T − W0) / R
        w0 = sum(opd_work(c, 0.0, rows) for c in t)
        turns = sum(c["supervised_turns"] for c in t)
        return (target * r * turns - w0) / rounds
    lo, hi = 0.0, 1.0
    while ratio(opd, reopd, hi, rows, stat) < target:
        hi *= 2.0
        if hi > 1e9:   # some update has no tool round and dominates the median
            return math.inf
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if ratio(opd, reopd, mid, rows, stat) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def serial_per_call_ratio(opd: Sequence[dict], reopd: Sequence[dict], latency_s: float,
                          stat: str = "median") -> float | None:
    """The issue-24 clock for comparison: OPD's rollout with the latency once per *call*
    (serial) over ReOPD's rollout alone, per supervised turn (no scoring, no step)."""
    o = per_turn(opd, lambda c: c["rollout_s"] + latency_s * c["tool_calls"], stat)
    r = per_turn(reopd, lambda c: c["rollout_s"], stat)
    return o / r if o is not None and r else None


def report(opd: Sequence[dict], reopd: Sequence[dict], rows: int,
           latencies: Sequence[float] = (0.0, 0.001, 0.01, 0.1),
           target: float = TARGET) -> dict:
    """Every number of the fair clock for the two runs' cost records: per statistic, the
    seconds per supervised turn of ReOPD and of OPD at each latency, the ratios, the
    break-even latency, the serial per-call ratio of the old clock, the teacher tokens
    forwarded per supervised turn of each and their ratio, and the mean tool rounds and tool
    calls per OPD update."""
    out: dict = {"rows": int(rows), "target": target, "latencies_s": list(latencies)}
    for stat in ("median", "sum"):
        r = per_turn(reopd, reopd_work, stat)
        out[stat] = {
            "reopd_s_per_turn": r,
            "opd_s_per_turn": {f"{L:g}": per_turn(opd, lambda c, L=L: opd_work(c, L, rows), stat)
                               for L in latencies},
            "ratio": {f"{L:g}": ratio(opd, reopd, L, rows, stat) for L in latencies},
            "serial_per_call_ratio_old_clock": {f"{L:g}": serial_per_call_ratio(opd, reopd, L,
                                                                                stat)
                                                for L in latencies},
            "break_even_latency_s": break_even_latency(opd, reopd, rows, target, stat)}
    to, tr = teacher_tokens_per_turn(opd), teacher_tokens_per_turn(reopd)
    t = _timed(opd)
    out.update(opd_teacher_tokens_per_turn=to, reopd_teacher_tokens_per_turn=tr,
               ratio_teacher_compute=(to / tr) if to and tr else None,
               opd_tool_rounds_per_update=(sum(c.get("tool_rounds", 0) for c in t) / len(t)
                                           if t else None),
               opd_tool_calls_per_update=(sum(c["tool_calls"] for c in t) / len(t)
                                          if t else None),
               timed_updates={"opd": len(t), "reopd": len(_timed(reopd))})
    return out
