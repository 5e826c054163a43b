"""Power of a design: minimum detectable effects (MDE) and the variance components that plan one.

* :func:`min_detectable_effect` / :func:`paired_mde` / :func:`mde_of_differences`: the MDE of a
  two-sided paired t-test over seeds, with t quantiles (:mod:`prada_jax.stats.tdist`);
* :func:`variance_components`, :func:`planned_mde`, :func:`problems_for_mde`: a paired
  difference over seeds × problems split into seed, problem and interaction variance, and the
  normal-quantile MDE (``(z_{0.975} + z_{0.8}) · se``, :data:`Z_ALPHA`, :data:`Z_POWER`) of
  another design from them (the MDE of :func:`prada_jax.stats.two_way_bootstrap`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from prada_jax.stats.tdist import t_ppf

Z_ALPHA, Z_POWER = 1.959963984540054, 0.8416212335729143   # α = 0.05 two-sided, power 0.8


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
    return mde_of_differences(d, alpha, power)


def mde_of_differences(diffs: Sequence[float] | np.ndarray, alpha: float = 0.05,
                       power: float = 0.8) -> float:
    """:func:`min_detectable_effect` of per-seed paired differences ``diffs`` [S] (their sd,
    ddof = 1; non-finite seeds dropped; NaN below two seeds)."""
    d = np.asarray(diffs, np.float64).reshape(-1)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return float("nan")
    return min_detectable_effect(float(d.std(ddof=1)), int(d.size), alpha, power)


def variance_components(diff: np.ndarray) -> dict:
    """Where a paired difference's uncertainty comes from: seeds, problems or their interaction.

    Two-way crossed random effects with one observation per cell, ``d[s, p] = m + a_s + b_p +
    e_sp``, estimated by the ANOVA method of moments (negative estimates clipped to 0):
    ``seed`` = (MS_seed − MS_res) / P, ``problem`` = (MS_problem − MS_res) / S,
    ``interaction`` = MS_res. The variance of the mean over S seeds and P problems is then
    ``seed / S + problem / P + interaction / (S · P)``; :func:`planned_mde` turns it into the
    MDE of another design. Needs S ≥ 2 and P ≥ 2.
    """
    d = np.asarray(diff, np.float64)
    S, P = d.shape
    if S < 2 or P < 2:
        raise ValueError(f"variance components need >= 2 seeds and >= 2 problems, got {S}x{P}")
    m = d.mean()
    r, c = d.mean(1), d.mean(0)
    ms_seed = P * float(((r - m) ** 2).sum()) / (S - 1)
    ms_prob = S * float(((c - m) ** 2).sum()) / (P - 1)
    res = d - r[:, None] - c[None, :] + m
    ms_res = float((res ** 2).sum()) / ((S - 1) * (P - 1))
    return {"seed": max(0.0, (ms_seed - ms_res) / P), "problem": max(0.0, (ms_prob - ms_res) / S),
            "interaction": ms_res, "n_seeds": S, "n_problems": P}


#: What the two-way bootstrap counts of the interaction: resampling seeds and problems
#: independently estimates about seed/S + problem/P + 3 · interaction/(S·P) (the "pigeonhole"
#: bootstrap's known over-count, Owen 2007, Ann. Appl. Stat. 1(1)), so it is conservative.
BOOTSTRAP_INTERACTION = 3.0


def planned_mde(comp: dict, seeds: float, problems: float,
                interaction_factor: float = 1.0) -> float:
    """MDE (α = 0.05 two-sided, power 0.8) of a design with ``seeds`` × ``problems`` from
    :func:`variance_components` (``math.inf`` allowed for either: that term vanishes).
    ``interaction_factor`` 1: the variance of the mean under the random-effects model;
    :data:`BOOTSTRAP_INTERACTION`: what :func:`two_way_bootstrap`'s MDE will report."""
    var = comp["seed"] / seeds + comp["problem"] / problems
    var += interaction_factor * comp["interaction"] / (seeds * problems)
    return (Z_ALPHA + Z_POWER) * math.sqrt(var)


def problems_for_mde(comp: dict, target: float, seeds: float,
                     interaction_factor: float = 1.0) -> float:
    """Problems needed for MDE ≤ ``target`` at ``seeds`` seeds (``math.inf``: the seed term
    alone already exceeds it); ``interaction_factor`` as in :func:`planned_mde`."""
    room = (target / (Z_ALPHA + Z_POWER)) ** 2 - comp["seed"] / seeds
    if room <= 0:
        return math.inf
    return (comp["problem"] + interaction_factor * comp["interaction"] / seeds) / room
