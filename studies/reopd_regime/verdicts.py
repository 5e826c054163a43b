"""The registered claims of ``studies.reopd_regime`` (README, "Claims, decision rules"), as
pure functions of per-seed per-problem outcomes, learning curves and modelled costs. They run
only after the gate passed; nothing here decides the gate.

Outcomes: ``X[name]`` [S seeds, P problems] 0/1 (greedy success on the verdict sets laid side by
side, ``strata`` their sizes), the same seeds in the same order for every method; ``cold`` [P]
the cold start's. Statistics: ``prada_jax.stats`` (two-way bootstrap, variance components,
MDE).
"""
from __future__ import annotations

import math

import numpy as np

from prada_jax import stats

MARGIN = 0.02           # non-inferiority margin of (a), (b), the κ reading beside (d)
MDE_TARGET = 0.02
LEVEL = 0.8             # (c): time to this share of OPD's final gain
R = "reopd_k0.6"        # the verdicts' ReOPD


def contrast(a: np.ndarray, b: np.ndarray, strata, n_boot: int, seed: int) -> dict:
    """``a − b`` by the two-way bootstrap, with the variance components beside (≥ 2 seeds)."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    out = stats.two_way_bootstrap(d, strata, n_boot=n_boot, seed=seed)
    if d.shape[0] >= 2 and d.shape[1] >= 2:
        out["components"] = stats.variance_components(d)
    out["mde_target"] = MDE_TARGET
    out["powered"] = bool(out["mde"] <= MDE_TARGET)
    return out


def _read(d: dict, rule: str) -> str:
    """An unresolved verdict says when the design lacked power."""
    if rule == "unresolved" and not d["powered"]:
        return f"unresolved (MDE {d['mde']:.3f} > {MDE_TARGET}: the design lacked power)"
    return rule


def share_of_gain(r: np.ndarray, o: np.ndarray, cold: np.ndarray, strata, n_boot: int,
                  seed: int) -> dict:
    """(R − C) / (O − C), the share of OPD's gain ReOPD keeps, with a percentile CI from the
    two-way bootstrap (seeds and, within each stratum, problems resampled together for both
    methods); replicates whose OPD gain is <= 0 are dropped (their share is undefined) and
    counted."""
    r, o = np.asarray(r, np.float64), np.asarray(o, np.float64)
    c = np.asarray(cold, np.float64)[None, :]
    b = stats.two_way_ratio_bootstrap(r - c, o - c, strata, n_boot=n_boot, seed=seed)
    return {"share": b["ratio"], "ci_low": b["ci_low"], "ci_high": b["ci_high"],
            "dropped_replicates": b["dropped_replicates"], "n_boot": n_boot}


def first_reach(steps, mean_curve, level: float) -> int | None:
    """The first step whose value is >= ``level`` (None if none is)."""
    for s, v in zip(steps, mean_curve):
        if v >= level - 1e-12:
            return int(s)
    return None


def time_to_gain(steps, opd: np.ndarray, reopd: np.ndarray, cold: float, cost_opd: float,
                 cost_reopd: float, n_boot: int, seed: int) -> dict:
    """(c): on the curves (``opd``/``reopd`` [S seeds, T points] success at ``steps``, the same
    seeds), the level C + 0.8 (O_last − C) from OPD's mean curve, each method's first step at
    or above it on its mean curve, in modelled cost (steps × cost per update), and the ratio
    ReOPD / OPD with a seed-bootstrap CI (seeds resampled together; a replicate where ReOPD
    never reaches the level counts as an infinite ratio). pass if the CI lies below 1, fail
    if above 1 or ReOPD's mean curve never reaches the level, else unresolved."""
    opd, reopd = np.asarray(opd, np.float64), np.asarray(reopd, np.float64)
    S = opd.shape[0]

    def one(o, r):
        level = cold + LEVEL * (o.mean(0)[-1] - cold)
        to, tr = first_reach(steps, o.mean(0), level), first_reach(steps, r.mean(0), level)
        if to is None or to == 0:
            return level, to, tr, None
        return level, to, tr, (math.inf if tr is None else (tr * cost_reopd) / (to * cost_opd))

    level, to, tr, ratio = one(opd, reopd)
    reps = []
    for idx in stats.resample_indices(S, n_boot, seed):
        x = one(opd[idx], reopd[idx])[3]
        if x is not None:
            reps.append(x)
    # inverted-CDF percentiles: no interpolation, so infinite replicates stay infinite
    lo, hi = stats.percentile_interval(reps, method="inverted_cdf")
    if tr is None:
        verdict = "fail (ReOPD's mean curve never reaches the level)"
    elif hi is not None and hi < 1:
        verdict = "pass"
    elif lo is not None and lo > 1:
        verdict = "fail"
    else:
        verdict = "unresolved"
    return {"level": level, "opd_step": to, "reopd_step": tr,
            "opd_cost": None if to is None else to * cost_opd,
            "reopd_cost": None if tr is None else tr * cost_reopd, "ratio": ratio,
            "ci_low": lo, "ci_high": hi, "verdict": verdict}


def verdicts(X: dict, cold: np.ndarray, strata, tool_calls: dict, n_boot: int = 2000,
             curve: dict | None = None) -> dict:
    """Claims (a), (b) (when ``X`` holds ``opd_cost``), (c) (when ``curve`` is given: steps,
    per-method [S, T] arrays, the cold start's probe success and the modelled cost per update
    of ``opd`` and ``reopd_k0.6``), (d), (e), (f) and the one-sided budget check."""
    c = np.asarray(cold, np.float64)[None, :]
    out: dict = {}
    a = contrast(X[R], X["opd"], strata, n_boot, 1)
    out["a_equal_turns"] = {**a, "verdict": _read(a, stats.noninferior(a, MARGIN)),
                            "share": share_of_gain(X[R], X["opd"], cold, strata, n_boot, 11)}
    if "opd_cost" in X:
        b = contrast(X[R], X["opd_cost"], strata, n_boot, 2)
        out["b_equal_cost"] = {**b, "verdict": _read(b, stats.noninferior(b, MARGIN)),
                               "share": share_of_gain(X[R], X["opd_cost"], cold, strata,
                                                      n_boot, 12)}
    if curve is not None:
        out["c_time_to_80"] = time_to_gain(curve["steps"], curve["opd"], curve[R],
                                           curve["cold"], curve["cost"]["opd"],
                                           curve["cost"][R], n_boot, 13)
    d = contrast(X[R], X["reopd_k1"], strata, n_boot, 3)
    out["d_kappa"] = {**d, "verdict": _read(d, stats.superior(d)),
                      "noninferior_reading": stats.noninferior(d, MARGIN)}
    if "reopd_k0.8" in X:
        out["d_kappa_0.6_vs_0.8"] = contrast(X[R], X["reopd_k0.8"], strata, n_boot, 4)
    e = contrast(X[R], X["sft_cont"], strata, n_boot, 5)
    out["e_vs_sft"] = {**e, "verdict": _read(e, stats.superior(e))}
    reopd_calls = {k: v for k, v in tool_calls.items() if k.startswith("reopd")}
    out["f_tool_calls"] = {"reopd": reopd_calls, "opd": tool_calls.get("opd", 0),
                           "verdict": "pass" if all(v == 0 for v in reopd_calls.values())
                           and tool_calls.get("opd", 0) > 0 else "fail"}
    moved = {k: contrast(x, np.repeat(c, len(x), 0), strata, n_boot, 6) for k, x in X.items()}
    out["moved"] = moved
    out["budget_moved"] = any(m["ci_low"] > 0 for m in moved.values())   # one-sided
    if not out["budget_moved"]:
        out["budget_note"] = "the budget did not move the student: null results are not " \
                             "equivalence"
    return out
