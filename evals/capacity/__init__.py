"""Capacity under an SLO (docs/design.md §8, the headline view; issue 42): from per-seed
results on a grid of arrival rates, the largest rate (users/s per server GPU) at which a row
meets a latency and a quality target while stable.

The rule (``studies/capacity/README.md`` registers it):

* a (row, seed) point **meets** the SLO iff it is stable on that seed (ρ < 1 and blocked by
  U ≤ ``evals.report.BLOCKED_TOL`` of the arrivals), its p90 latency ≤ ``SLO.latency_p90_s``
  and its accuracy ≥ ``SLO.accuracy`` (``meets``);
* a seed's capacity is the largest grid rate r such that the point meets the SLO at **every**
  grid rate ≤ r, 0 if the lightest fails (``seed_capacity``);
* a row's capacity is the minimum over seeds (the largest rate met on every seed);
* ``binding_term`` names what breaks first (``unstable``, ``U binds``, ``latency``,
  ``accuracy``) at the first failing rate of each seed.

The SLO itself is a rule over a reference row lightly loaded (``slo_from_reference``):
``latency_scale`` × its mean p90 and ``retention`` × its mean accuracy (DistServe's "SLO
scale"). A capacity at the grid's top is censored: ``censored`` says so.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from evals import report


class SLO(NamedTuple):
    """A service-level objective: p90 end-to-end latency [s] at most ``latency_p90_s`` and
    accuracy (correct / arrivals) at least ``accuracy``."""
    latency_p90_s: float
    accuracy: float


def slo_from_reference(ref: Mapping[str, Sequence[float]], latency_scale: float = 2.0,
                       retention: float = 0.95) -> SLO:
    """The SLO ``latency_scale`` × the reference's mean p90 latency and ``retention`` × its
    mean accuracy (``ref``: one row's per-seed metrics at a light load)."""
    if not (latency_scale > 0 and 0 < retention <= 1):
        raise ValueError(f"latency_scale must be > 0 and retention in (0, 1], got "
                         f"{latency_scale}, {retention}")
    return SLO(float(latency_scale) * float(np.nanmean(ref["latency_p90_s"])),
               float(retention) * float(np.nanmean(ref["accuracy"])))


def _arr(row: Mapping[str, Sequence[float]], key: str) -> np.ndarray:
    return np.asarray(row[key], np.float64)


def failures(row: Mapping[str, Sequence[float]], slo: SLO) -> dict[str, np.ndarray]:
    """Per-seed bool [S] of each way a point can miss the SLO: ``unstable`` (ρ ≥ 1 or not
    finite), ``U binds`` (blocked share > ``BLOCKED_TOL``), ``latency``, ``accuracy``
    (a NaN counts as a miss)."""
    rho, blocked = _arr(row, "rho"), _arr(row, "blocked_rate")
    p90, acc = _arr(row, "latency_p90_s"), _arr(row, "accuracy")
    with np.errstate(invalid="ignore"):
        return {report.UNSTABLE: ~(rho < 1.0),
                report.U_BINDS: ~(blocked <= report.BLOCKED_TOL),
                "latency": ~(p90 <= slo.latency_p90_s),
                "accuracy": ~(acc >= slo.accuracy)}


def meets(row: Mapping[str, Sequence[float]], slo: SLO) -> np.ndarray:
    """[S] bool: the point meets the SLO on each seed (stable, p90 and accuracy in bounds)."""
    f = failures(row, slo)
    return ~np.logical_or.reduce(list(f.values()))


def seed_capacity(rates: Sequence[float], ok: np.ndarray) -> np.ndarray:
    """[S] capacities from ``ok`` [R, S] (the point meets the SLO at each sorted rate, seed):
    the largest rate with every rate up to it met; 0 where the lightest is missed."""
    rates = np.asarray(rates, np.float64)
    ok = np.asarray(ok, bool)
    if ok.ndim != 2 or ok.shape[0] != rates.size:
        raise ValueError(f"ok must be [rates={rates.size}, seeds], got {ok.shape}")
    if np.any(np.diff(rates) <= 0):
        raise ValueError("rates must be strictly increasing")
    run = np.logical_and.accumulate(ok, axis=0)          # met at every rate so far
    n = run.sum(axis=0)                                  # how many leading rates are met
    return np.where(n > 0, rates[np.maximum(n - 1, 0)], 0.0)


def row_results(results: Mapping[float, Mapping[str, Mapping]], row: str
                ) -> tuple[list[float], list[Mapping]]:
    rates = sorted(float(r) for r in results)
    return rates, [results[r][row] for r in rates]


def capacity(results: Mapping[float, Mapping[str, Mapping[str, Sequence[float]]]], row: str,
             slo: SLO) -> dict:
    """One row's capacity from ``{rate: {row: {metric: [S]}}}``: ``{"per_seed": [S],
    "capacity": min over seeds, "censored": the capacity is the grid's top, "binds": the
    term that broke first on each seed (None where no rate broke)}``."""
    rates, rows = row_results(results, row)
    ok = np.stack([meets(r, slo) for r in rows])          # [R, S]
    caps = seed_capacity(rates, ok)
    binds = []
    for s in range(ok.shape[1]):
        bad = np.flatnonzero(~ok[:, s])
        if bad.size == 0:
            binds.append(None)
            continue
        f = failures(rows[int(bad[0])], slo)
        binds.append(next(k for k, v in f.items() if v[s]))
    cap = float(np.min(caps))
    return {"per_seed": [float(c) for c in caps], "capacity": cap,
            "censored": bool(cap >= rates[-1]), "binds": binds, "rates": rates}


def sweep(results: Mapping[float, Mapping[str, Mapping[str, Sequence[float]]]], row: str,
          ref: Mapping[str, Sequence[float]], scales: Sequence[float],
          retentions: Sequence[float], base_scale: float = 2.0, base_retention: float = 0.95
          ) -> dict:
    """Capacity of ``row`` against SLOs derived from ``ref`` (``slo_from_reference``): one per
    latency scale in ``scales`` (accuracy at ``base_retention``) and one per retention in
    ``retentions`` (latency at ``base_scale``)."""
    return {"latency_scale": {f"{s:g}": capacity(results, row, slo_from_reference(
                ref, s, base_retention))["capacity"] for s in scales},
            "retention": {f"{a:g}": capacity(results, row, slo_from_reference(
                ref, base_scale, a))["capacity"] for a in retentions}}


def ratio_cells(num: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, int]:
    """``num`` [P, S] / ``ref`` [S] per (policy sample, seed), as ``prada_jax.stats.hierarchical``'s
    [P, 1, S]; a seed whose reference capacity is 0 is NaN (dropped inside its cell). Returns
    the array and the number of dropped seeds."""
    num = np.asarray(num, np.float64)
    ref = np.asarray(ref, np.float64)
    if num.ndim != 2 or ref.shape != (num.shape[1],):
        raise ValueError(f"num must be [P, S] and ref [S], got {num.shape}, {ref.shape}")
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(ref[None, :] > 0, num / np.where(ref > 0, ref, 1.0)[None, :], np.nan)
    return x[:, None, :], int(np.sum(~(ref > 0)))


def reading(iv: Mapping[str, float]) -> str:
    """The registered reading of a capacity multiplier's interval (``lo``/``hi``: the union
    of both intervals): ``above 1``, ``below 1`` or ``unresolved``."""
    lo, hi = float(iv["lo"]), float(iv["hi"])
    if math.isfinite(lo) and lo > 1.0:
        return "above 1"
    if math.isfinite(hi) and hi < 1.0:
        return "below 1"
    return "unresolved"
