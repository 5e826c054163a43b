"""Capacity under an SLO (docs/design.md §8, the headline view; issues 42 and 51): from
per-seed results at arrival rates, the largest rate (users/s per server GPU) at which a row
meets a latency and a quality target while stable.

The rule (``studies/capacity/README.md`` registers it; deviation 3 is issue 51's accuracy unit):

* stability and latency are judged **per seed**: a (row, seed) point is stable iff ρ < 1 and
  blocked by U ≤ ``evals.report.BLOCKED_TOL`` of the arrivals, and its p90 latency ≤
  ``SLO.latency_p90_s``;
* accuracy is judged on **arrivals pooled over seeds** (``POOLED``, the default): the row's
  pooled accuracy Σ_s correct_s / Σ_s arrivals_s at a rate, as a retention against the
  reference's **exact** test-pool accuracy (the LLM alone's correctness averaged over the test
  problems, computed from the traces: ``SLO.reference_accuracy``), reported with its 95 %
  interval from the nested bootstrap over seeds of the ratio estimator's cells
  (``accuracy_cells``) (``prada_jax.stats.hierarchical``; over
  policy samples too where a reading pools them). **The pass/fail rule at a rate**: the
  accuracy clause is missed iff the pooled accuracy's one-sided 95 % upper bound (the
  two-sided 90 % interval's high end, ``TEST_CONFIDENCE``) is below ``SLO.accuracy`` =
  retention × the exact reference accuracy: the row is *shown*, at the one-sided 5 % level,
  to be below the target (``accuracy_missed``). Why not the point estimate: at 8 seeds × ≈ 165
  arrivals the pooled accuracy's standard error is ≈ 0.008, so a row 0.01 above the target
  misses it at one rate in ≈ 8–12 % of draws, and a capacity asks for every rate up to it, so
  the point rule still judges noise (compounded over rates). Measured over 200 synthetic
  draws of Binomial(165, ·)/165 × 8 seeds (A = 0.95 × 0.934): a row at A + 0.01 gets a
  non-zero capacity in 100 % of draws, at A − 0.03 a zero one in 94.5 % (issue 51's noise
  targets: ≥ 90 % each, ``tests/evals/test_capacity.py``); its cost, stated beside every
  retention in the report: a row at A − 0.01 still passes a rate in ≈ 2/3 of draws and one
  at A − 0.02 in ≈ 1/4 (the clause resolves ≈ 0.02–0.03 of accuracy at 8 seeds). The same
  targets hold with Poisson(165) arrivals per seed; issue 51's share-weighted cells
  (``POOLED_SHARES``, which the studies registered before the defect was found judge by)
  pass a row at A − 0.03 in most such draws: their interval carries the arrivals' spread.
  ``PER_SEED`` is the registered rule of issue 42 (every seed's accuracy
  ≥ ``SLO.accuracy``), kept to show what it judged;
* a seed's capacity is the largest rate r such that the point meets the SLO at **every**
  measured rate ≤ r, 0 if the lightest fails (``seed_capacity``); a row's capacity is the
  minimum over seeds (the largest rate met on every seed);
* ``binding_term`` names what breaks first (``unstable``, ``U binds``, ``latency``,
  ``accuracy``) at the first failing rate of each seed.

The rates are either a grid (every row at every rate) or found per row by **bisection** on
the rate (``bisect_capacity``): between a rate the row meets and one it breaks, halving the
bracket geometrically until its ratio is ≤ 1 + ``resolution`` (5 %); the capacity is the
bracket's low end. The SLO is a rule over a reference row lightly loaded
(``slo_from_reference``): ``latency_scale`` × its mean p90 and ``retention`` × the exact
test-pool accuracy (DistServe's "SLO scale"). A capacity at the top rate is censored:
``censored`` says so.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from evals import report
from prada_jax.stats import hierarchical as hier

#: How the accuracy clause is judged: ``POOLED`` (arrivals pooled over seeds, the interval's
#: high end against the retention, the interval from ``RATIO`` cells: the default),
#: ``POOLED_SHARES`` (the same clause on issue 51's ``SHARES`` cells, which the registered
#: studies ``studies/capacity`` (deviation 3) and ``studies/frontier`` judge by: too lenient,
#: see ``accuracy_cells``) or ``PER_SEED`` (issue 42's registration).
POOLED, POOLED_SHARES, PER_SEED = "pooled", "pooled_shares", "per_seed"
ACCURACY_RULES = (POOLED, POOLED_SHARES, PER_SEED)
#: The cells of the pooled accuracy's interval (``accuracy_cells``): ``RATIO`` (the ratio
#: estimator linearised, the default) or ``SHARES`` (issue 51's share-weighted accuracies).
RATIO, SHARES = "ratio", "shares"
CELLS = (RATIO, SHARES)
#: The cells each pooled rule judges by.
RULE_CELLS = {POOLED: RATIO, POOLED_SHARES: SHARES}
#: Bisection's resolution: the bracket [met, broken] ends when hi / lo ≤ 1 + this.
RESOLUTION = 0.05
#: Resamples of the accuracy intervals (the nested bootstrap's percentile interval; fixed
#: seed 0, so a report regenerates byte for byte).
ACCURACY_RESAMPLES = 4000
#: The pooled rule's test: a rate's accuracy clause is missed iff the one-sided 95 % upper
#: bound of the pooled accuracy (the two-sided 90 % interval's high end) is below the target.
TEST_CONFIDENCE = 0.90


class SLO(NamedTuple):
    """A service-level objective: p90 end-to-end latency [s] at most ``latency_p90_s`` and
    accuracy at least ``accuracy`` (= ``retention`` × ``reference_accuracy`` where those are
    given; the pooled rule judges the retention's interval against ``retention``)."""
    latency_p90_s: float
    accuracy: float
    retention: float = float("nan")
    reference_accuracy: float = float("nan")


def slo_from_reference(ref: Mapping[str, Sequence[float]], latency_scale: float = 2.0,
                       retention: float = 0.95, reference_accuracy: float | None = None
                       ) -> SLO:
    """The SLO ``latency_scale`` × the reference's mean p90 latency and ``retention`` × the
    reference accuracy: ``reference_accuracy`` (the exact test-pool accuracy) where given,
    else the mean of ``ref``'s per-seed accuracies (issue 42's registration; ``ref``: one
    row's per-seed metrics at a light load)."""
    if not (latency_scale > 0 and 0 < retention <= 1):
        raise ValueError(f"latency_scale must be > 0 and retention in (0, 1], got "
                         f"{latency_scale}, {retention}")
    a = (float(np.nanmean(ref["accuracy"])) if reference_accuracy is None
         else float(reference_accuracy))
    if not (0 < a <= 1):
        raise ValueError(f"the reference accuracy must be in (0, 1], got {a}")
    return SLO(float(latency_scale) * float(np.nanmean(ref["latency_p90_s"])),
               float(retention) * a, float(retention), a)


def _arr(row: Mapping[str, Sequence[float]], key: str) -> np.ndarray:
    return np.asarray(row[key], np.float64)


def _weights(row: Mapping[str, Sequence[float]]) -> np.ndarray:
    """[S] each seed's arrivals (``arrivals``; 1 each where a record has none)."""
    acc = _arr(row, "accuracy")
    if "arrivals" not in row:
        return np.ones_like(acc)
    return _arr(row, "arrivals")


def pooled_accuracy(row: Mapping[str, Sequence[float]]) -> float:
    """Σ_s correct_s / Σ_s arrivals_s over the seeds with a finite accuracy and arrivals
    (correct_s = accuracy_s · arrivals_s); NaN if none."""
    acc, n = _arr(row, "accuracy"), _weights(row)
    ok = np.isfinite(acc) & (n > 0)
    return float(np.sum(acc[ok] * n[ok]) / np.sum(n[ok])) if ok.any() else float("nan")


def accuracy_cells(rows: Sequence[Mapping[str, Sequence[float]]], cells: str = RATIO
                   ) -> np.ndarray:
    """[P, 1, S] ``prada_jax.stats.hierarchical`` cells of the pooled accuracy of ``rows``
    (one per policy sample; a baseline is one row) whose mean over seeds is the row's pooled
    accuracy p = Σ correct / Σ arrivals, so that the nested bootstrap resamples seeds (the
    unit: one seed's arrivals share one load trajectory). A seed with no arrivals is NaN.

    ``RATIO`` (the default): the ratio estimator linearised, p + (correct_s − p·n_s) / mean(n)
    = p + n_s (accuracy_s − p) / mean(n): a resample's mean is Σ correct / Σ arrivals to first
    order, and only the seeds' accuracies spread it (what a bootstrap of Σ correct / Σ
    arrivals over resampled seeds gives; ``tests/evals/test_capacity.py`` checks the two).
    ``SHARES`` (issue 51's cells, kept for the studies registered with them): accuracy_s · n_s
    / mean(n), whose spread also carries the seeds' Poisson spread of arrivals: at 8 seeds ×
    ≈ 165 arrivals its interval is ≈ 4× wider than the ratio estimator's (the LLM alone at 4/s:
    [0.871, 0.973] against [0.909, 0.931]; ``studies/frontier/README.md``'s caveat)."""
    if cells not in CELLS:
        raise ValueError(f"cells must be one of {CELLS}, got {cells!r}")
    out = []
    for row in rows:
        acc, n = _arr(row, "accuracy"), _weights(row)
        ok = np.isfinite(acc) & (n > 0)
        nbar = float(np.mean(n[ok])) if ok.any() else 1.0
        if cells == SHARES:
            out.append(np.where(ok, acc * n / nbar, np.nan))
            continue
        p = float(np.sum(acc[ok] * n[ok]) / np.sum(n[ok])) if ok.any() else 0.0
        out.append(np.where(ok, p + n * (np.where(ok, acc, p) - p) / nbar, np.nan))
    return np.asarray(out, np.float64)[:, None, :]


@functools.lru_cache(maxsize=65536)
def _interval(cells: tuple, shape: tuple, confidence: float) -> tuple[float, float, float]:
    x = np.asarray(cells, np.float64).reshape(shape)
    if not np.isfinite(x).any(axis=2).all():
        return float("nan"), float("nan"), float("nan")
    iv = hier.interval(x, confidence, ACCURACY_RESAMPLES, 0)
    return float(iv["mean"]), float(iv["lo"]), float(iv["hi"])


def accuracy_interval(rows: Sequence[Mapping[str, Sequence[float]]],
                      reference_accuracy: float = float("nan"),
                      confidence: float = 0.95, cells: str = RATIO) -> dict:
    """Pooled accuracy of ``rows`` (policy samples pooled: the mean of their pooled
    accuracies) with the 95 % interval of ``prada_jax.stats.hierarchical.interval`` (nested
    bootstrap over samples then seeds, united with the cluster t over samples where there are
    ≥ 2), and the same as a retention against ``reference_accuracy``: ``{"accuracy",
    "accuracy_lo", "accuracy_hi", "retention", "retention_lo", "retention_hi"}``; ``cells`` as in ``accuracy_cells``."""
    x = accuracy_cells(rows, cells)
    mean, lo, hi = _interval(tuple(x.ravel().tolist()), x.shape, float(confidence))
    a = float(reference_accuracy)
    r = (lambda v: v / a) if (math.isfinite(a) and a > 0) else (lambda v: float("nan"))
    return {"accuracy": mean, "accuracy_lo": lo, "accuracy_hi": hi,
            "retention": r(mean), "retention_lo": r(lo), "retention_hi": r(hi)}


def accuracy_missed(row: Mapping[str, Sequence[float]], slo: SLO, cells: str = RATIO
                    ) -> bool:
    """The pooled rule: the row is *shown* below the accuracy target at this rate, i.e. its
    pooled accuracy's one-sided 95 % upper bound (the high end of the two-sided
    ``TEST_CONFIDENCE`` interval of ``cells``) < ``slo.accuracy`` (= retention × the exact reference
    accuracy); a row with no finite accuracy misses."""
    hi = accuracy_interval([row], confidence=TEST_CONFIDENCE, cells=cells)["accuracy_hi"]
    return not (hi >= slo.accuracy)


def failures(row: Mapping[str, Sequence[float]], slo: SLO, rule: str = POOLED
             ) -> dict[str, np.ndarray]:
    """Per-seed bool [S] of each way a point can miss the SLO: ``unstable`` (ρ ≥ 1 or not
    finite), ``U binds`` (blocked share > ``BLOCKED_TOL``), ``latency`` (a NaN counts as a
    miss), ``accuracy`` (``POOLED`` / ``POOLED_SHARES``: the row's ``accuracy_missed`` on that
    rule's cells, the same on every seed;
    ``PER_SEED``: the seed's accuracy < ``slo.accuracy``)."""
    if rule not in ACCURACY_RULES:
        raise ValueError(f"rule must be one of {ACCURACY_RULES}, got {rule!r}")
    rho, blocked = _arr(row, "rho"), _arr(row, "blocked_rate")
    p90, acc = _arr(row, "latency_p90_s"), _arr(row, "accuracy")
    with np.errstate(invalid="ignore"):
        a = (np.full(acc.shape, accuracy_missed(row, slo, RULE_CELLS[rule]))
             if rule in RULE_CELLS else ~(acc >= slo.accuracy))
        return {report.UNSTABLE: ~(rho < 1.0),
                report.U_BINDS: ~(blocked <= report.BLOCKED_TOL),
                "latency": ~(p90 <= slo.latency_p90_s),
                "accuracy": a}


def meets(row: Mapping[str, Sequence[float]], slo: SLO, rule: str = POOLED) -> np.ndarray:
    """[S] bool: the point meets the SLO on each seed (stable, p90 and accuracy in bounds)."""
    f = failures(row, slo, rule)
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
    """The sorted rates at which ``row`` was measured and its records there (a bisection
    measures each row at its own rates)."""
    rates = sorted(float(r) for r in results if row in results[r])
    return rates, [results[r][row] for r in rates]


def capacity(results: Mapping[float, Mapping[str, Mapping[str, Sequence[float]]]], row: str,
             slo: SLO, rule: str = POOLED) -> dict:
    """One row's capacity from ``{rate: {row: {metric: [S]}}}`` (the rates where ``row`` is
    present): ``{"per_seed": [S], "capacity": min over seeds, "censored": the capacity is the
    top rate measured, "binds": the term that broke first on each seed (None where no rate
    broke), "rates", "accuracy": the pooled accuracy and retention with its interval at the
    lightest rate, "rule"}``."""
    rates, rows = row_results(results, row)
    if not rates:
        raise ValueError(f"row {row!r} was measured at no rate")
    ok = np.stack([meets(r, slo, rule) for r in rows])    # [R, S]
    caps = seed_capacity(rates, ok)
    binds = []
    for s in range(ok.shape[1]):
        bad = np.flatnonzero(~ok[:, s])
        if bad.size == 0:
            binds.append(None)
            continue
        f = failures(rows[int(bad[0])], slo, rule)
        binds.append(next(k for k, v in f.items() if v[s]))
    cap = float(np.min(caps))
    return {"per_seed": [float(c) for c in caps], "capacity": cap,
            "censored": bool(cap >= rates[-1]), "binds": binds, "rates": rates,
            "accuracy": accuracy_interval([rows[0]], slo.reference_accuracy,
                                          cells=RULE_CELLS.get(rule, RATIO)), "rule": rule}


def sweep(results: Mapping[float, Mapping[str, Mapping[str, Sequence[float]]]], row: str,
          ref: Mapping[str, Sequence[float]], scales: Sequence[float],
          retentions: Sequence[float], base_scale: float = 2.0, base_retention: float = 0.95,
          reference_accuracy: float | None = None, rule: str = POOLED) -> dict:
    """Capacity of ``row`` against SLOs derived from ``ref`` (``slo_from_reference``, the
    accuracy anchored on ``reference_accuracy`` where given): one per latency scale in
    ``scales`` (accuracy at ``base_retention``) and one per retention in ``retentions``
    (latency at ``base_scale``)."""
    def c(s, a):
        return capacity(results, row, slo_from_reference(ref, s, a, reference_accuracy),
                        rule)["capacity"]
    return {"latency_scale": {f"{s:g}": c(s, base_retention) for s in scales},
            "retention": {f"{a:g}": c(base_scale, a) for a in retentions}}


class Probe(NamedTuple):
    """One bisection probe: the rate, whether the row met the SLO there (every seed), and
    the row's per-seed records."""
    rate: float
    met: bool
    record: dict


def bisect_capacity(measure: Callable[[float], Mapping[str, Sequence[float]]], slo: SLO,
                    lo: float, hi: float, resolution: float = RESOLUTION, rule: str = POOLED
                    ) -> dict:
    """The largest rate at which one row meets ``slo`` on every seed, by bisection on the
    rate. ``measure(rate)`` returns the row's per-seed records there. The bracket's ends are
    measured first: a miss at ``lo`` gives capacity 0 (bracket [0, lo]), a pass at ``hi`` a
    capacity of ``hi`` (censored; bracket [hi, hi]); otherwise the bracket [met, broken] is halved at its geometric mean until
    hi / lo ≤ 1 + ``resolution``, and the capacity is its low end (so the true boundary, if the
    row's pass/fail is monotone in the rate, lies within ``resolution`` above it). Returns
    ``{"capacity", "censored", "bracket": [lo, hi], "resolution", "probes": [Probe]}``."""
    if not (0 < lo < hi) or not (0 < resolution < 1):
        raise ValueError(f"need 0 < lo < hi and 0 < resolution < 1, got {lo}, {hi}, "
                         f"{resolution}")
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        rec = measure(float(rate))
        met = bool(np.all(meets(rec, slo, rule)))
        probes.append(Probe(float(rate), met, dict(rec)))
        return met

    if not probe(lo):
        return {"capacity": 0.0, "censored": False, "bracket": [0.0, float(lo)],
                "resolution": resolution, "probes": probes}
    if probe(hi):
        return {"capacity": float(hi), "censored": True, "bracket": [float(hi), float(hi)],
                "resolution": resolution, "probes": probes}
    a, b = float(lo), float(hi)
    while b / a > 1.0 + resolution:
        mid = round(math.sqrt(a * b), 4)
        if not a < mid < b:                     # rounding met an end: the bracket is done
            break
        if probe(mid):
            a = mid
        else:
            b = mid
    return {"capacity": a, "censored": False, "bracket": [a, b], "resolution": resolution,
            "probes": probes}


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
