"""Confidence intervals over seeds: Student-t intervals of means and of paired per-seed ratios.

The project's one mean ± CI helper (``mean_ci``); the evals, the stage-2 report and the
multi-seed distillation summary all call it.

Every number the evals report is a mean over independent seeds (independent arrivals, channels
and policy samples) with a two-sided 95% confidence interval. With n seeds the interval is
``mean ± t_{1-α/2, n-1} · s / sqrt(n)`` (``s`` the sample standard deviation, ddof = 1).
Ratios such as "PRADA accuracy as a share of All-LLM" are computed per seed on paired runs
(both policies see the same arrivals and channels for a given seed) and then summarised the
same way, so the interval covers the seed-to-seed spread of the ratio.

The Student-t quantile is computed here (regularised incomplete beta by a continued fraction,
then bisection), so running the evals needs no SciPy; the tests check it against
``scipy.stats.t``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function, for a, b > 0 and x in [0, 1]."""
    if not (0.0 <= x <= 1.0):
        raise ValueError(f"x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    front = math.exp(log_front)
    # The continued fraction converges fast for x < (a + 1) / (a + b + 2); use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t distribution with ``df`` degrees of freedom at ``t``."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    tail = 0.5 * betainc_regularized(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_ppf(q: float, df: float) -> float:
    """Quantile of Student's t (inverse of ``t_cdf``), by bisection to ~1e-12 relative."""
    if not (0.0 < q < 1.0):
        raise ValueError(f"q must lie in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


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
        non-finite values as None: the per-row cell of ``evals.stage2``'s reports."""
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


def min_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect of a two-sided paired t-test over ``n`` seeds.

    The usual definition (e.g. Cohen, *Statistical Power Analysis*, 1988): the smallest true
    mean difference that a two-sided level-``alpha`` paired t-test rejects with probability
    ``power``, in the normal-quantile form with t quantiles,
    ``MDE = (t_{1-α/2, n-1} + t_{power, n-1}) · sd / sqrt(n)``, where ``sd`` is the standard
    deviation of the per-seed differences (ddof = 1). Same units as ``sd``; NaN for ``n < 2``
    or a non-finite ``sd``. The exact power at this effect (noncentral t) is within a point or
    two of ``power`` for n >= 5 (tests compare with ``scipy.stats.nct``).
    """
    if not (0.0 < alpha < 1.0 and 0.0 < power < 1.0):
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha}, {power}")
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    df = int(n) - 1
    return (t_ppf(1.0 - alpha / 2.0, df) + t_ppf(power, df)) * float(sd) / math.sqrt(n)


def paired_mde(a: Sequence[float], b: Sequence[float], alpha: float = 0.05,
               power: float = 0.8) -> float:
    """:func:`min_detectable_effect` of the per-seed differences ``a − b`` [S] (paired seeds;
    non-finite seeds dropped)."""
    d = np.asarray(a, np.float64).reshape(-1) - np.asarray(b, np.float64).reshape(-1)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return float("nan")
    return min_detectable_effect(float(d.std(ddof=1)), int(d.size), alpha, power)


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
