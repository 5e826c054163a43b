"""Confidence intervals over seeds: Student-t intervals of means and of paired per-seed ratios.

The project's one mean ± CI helper (``mean_ci``); the evals, the stage-2 report and the
multi-seed distillation summary all call it.

Every number the evals report is a mean over independent seeds (independent arrivals, channels
and policy samples) with a two-sided 95% confidence interval. With n seeds the interval is
``mean ± t_{1-α/2, n-1} · s / sqrt(n)`` (``s`` the sample standard deviation, ddof = 1).
Ratios such as "PRADA accuracy as a share of All-LLM" are computed per seed on paired runs
(both policies see the same arrivals and channels for a given seed) and then summarised the
same way, so the interval covers the seed-to-seed spread of the ratio.

The Student-t quantile comes from :mod:`prada_jax.stats.tdist` (no SciPy at run time). Also
here: the decision rules read off an interval (:func:`noninferior`, :func:`superior`) and the
knee of a cost curve (:func:`find_knee`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from prada_jax.stats.tdist import t_ppf


@dataclass(frozen=True)
class MeanCI:
    """Mean over seeds with a two-sided confidence interval.

    ``half_width`` is NaN when fewer than two finite samples exist (no interval possible).
    """

    mean: float
    low: float
    high: float
    half_width: float
    n: int
    confidence: float = 0.95

    def to_dict(self) -> dict:
        return {"mean": self.mean, "ci_low": self.low, "ci_high": self.high,
                "ci_half_width": self.half_width, "n": self.n, "confidence": self.confidence}

    def to_json_dict(self) -> dict:
        """``to_dict`` with every non-finite float (an undefined bound or mean) as None, so the
        result is strict JSON."""
        return {k: finite_or_none(v) for k, v in self.to_dict().items()}

    def to_ci95_dict(self) -> dict:
        """``{"mean", "ci95", "n"}`` (``ci95``: the half-width, for an interval built at 0.95),
        non-finite values as None: the per-row cell of ``studies.stage2_verdict``'s reports."""
        return {"mean": finite_or_none(float(self.mean)),
                "ci95": finite_or_none(float(self.half_width)), "n": self.n}

    def fmt(self, digits: int = 3, scale: float = 1.0) -> str:
        """``mean ± half`` (times ``scale``), e.g. ``0.842 ± 0.011``."""
        if self.n == 0 or not math.isfinite(self.mean):
            return "n/a"
        m = self.mean * scale
        if not math.isfinite(self.half_width):
            return f"{m:.{digits}f}"
        return f"{m:.{digits}f} ± {self.half_width * scale:.{digits}f}"


def finite_or_none(v):
    """``v`` unchanged unless it is a non-finite Python float (NaN, ±inf), which becomes None."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def mean_ci(samples: Sequence[float] | np.ndarray, confidence: float = 0.95) -> MeanCI:
    """Student-t confidence interval of the mean of ``samples`` [S] (one value per seed).

    Non-finite samples are dropped (a seed in which the metric is undefined, e.g. p95 latency
    of a run in which nobody finished). Returns NaN bounds when fewer than two remain.
    """
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        nan = float("nan")
        return MeanCI(nan, nan, nan, nan, 0, confidence)
    m = float(x.mean())
    if n == 1:
        return MeanCI(m, float("nan"), float("nan"), float("nan"), 1, confidence)
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    half = t_ppf(0.5 + confidence / 2.0, n - 1) * sem
    return MeanCI(m, m - half, m + half, half, n, confidence)


def paired_diff_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                   confidence: float = 0.95) -> MeanCI:
    """Student-t CI of the mean per-seed difference ``a[s] − b[s]`` (paired seeds; a seed with
    a non-finite value in either is dropped, as in :func:`mean_ci`)."""
    x = np.asarray(a, np.float64).reshape(-1)
    y = np.asarray(b, np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"paired difference needs equal seed counts, got {x.shape} and {y.shape}")
    return mean_ci(x - y, confidence)


def paired_ratio_ci(numerator: Sequence[float], denominator: Sequence[float],
                    confidence: float = 0.95) -> MeanCI:
    """CI of the mean of per-seed ratios ``numerator[s] / denominator[s]`` (paired seeds).

    Args:
      numerator, denominator: [S] per-seed values of two policies run on the same seeds.
    Seeds with a zero or non-finite denominator are dropped.
    """
    a = np.asarray(numerator, dtype=np.float64).reshape(-1)
    b = np.asarray(denominator, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"paired ratio needs equal seed counts, got {a.shape} and {b.shape}")
    ok = np.isfinite(a) & np.isfinite(b) & (b != 0)
    return mean_ci(a[ok] / b[ok], confidence)


def _bounds(d: dict) -> tuple:
    return d.get("ci_low"), d.get("ci_high")


def noninferior(d: dict, margin: float) -> str:
    """Non-inferiority by an interval ``d`` (``ci_low``/``ci_high`` of a difference a − b):
    "pass" if its lower bound is above −``margin``, "fail" if its upper bound is below it,
    else (or without bounds: None) "unresolved"."""
    lo, hi = _bounds(d)
    if lo is None or hi is None:
        return "unresolved"
    return "pass" if lo > -margin else ("fail" if hi < -margin else "unresolved")


def superior(d: dict) -> str:
    """Superiority by an interval ``d``: "pass" if it lies above 0, "fail" if below, else (or
    without bounds) "unresolved"."""
    lo, hi = _bounds(d)
    if lo is None or hi is None:
        return "unresolved"
    return "pass" if lo > 0 else ("fail" if hi < 0 else "unresolved")


def find_knee(xs: Sequence[float], ys: Sequence[float], rel_tol: float = 0.05) -> float | None:
    """Smallest x beyond which y (a cost such as latency, lower is better) improves by < rel_tol.

    Scans the grid ``xs`` in increasing order and returns the first ``x_i`` such that every
    later point improves on ``y_i`` by less than ``rel_tol`` (relative to ``y_i``): for all
    j > i, ``(y_i - y_j) / |y_i| < rel_tol``. Returns the last grid point when only it
    qualifies, and None for an empty grid or a non-finite curve.
    """
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"xs and ys need the same shape, got {x.shape} and {y.shape}")
    if x.size == 0 or not np.all(np.isfinite(y)):
        return None
    order = np.argsort(x)
    x, y = x[order], y[order]
    for i in range(x.size):
        later = y[i + 1:]
        if later.size == 0:
            return float(x[i])
        scale = abs(y[i]) if y[i] != 0 else 1.0
        if np.all((y[i] - later) / scale < rel_tol):
            return float(x[i])
    return float(x[-1])
