"""The decision rules of ``studies.reopd_gate`` (README, "The gate" and "Endpoints"), as pure
functions of per-seed per-problem greedy outcomes, probe curves and modelled costs. SYNTHETIC
task. Statistics: ``prada_jax.stats``; the time-to-target reading is the regime study's
(``studies.reopd_regime.verdicts.time_to_gain``), fed with modelled GPU *rollout* seconds.
"""
from __future__ import annotations

import math

import numpy as np

from prada_jax import latency, stats
from prada_jax.distill import gpucost
from studies.reopd_regime import verdicts as RV
from studies.reopd_regime.rules import COST_HW, COST_TOOL_S, record_counts, snap13

G1_MIN = 0.05           # G1: OPD − cold start >= this, CI above 0
G2_MIN = 0.03           # G2: OPD − SFT continuation (equal supervised turns) >= this, CI above 0
G3_MIN = 0.10           # G3: headroom 1 − cold start >= this
MARGIN = 0.02           # non-inferiority margin of (a) and of (e2)
NO_GATE = "gate failed: no verdict"
ROLLOUT = ("decode_s", "student_prefill_s", "tool_s")   # the modelled rollout phases


def strata_of(n_sets: int, n: int) -> list:
    return [int(n)] * int(n_sets)


def gate(opd: np.ndarray, sft: np.ndarray, cold: np.ndarray, strata, n_boot: int = 2000
         ) -> dict:
    """G1, G2, G3 on the verdict seeds and sets: ``opd``/``sft`` [S, P] 0/1 (same seeds, same
    order), ``cold`` [P] 0/1. Each difference by the two-way bootstrap (seeds and, within each
    set, problems); G3's CI by the bootstrap over problems within each set (the cold start is
    one model). Passes iff all three hold."""
    c = np.asarray(cold, np.float64)
    g1 = stats.two_way_bootstrap(opd - c[None, :], strata, n_boot=n_boot, seed=21)
    g2 = stats.two_way_bootstrap(opd - sft, strata, n_boot=n_boot, seed=22)
    g3 = stats.two_way_bootstrap((1.0 - c)[None, :], strata, n_boot=n_boot, seed=23)
    for g, d in ((g1, opd - c[None, :]), (g2, opd - sft)):
        if d.shape[0] >= 2:
            g["components"] = stats.variance_components(d)
    checks = {"G1_opd_gain": bool(g1["mean"] >= G1_MIN and g1["ci_low"] > 0),
              "G2_opd_vs_sft": bool(g2["mean"] >= G2_MIN and g2["ci_low"] > 0),
              "G3_headroom": bool(g3["mean"] >= G3_MIN)}
    ok = all(checks.values())
    return {"G1": g1, "G2": g2, "G3": g3, "checks": checks, "passed": ok,
            "outcome": "pass: the endpoints are read" if ok else NO_GATE,
            "thresholds": {"G1_min": G1_MIN, "G2_min": G2_MIN, "G3_min": G3_MIN}}


def price_counts(per_update: list, mode: str, action_tokens: int, tool_s: float = COST_TOOL_S,
                 hw: str = COST_HW) -> dict:
    """A run's mean modelled GPU seconds per update (H100 bf16, student Qwen2.5-1.5B, teacher
    Qwen2.5-7B, ``tool_s`` per tool round): every phase, ``total_s`` and ``rollout_s`` (the
    student's generation and prefill plus the tool waits, :data:`ROLLOUT`)."""
    p = gpucost.price(record_counts(per_update, mode, action_tokens), gpucost.profile(hw),
                      latency.qwen25_1p5b(), latency.qwen25_7b(), tool_s)
    p["rollout_s"] = float(sum(p[k] for k in ROLLOUT))
    return p


def n_cost(updates: int, every: int, cost_reopd: float, cost_opd: float) -> int:
    """OPD's updates of the same modelled cost as ReOPD's ``updates``: the multiple of
    ``every`` nearest to ``updates × cost_reopd / cost_opd``, at least ``every``."""
    n = updates * cost_reopd / cost_opd
    return int(max(every, round(n / every) * every))


def choose_lr(means: dict) -> float:
    """The lr with the best mean (ties: the smaller)."""
    return min(means, key=lambda lr: (-means[lr], lr))


def extension(means: dict, grid: tuple, tol: float = 0.01) -> float | None:
    """The mini-pilot's one extension: when the best of ``grid`` (two lrs) beats the other by
    more than ``tol``, one factor-√10 step past it (1e-3 → 3e-4, 3e-3 → 1e-2), else None."""
    lo, hi = sorted(grid)
    if means[hi] > means[lo] + tol:
        return snap13(hi * math.sqrt(10))
    if means[lo] > means[hi] + tol:
        return snap13(lo / math.sqrt(10))
    return None


def endpoints(X: dict, cold: np.ndarray, strata, curve: dict, n_boot: int = 2000) -> dict:
    """(a) ReOPD − OPD at 400 updates (non-inferiority, :data:`MARGIN`, with the share of
    OPD's gain kept); (c) modelled GPU rollout time to 80 % of OPD's final gain, ReOPD / OPD,
    seed-bootstrap CI (``curve``: steps, [S, T] probe curves of ``opd`` and ``reopd``, the
    cold start's probe success, rollout seconds per update of each; the same reading at total
    modelled cost and at zero tool latency beside); (e1) ReOPD − SFT continuation
    (superiority); (e2) ReOPD − OPD at equal modelled cost (non-inferiority). ``X``: [S, P]
    0/1 of ``opd``, ``reopd``, ``sft_cont``, ``opd_cost``."""
    R = X["reopd"]
    out: dict = {}
    a = RV.contrast(R, X["opd"], strata, n_boot, 31)
    out["a_reopd_vs_opd"] = {**a, "margin": MARGIN, "verdict": stats.noninferior(a, MARGIN),
                             "share": RV.share_of_gain(R, X["opd"], cold, strata, n_boot, 32)}
    c = {}
    for key, costs in (("rollout", curve["rollout"]), ("total", curve["total"]),
                       ("rollout_no_tool_latency", curve["rollout_l0"])):
        c[key] = RV.time_to_gain(curve["steps"], curve["opd"], curve["reopd"], curve["cold"],
                                 costs["opd"], costs["reopd"], n_boot, 33)
        c[key]["cost_per_update_s"] = costs
    c["updates_only"] = RV.time_to_gain(curve["steps"], curve["opd"], curve["reopd"],
                                        curve["cold"], 1.0, 1.0, n_boot, 33)
    c["verdict"] = c["rollout"]["verdict"]
    hi = c["rollout"]["ci_high"]
    c["paper_4x"] = bool(hi is not None and hi < 0.25)   # the paper's "at least 4× faster"
    out["c_time_to_80"] = c
    e1 = RV.contrast(R, X["sft_cont"], strata, n_boot, 34)
    out["e1_reopd_vs_sft"] = {**e1, "verdict": stats.superior(e1)}
    if "opd_cost" in X:
        e2 = RV.contrast(R, X["opd_cost"], strata, n_boot, 35)
        out["e2_reopd_vs_opd_equal_cost"] = {**e2, "margin": MARGIN,
                                             "verdict": stats.noninferior(e2, MARGIN)}
    return out
