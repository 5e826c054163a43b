"""Intervals for a claim that rests on several trained policies and learner runs (issue 33).

A pooled stage-2 verdict measures a per-seed quantity ``x[p, l, s]`` (e.g. the paired
objective difference learned − λ=µ=0, PRM units) for policy sample ``p`` (a PPO seed),
learner seed ``l`` and evaluation seed ``s``. Its estimand is the mean over the distribution of
policies, learner runs and seeds, so its interval must carry all three sources of variance,
not only the seed-to-seed spread of one draw. Two intervals are computed, both over the
balanced array ``x`` [P, L, S] (NaN entries dropped inside their cell):

* :func:`hierarchical_bootstrap`: the nested (multi-stage) bootstrap of Davison & Hinkley
  (1997, §3.8): resample policies with replacement, then, inside each drawn policy, its learner
  seeds with replacement, then, inside each drawn learner run, its evaluation seeds with
  replacement; the statistic is the grand mean; percentile interval. Its variance has a closed
  form (:func:`bootstrap_variance`), which the tests compare with the Monte Carlo one. Resampling
  every stage counts the lower stages' spread again (conservative there), while the top stage
  alone gives ``(P − 1)/P`` of the between-policy variance (anti-conservative at P = 3).
* :func:`cluster_t`: the Student-t interval over the P per-policy means (P − 1 degrees of
  freedom). In a balanced design each per-policy mean already contains the learner and seed
  variance, so this interval is exact under normality for any variance split; with P = 3 it is
  wide (t = 4.30).

The pooled verdict (``studies.stage2_pooled``) calls a claim established only when *both*
intervals say so, so its false-positive rate is at most the t interval's. Its power:
:func:`policy_means_mde`.
"""
from __future__ import annotations

import math

import numpy as np

from prada_jax.stats.intervals import mean_ci
from prada_jax.stats.power import min_detectable_effect

#: Bootstrap resamples of the pooled verdict (percentile interval).
DEFAULT_RESAMPLES = 10000


def _check(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 3 or min(x.shape) < 1:
        raise ValueError(f"x must be [policies, learner seeds, eval seeds], got shape {x.shape}")
    return x


def cell_means(x) -> np.ndarray:
    """[P, L] mean over evaluation seeds of each (policy, learner seed) cell (NaN ignored)."""
    return np.nanmean(_check(x), axis=2)


def policy_means(x) -> np.ndarray:
    """[P] mean of each policy's cell means (each learner run weighs the same)."""
    return np.mean(cell_means(x), axis=1)


def grand_mean(x) -> float:
    """Mean over policies of :func:`policy_means` (the estimate every interval is around)."""
    return float(np.mean(policy_means(x)))


def hierarchical_draws(x, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """[resamples] grand means of the nested bootstrap (policies → learner seeds → eval
    seeds, each with replacement inside the unit drawn above it). NaN seeds are dropped per
    cell (a cell keeps its finite seeds); a cell with none is an error."""
    x = _check(x)
    p, l, s = x.shape
    finite = np.isfinite(x)
    if not finite.any(axis=2).all():
        raise ValueError("a (policy, learner seed) cell has no finite evaluation seed")
    rng = np.random.default_rng(seed)
    counts = finite.sum(axis=2)                                  # [P, L] finite seeds per cell
    order = np.argsort(~finite, axis=2, kind="stable")          # finite seeds first
    xs = np.take_along_axis(x, order, axis=2)
    out = []
    for start in range(0, int(resamples), 2048):                # vectorised in blocks
        n = min(2048, int(resamples) - start)
        pi = rng.integers(0, p, size=(n, p))                     # policies
        li = rng.integers(0, l, size=(n, p, l))                  # learner seeds per drawn policy
        cnt = counts[pi[..., None], li]                          # [n, P, L]
        si = (rng.random((n, p, l, s)) * cnt[..., None]).astype(np.int64)  # seeds per cell
        vals = xs[pi[..., None, None], li[..., None], si]        # [n, P, L, S]
        mask = np.arange(s) < cnt[..., None]                     # cnt draws per cell
        cm = np.sum(np.where(mask, vals, 0.0), axis=-1) / cnt
        out.append(cm.mean(axis=(1, 2)))
    out = np.concatenate(out)
    return out


def bootstrap_variance(x) -> float:
    """Exact variance of the nested bootstrap's grand mean (no Monte Carlo), for a balanced
    array without NaN: with cell means ``c[p, l]``, policy means ``m[p]`` and the plug-in
    (ddof 0) variances ``v_s[p, l]`` over seeds, ``v_l[p]`` over a policy's cell means and
    ``v_p`` over policy means,

        Var* = v_p / P + mean_p(v_l) / (P·L) + mean_{p,l}(v_s) / (P·L·S).

    (Each stage draws i.i.d. from the empirical distribution of the stage below: the law of
    total variance, applied stage by stage.)"""
    x = _check(x)
    if not np.isfinite(x).all():
        raise ValueError("bootstrap_variance needs a complete array (no NaN)")
    p, l, s = x.shape
    c = x.mean(axis=2)
    m = c.mean(axis=1)
    v_s = x.var(axis=2)
    v_l = c.var(axis=1)
    v_p = m.var()
    return float(v_p / p + v_l.mean() / (p * l) + v_s.mean() / (p * l * s))


def hierarchical_bootstrap(x, confidence: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                           seed: int = 0) -> dict:
    """``{"mean", "lo", "hi", "se", "method", "resamples", "seed"}``: percentile interval of the
    nested bootstrap (:func:`hierarchical_draws`) around :func:`grand_mean`."""
    d = hierarchical_draws(x, resamples, seed)
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(d, [a, 1.0 - a])
    return {"mean": grand_mean(x), "lo": float(lo), "hi": float(hi),
            "se": float(np.std(d, ddof=1)),
            "method": "nested bootstrap: policies, then learner seeds, then eval seeds, "
                      "each with replacement; percentile interval",
            "resamples": int(resamples), "seed": int(seed)}


def cluster_t(x, confidence: float = 0.95) -> dict:
    """``{"mean", "lo", "hi", "se", "df", "method"}``: Student-t interval over the P policy
    means (:func:`policy_means`); NaN bounds with fewer than 2 policies."""
    m = policy_means(x)
    ci = mean_ci(m, confidence)
    se = float(np.std(m, ddof=1) / math.sqrt(m.size)) if m.size > 1 else float("nan")
    return {"mean": float(ci.mean), "lo": float(ci.low), "hi": float(ci.high), "se": se,
            "df": int(m.size - 1),
            "method": "Student-t over the per-policy means (each the mean of its learner runs' "
                      "seed means)"}


def interval(x, confidence: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
             seed: int = 0) -> dict:
    """Both intervals of ``x`` [P, L, S] and their union ``lo``/``hi`` (the wider bounds: what
    the pooled verdict judges), plus the per-policy and per-cell means."""
    b = hierarchical_bootstrap(x, confidence, resamples, seed)
    t = cluster_t(x, confidence)
    lo = min(b["lo"], t["lo"]) if math.isfinite(t["lo"]) else b["lo"]
    hi = max(b["hi"], t["hi"]) if math.isfinite(t["hi"]) else b["hi"]
    return {"mean": grand_mean(x), "lo": float(lo), "hi": float(hi), "bootstrap": b,
            "cluster_t": t, "policy_means": [float(v) for v in policy_means(x)],
            "cell_means": [[float(v) for v in row] for row in cell_means(x)],
            "shape": {"policies": int(np.shape(x)[0]), "learner_seeds": int(np.shape(x)[1]),
                      "eval_seeds": int(np.shape(x)[2])}}


def policy_means_mde(x, alpha: float = 0.05, power: float = 0.8) -> float:
    """MDE of a two-sided t-test over the P policy means of ``x`` [P, L, S]
    (:func:`min_detectable_effect` of their sd, ddof = 1; policies with a NaN mean dropped;
    NaN below two)."""
    m = policy_means(x)
    m = m[np.isfinite(m)]
    if m.size < 2:
        return float("nan")
    return min_detectable_effect(float(np.std(m, ddof=1)), int(m.size), alpha, power)
