"""Paired comparisons of task success over training seeds *and* evaluation problems (issue 35):
a two-way bootstrap, so that the confidence interval covers the sampling of the evaluation
problems as well as of the training seeds (the issue-24 CIs covered the seeds only).

``X_a``, ``X_b``: 0/1 success arrays [S seeds, P problems] of two methods on the same seeds and
problems (a single student, e.g. a cold start, is a [1, P] row broadcast over the seeds). The
statistic is the mean paired difference over seeds and problems. Each bootstrap replicate draws
S seeds and, within each problem set (stratum), as many problems as it holds, with replacement,
independently; its mean is ``w_s · D · w_p / (S · P)`` with the draws' count vectors.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Z_ALPHA, Z_POWER = 1.959963984540054, 0.8416212335729143   # α = 0.05 two-sided, power 0.8


def _counts(rng: np.random.Generator, n: int, reps: int) -> np.ndarray:
    return rng.multinomial(n, np.full(n, 1.0 / n), size=reps).astype(np.float64)


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
    strata = list(strata) if strata else [P]
    if sum(strata) != P or min(strata) < 1:
        raise ValueError(f"strata {strata} do not add up to the {P} problems")
    rng = np.random.default_rng(seed)
    ws = _counts(rng, S, n_boot)
    wp = np.concatenate([_counts(rng, n, n_boot) for n in strata], axis=1)
    boot = np.einsum("rs,sp,rp->r", ws, d, wp) / (S * P)
    boot_seed = ws @ d.mean(1) / S
    a = (1 - level) / 2
    out = {"mean": float(d.mean()), "n_seeds": S, "n_problems": P, "strata": strata,
           "n_boot": n_boot}
    for key, b in (("", boot), ("seed_only_", boot_seed)):
        se = float(b.std(ddof=1)) if n_boot > 1 else math.nan
        out[f"{key}ci_low"] = float(np.percentile(b, 100 * a))
        out[f"{key}ci_high"] = float(np.percentile(b, 100 * (1 - a)))
        out[f"{key}se"] = se
        out[f"{key}mde"] = (Z_ALPHA + Z_POWER) * se
    return out


def explicit_replicate(diff: np.ndarray, seed_idx: np.ndarray, prob_idx: np.ndarray) -> float:
    """One replicate by indexing (the definition the count-vector form must equal)."""
    return float(np.asarray(diff)[np.ix_(seed_idx, prob_idx)].mean())


def noninferior(d: dict, margin: float) -> str:
    """pass if the CI's lower bound is above −margin, fail if its upper bound is below it."""
    return ("pass" if d["ci_low"] > -margin else "fail" if d["ci_high"] < -margin
            else "unresolved")


def superior(d: dict) -> str:
    """pass if the CI lies above 0, fail if below, else unresolved."""
    return "pass" if d["ci_low"] > 0 else "fail" if d["ci_high"] < 0 else "unresolved"


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
