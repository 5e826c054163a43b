"""The decision rules of ``studies.reopd_regime`` (README, "Setup fixed in advance" and "The
gate") and its declared GPU cost model's pricing, as pure functions: the cold start's plateau,
the lr grid's extension and choice, the registered gate, the cost sweep and the mapping of a
run's recorded counts to the model's (``prada_jax.distill.gpucost``). SYNTHETIC task.
"""
from __future__ import annotations

import math

import numpy as np

from prada_jax import latency, stats
from prada_jax.distill import gpucost

LRS = (1e-4, 3e-4, 1e-3)   # the registered pilot grid of every mode (before any extension)
GATE_OPD_MIN = 0.05     # gate: OPD's gain over the cold start >= this (and CI above 0)
GATE_SFT_MAX = 0.01     # gate: SFT continuation's gain <= this
HEADROOM_MIN = 0.10     # gate: teacher − cold start on the gate set >= this
NO_REGIME = "no distillation regime"
# the cost model's declared scenario (README, claim (b)) and sweep
COST_HW = "h100_sxm_bf16"
COST_TOOL_S = 0.5
SWEEP = dict(turns=(3, 4, 5, 6, 7, 8), tokens_per_turn=(7, 200, 500, 1000),
             latencies_s=(0.0, 0.1, 0.5, 1.0, 2.0), episodes=(1, 8, 64))


# ---------------------------------------------------------------------------- decision rules
def plateau(curve: list, tol: float, window: int, min_step: int) -> int | None:
    """The first check ``(step, success)`` at ``step >= min_step`` whose success is not above
    the best of the ``window`` checks before it by more than ``tol``; None if none is."""
    for i, (step, s) in enumerate(curve):
        if step >= min_step and i >= window:
            if s <= max(x for _, x in curve[i - window:i]) + tol:
                return int(step)
    return None


def snap13(x: float) -> float:
    """``x`` snapped, in log space, to the nearest of 1·10^k or 3·10^k."""
    k = math.floor(math.log10(x))
    cands = [m * 10.0 ** j for j in (k - 1, k, k + 1) for m in (1.0, 3.0)]
    return float(min(cands, key=lambda c: abs(math.log(c / x))))


def extend_grid(grid: tuple, means: dict, max_extend: int) -> float | None:
    """The lr to add when the best mean (ties: the smaller lr) sits at an edge of ``grid``: one
    √10 step past that edge, snapped to the 1-3 sequence; None when the best is inside or the
    side has been extended ``max_extend`` times already (``grid`` holds the extensions)."""
    base = sorted(grid)
    best = min(base, key=lambda lr: (-means[lr], lr))
    lo, hi = base[0], base[-1]
    n_lo = sum(1 for lr in base if lr < min(LRS))
    n_hi = sum(1 for lr in base if lr > max(LRS))
    if len(base) > 1 and best == lo and n_lo < max_extend:
        return snap13(lo / math.sqrt(10))
    if len(base) > 1 and best == hi and n_hi < max_extend:
        return snap13(hi * math.sqrt(10))
    return None


def choose_lr(means: dict) -> float:
    """The lr with the best mean success (ties: the smaller)."""
    return min(means, key=lambda lr: (-means[lr], lr))


def outcome_matrix(recs: list, key: str) -> np.ndarray:
    """[seeds, problems] 0/1 from the records' outcome strings under ``key``."""
    return np.array([[int(ch) for ch in r["outcomes"][key]] for r in recs], np.float64)


def gate(opd: np.ndarray, sft: np.ndarray, cold: np.ndarray, teacher: np.ndarray,
         n_boot: int = 2000) -> dict:
    """The registered gate on the gate set: ``opd``/``sft`` [seeds, problems] 0/1, ``cold``
    and ``teacher`` [problems] 0/1. Passes iff OPD's gain >= :data:`GATE_OPD_MIN` with its
    two-way bootstrap CI above 0, SFT continuation's gain <= :data:`GATE_SFT_MAX` and the
    teacher's headroom over the cold start >= :data:`HEADROOM_MIN`."""
    c = np.asarray(cold, np.float64)[None, :]
    g_opd = stats.two_way_bootstrap(opd - c, n_boot=n_boot, seed=1)
    g_sft = stats.two_way_bootstrap(sft - c, n_boot=n_boot, seed=2)
    head = float(np.mean(teacher) - np.mean(cold))
    checks = {"opd_gain": g_opd["mean"] >= GATE_OPD_MIN and g_opd["ci_low"] > 0,
              "sft_plateau": g_sft["mean"] <= GATE_SFT_MAX,
              "headroom": head >= HEADROOM_MIN}
    ok = all(checks.values())
    return {"opd_gain": g_opd, "sft_gain": g_sft, "headroom": head,
            "cold_success": float(np.mean(cold)), "teacher_success": float(np.mean(teacher)),
            "checks": checks, "passed": bool(ok),
            "outcome": "pass: the comparison runs" if ok else NO_REGIME,
            "thresholds": {"opd_min": GATE_OPD_MIN, "sft_max": GATE_SFT_MAX,
                           "headroom_min": HEADROOM_MIN}}


# ---------------------------------------------------------------------------- the cost model
def cost_sweep() -> dict:
    """The declared GPU cost model's OPD / ReOPD ratio [per supervised turn] over the sweep on
    A100 and H100, student priced as Qwen2.5-1.5B and teacher as Qwen2.5-7B (no run needed)."""
    out = {"unit": "OPD / ReOPD modelled seconds per supervised turn; break-even in seconds "
                   "of tool latency per tool round", "student": "qwen2.5-1.5b",
           "teacher": "qwen2.5-7b", "kappa": 0.6, "rows": []}
    for hw in gpucost.GPU_PROFILES:
        out["rows"] += gpucost.sweep(hw, latency.qwen25_1p5b(), latency.qwen25_7b(),
                                     kappa=0.6, **SWEEP)
    return out


def record_counts(per_update: list, mode: str, action_tokens: int) -> gpucost.Counts:
    """The trainer's recorded counts of a run, per update (mean), as cost-model counts.
    Declared mapping: OPD plays ``tool_rounds + 1`` sequential generation rounds per update
    (every tool round, then the answer), each of ``action_tokens`` decode steps at batch =
    episodes; ReOPD and SFT rows are one round (SFT generates nothing); teacher prefill =
    ``teacher_tokens_forwarded``; contexts = those tokens per supervised turn."""
    n = max(len(per_update), 1)
    tot = {k: sum(float(u.get(k, 0)) for u in per_update) / n
           for k in ("supervised_turns", "student_tokens", "teacher_tokens_forwarded",
                     "tool_rounds", "episodes")}
    turns = max(tot["supervised_turns"], 1.0)
    ctx = tot["teacher_tokens_forwarded"] / turns if tot["teacher_tokens_forwarded"] else 0.0
    if mode == "opd":
        rounds = tot["tool_rounds"] + 1
        par = max(tot["episodes"], 1.0)
        seq = tot["teacher_tokens_forwarded"] / par
    elif mode == "reopd":
        rounds, par, seq = 1.0, turns, ctx
    else:
        rounds, par, seq = 0.0, 0.0, ctx
    return gpucost.Counts(
        supervised_turns=tot["supervised_turns"], gen_rounds=rounds,
        decode_steps=rounds * action_tokens if mode != "sft" else 0.0, parallel=par,
        generated_tokens=tot["student_tokens"], decode_context=ctx / 2.0,
        student_prefill_tokens=tot["teacher_tokens_forwarded"] - tot["student_tokens"]
        if mode != "sft" else 0.0, prefill_seq_len=seq,
        teacher_prefill_tokens=tot["teacher_tokens_forwarded"], teacher_seq_len=seq,
        tool_rounds=tot["tool_rounds"] if mode == "opd" else 0.0,
        train_tokens=tot["supervised_turns"] * ctx)
