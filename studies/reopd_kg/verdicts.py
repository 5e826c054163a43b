"""The registered rules of ``studies.reopd_kg`` (its README: rules (a), (c), (d), (e)) as
pure functions of per-seed per-problem outcomes: each method's seeds × problems 0/1 table, the
two-way bootstrap of a paired difference (``prada_jax.stats``) and, beside it, where its
variance comes from and the design that would reach the margin. ``s``: the study's sizes
(``studies.reopd_kg.Sizes``: ``eval_sets``, ``n_eval``, ``kappas``, ``n_boot``,
``registered_seeds``). SYNTHETIC task.
"""
from __future__ import annotations

import math

import numpy as np

from prada_jax import stats

MARGIN = 0.02           # non-inferiority margin of rules (a) and (d) [task success]


def success_matrix(run: dict, sets) -> np.ndarray:
    """[seeds, problems of every set side by side] 0/1 from a run's outcome strings."""
    return np.array([[int(ch) for es in sets for ch in run["outcomes"][sd][str(es)]]
                     for sd in sorted(run["outcomes"], key=int)], np.float64)


def _cold_row(cold: dict, sets) -> np.ndarray:
    return np.array([[int(ch) for es in sets for ch in cold["outcomes"][str(es)]]], np.float64)


def paired_diff(a: np.ndarray, b: np.ndarray, strata, s, seed: int) -> dict:
    """The two-way bootstrap of ``a − b`` and, with ≥ 2 seeds, where its variance comes from
    (``components``: seed, problem, interaction) with the design that would reach an MDE of
    :data:`MARGIN` (``plan``): a diagnostic beside the registered rules, not a rule."""
    d = a - b
    out = stats.two_way_bootstrap(d, strata, n_boot=s.n_boot, seed=seed)
    S, P = d.shape
    if S >= 2 and P >= 2:
        comp = stats.variance_components(d)
        out["components"] = comp
        k = stats.BOOTSTRAP_INTERACTION   # the registered MDE is the bootstrap's
        out["plan"] = {"mde_this_design": stats.planned_mde(comp, S, P, k),
                       "mde_this_design_model": stats.planned_mde(comp, S, P),
                       "mde_infinite_seeds": stats.planned_mde(comp, math.inf, P, k),
                       "mde_infinite_problems": stats.planned_mde(comp, S, math.inf, k),
                       "problems_for_margin": _finite(stats.problems_for_mde(comp, MARGIN, S, k)),
                       "interaction_factor": k, "margin": MARGIN}
    return out


def _finite(x: float):
    return None if math.isinf(x) else x


def verdicts(runs: dict, cold: dict, s) -> dict:
    """Rules (a), (c), (d), (e) and each method's change from the cold start, on the pooled
    sets (the verdict) and on each set alone (reported)."""
    k0 = f"reopd_k{s.kappas[0]:g}"
    k1 = f"reopd_k{s.kappas[-1]:g}" if len(s.kappas) > 1 else None
    out: dict = {}
    scopes = [("pooled", tuple(s.eval_sets))] + [(f"set{es}", (es,)) for es in s.eval_sets]
    for scope, sets in scopes:
        st = [s.n_eval] * len(sets)
        X = {k: success_matrix(r, sets) for k, r in runs.items()}
        v = {"a_equal_turns": paired_diff(X[k0], X["opd"], st, s, 1),
             "c_vs_sft": paired_diff(X[k0], X["sft_cont"], st, s, 2)}
        v["a_equal_turns"]["verdict"] = stats.noninferior(v["a_equal_turns"], MARGIN)
        v["c_vs_sft"]["verdict"] = stats.superior(v["c_vs_sft"])
        if k1:
            v["d_kappa"] = paired_diff(X[k0], X[k1], st, s, 3)
            v["d_kappa"]["verdict"] = stats.noninferior(v["d_kappa"], MARGIN)
        c = _cold_row(cold, sets)
        v["moved"] = {k: {**paired_diff(x, np.repeat(c, len(x), 0), st, s, 4),
                          "success": float(x.mean())} for k, x in X.items()}
        v["cold_success"] = float(c.mean())
        out[scope] = v
    ns = len(next(iter(runs.values()))["outcomes"])
    if ns < max(2, s.registered_seeds):   # fewer seeds than registered: descriptive only
        why = "1 seed" if ns == 1 else f"{ns} of {s.registered_seeds} registered seeds"
        for scope in [k for k in out if k.startswith(("pooled", "set"))]:
            for rule in ("a_equal_turns", "c_vs_sft", "d_kappa"):
                if rule in out[scope]:
                    out[scope][rule]["verdict"] = f"no verdict ({why})"
    calls = {k: r["tool_calls"] for k, r in runs.items() if k.startswith("reopd")}
    out["e_tool_calls"] = {"reopd": calls, "opd": runs["opd"]["tool_calls"],
                           "verdict": "pass" if all(x == 0 for x in calls.values())
                           and runs["opd"]["tool_calls"] > 0 else "fail"}
    p = out["pooled"]
    out["budget_moved"] = any(m["ci_low"] > 0 or m["ci_high"] < 0 for m in p["moved"].values())
    return out
