"""Bootstraps: two-way (seeds × problems), cluster, and plain resampling of rows.

* :func:`two_way_bootstrap`: paired comparisons of task success over training seeds *and*
  evaluation problems (issue 35), so that the interval covers the sampling of the evaluation
  problems as well as of the seeds. ``diff`` [S seeds, P problems] is the paired difference of
  two methods on the same seeds and problems (a single student, e.g. a cold start, is a [1, P]
  row broadcast over the seeds); the statistic is its mean. Each replicate draws S seeds and,
  within each problem set (stratum), as many problems as it holds, with replacement,
  independently (:func:`two_way_counts`); its mean is ``w_s · D · w_p / (S · P)`` with the
  draws' count vectors (:func:`explicit_replicate` is the indexing definition it equals).
  :func:`two_way_ratio_bootstrap`: a ratio of two such means on the same draws.
* :func:`cluster_group_means`: per-group means (e.g. per turn depth) of rows that come in
  clusters (e.g. episodes), resampling whole clusters.
* :func:`resample_indices`: plain row resampling (``n`` of ``n`` with replacement) for a
  statistic computed by the caller; :func:`percentile_interval` of the replicates.

The nested (policies → learner seeds → evaluation seeds) bootstrap is
:mod:`prada_jax.stats.hierarchical`. Every function takes an integer ``seed`` and draws from
``numpy.random.default_rng(seed)``: same seed, same draws.
"""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np

from prada_jax.stats.power import Z_ALPHA, Z_POWER


def multinomial_counts(rng: np.random.Generator, n: int, reps: int) -> np.ndarray:
    """[reps, n] how often each of ``n`` units is drawn in each of ``reps`` resamples of size
    ``n`` with replacement (float64)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=reps).astype(np.float64)


def tail_percents(level: float) -> tuple[float, float]:
    """The percentiles ``100·a`` and ``100·(1 − a)``, ``a = (1 − level) / 2``, of a two-sided
    percentile interval at ``level``."""
    a = (1 - level) / 2
    return 100 * a, 100 * (1 - a)


def percentile_interval(draws, percents: Sequence[float] = (2.5, 97.5),
                        method: str = "linear") -> tuple[float | None, float | None]:
    """``(low, high)`` percentiles of bootstrap replicates ``draws`` (``np.percentile`` with
    ``method``; "inverted_cdf" keeps infinite replicates infinite); ``(None, None)`` without
    replicates."""
    d = np.asarray(draws, np.float64).reshape(-1)
    if d.size == 0:
        return None, None
    return (float(np.percentile(d, percents[0], method=method)),
            float(np.percentile(d, percents[1], method=method)))


def two_way_counts(n_seeds: int, strata: Sequence[int], n_boot: int, seed: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Count vectors of the two-way bootstrap: ``ws`` [n_boot, S] over seeds, then ``wp``
    [n_boot, P] over problems drawn within each stratum in turn (sizes ``strata``), from one
    ``default_rng(seed)`` in that order."""
    rng = np.random.default_rng(seed)
    ws = multinomial_counts(rng, n_seeds, n_boot)
    wp = np.concatenate([multinomial_counts(rng, n, n_boot) for n in strata], axis=1)
    return ws, wp


def _strata(strata, P: int) -> list[int]:
    strata = list(strata) if strata else [P]
    if sum(strata) != P or min(strata) < 1:
        raise ValueError(f"strata {strata} do not add up to the {P} problems")
    return strata


def two_way_bootstrap(diff: np.ndarray, strata: Sequence[int] | None = None, *,
                      n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of ``diff`` [S, P] with a bootstrap over seeds (rows) and problems (columns).

    Args:
      strata: the sizes of the problem sets laid side by side in the columns (summing to P);
        problems are resampled within each; default one set.

    Returns ``mean``, ``ci_low``/``ci_high`` (percentile), ``se`` (the bootstrap standard
    deviation), ``mde`` = (z_{0.975} + z_{0.8}) · se (the smallest true difference this design
    detects at α = 0.05 with power 0.8), ``seed_only`` (the same with the problems fixed: what
    a seeds-only CI would say), ``n_seeds``, ``n_problems``.
    """
    d = np.asarray(diff, np.float64)
    S, P = d.shape
    strata = _strata(strata, P)
    ws, wp = two_way_counts(S, strata, n_boot, seed)
    boot = np.einsum("rs,sp,rp->r", ws, d, wp) / (S * P)
    boot_seed = ws @ d.mean(1) / S
    out = {"mean": float(d.mean()), "n_seeds": S, "n_problems": P, "strata": strata,
           "n_boot": n_boot}
    for key, b in (("", boot), ("seed_only_", boot_seed)):
        se = float(b.std(ddof=1)) if n_boot > 1 else math.nan
        out[f"{key}ci_low"], out[f"{key}ci_high"] = percentile_interval(b, tail_percents(level))
        out[f"{key}se"] = se
        out[f"{key}mde"] = (Z_ALPHA + Z_POWER) * se
    return out


def explicit_replicate(diff: np.ndarray, seed_idx: np.ndarray, prob_idx: np.ndarray) -> float:
    """One replicate by indexing (the definition the count-vector form must equal)."""
    return float(np.asarray(diff)[np.ix_(seed_idx, prob_idx)].mean())


def two_way_ratio_bootstrap(num: np.ndarray, den: np.ndarray, strata: Sequence[int] | None,
                            *, n_boot: int, seed: int,
                            percents: Sequence[float] = (2.5, 97.5)) -> dict:
    """``mean(num) / mean(den)`` (both [S, P], paired cell by cell) with a percentile interval
    from the two-way bootstrap (:func:`two_way_counts`: the same draws for both); replicates
    whose denominator is <= 0 are dropped (the ratio is undefined there) and counted.

    Returns ``ratio`` (None if ``mean(den)`` <= 0), ``ci_low``/``ci_high`` (None if every
    replicate was dropped), ``dropped_replicates``, ``n_boot``."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    S, P = num.shape
    ws, wp = two_way_counts(S, _strata(strata, P), n_boot, seed)
    nr = np.einsum("rs,sp,rp->r", ws, num, wp)
    no = np.einsum("rs,sp,rp->r", ws, den, wp)
    ok = no > 0
    lo, hi = percentile_interval(nr[ok] / no[ok], percents)
    return {"ratio": float(num.mean() / den.mean()) if den.mean() > 0 else None,
            "ci_low": lo, "ci_high": hi, "dropped_replicates": int((~ok).sum()),
            "n_boot": n_boot}


def cluster_group_means(clusters: Sequence, groups: Sequence[int], values: Sequence[float], *,
                        n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of ``values`` per group with a cluster-bootstrap percentile CI.

    Args:
      clusters: per row, its cluster id (e.g. the episode; a cluster's rows are resampled
        together: a group's rows are not independent of their cluster's other rows).
      groups: per row, its group, an integer >= 0 (e.g. the turn depth).
      values: per row, the value.

    Returns ``n`` [G] rows per group, ``mean`` [G] (NaN for an empty group), ``ci_low`` /
    ``ci_high`` [G] (percentile, ``np.nanpercentile`` over the replicates; the means without
    replicates), ``boot_n`` / ``boot_mean`` [n_boot, G] each replicate's row counts and means
    (for a statistic of the group means, e.g. a fitted slope), ``n_clusters``. Needs >= 1 row.
    """
    groups = np.asarray(groups, np.int64)
    values = np.asarray(values, np.float64)
    ids, cidx = np.unique(np.asarray(clusters), return_inverse=True)
    G = int(groups.max()) + 1
    S = np.zeros((len(ids), G))
    N = np.zeros((len(ids), G))
    np.add.at(S, (cidx, groups), values)
    np.add.at(N, (cidx, groups), 1.0)
    n, tot = N.sum(0), S.sum(0)
    mean = np.where(n > 0, tot / np.maximum(n, 1), np.nan)
    W = multinomial_counts(np.random.default_rng(seed), len(ids), n_boot)
    bn, bs = W @ N, W @ S
    bmean = np.where(bn > 0, bs / np.maximum(bn, 1e-12), np.nan)
    lo_q, hi_q = tail_percents(level)
    lo = np.nanpercentile(bmean, lo_q, axis=0) if n_boot else mean
    hi = np.nanpercentile(bmean, hi_q, axis=0) if n_boot else mean
    return {"n": n, "mean": mean, "ci_low": lo, "ci_high": hi, "boot_n": bn, "boot_mean": bmean,
            "n_clusters": int(len(ids))}


def resample_indices(n: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """``n_boot`` index vectors, each ``n`` draws from ``range(n)`` with replacement
    (``default_rng(seed).integers(0, n, n)`` in turn), for a statistic the caller computes on
    the resampled rows (e.g. seeds resampled together across methods)."""
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        yield rng.integers(0, n, n)
