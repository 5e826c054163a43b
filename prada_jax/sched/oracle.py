"""Exact optimum of one slot's constrained allocation (docs/design.md §6), for tests and evaluation.

One slot: candidates ``i = 0..N-1`` (a ``valid`` mask marks real ones), each assigned one of
local (0), queue (1) or immediate (2). The slot's value is

    V(x) = Σ_i [x_i = immediate]·w_i + [x_i = queue]·w̄_i          (local is worth 0)

subject to the hard limits of this slot

    Σ_i [x_i = immediate]        ≤ free_units      (server units)
    Σ_i [x_i = immediate]·b_i    ≤ free_bw         (bandwidth, same unit as b, e.g. Hz)

``w`` and ``w̄`` are the net advantages of immediate execution / queueing over local
(reward units, e.g. PRM units minus β·seconds), ``b`` the bandwidth each request needs.
Invalid candidates are always local.

Two exact solvers, written independently so they can check each other:

* :func:`enumerate_slot`: literal enumeration of all 3^n assignments of the n valid
  candidates (NumPy, float64); for n ≤ ``MAX_ENUM`` (10 → 59 049 assignments).
* :func:`milp_slot`: ``scipy.optimize.milp`` (HiGHS) on binary variables x_imm[n], x_q[n]
  with x_imm + x_q ≤ 1; any n.

:func:`solve_slot` picks one. :func:`enumerate_lagrangian` enumerates the *relaxed* per-slot
Lagrangian for fixed multipliers (the object the threshold rule provably maximises).

scipy is imported inside the MILP function only: importing this module (or ``prada_jax``)
does not need scipy, which is a test/eval dependency (``[dev]`` extra).
Pure NumPy/host code: not jit-able, not meant for the env's hot path.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

LOCAL, QUEUE, IMMEDIATE = 0, 1, 2
MAX_ENUM = 10


class SlotSolution(NamedTuple):
    """An assignment of one slot and its value.

    decision: [N] int8 in {0 local, 1 queue, 2 immediate}; invalid candidates are 0.
    value: float, V(decision) in reward units (float64 arithmetic).
    method: which solver produced it ("enumerate" or "milp").
    """

    decision: np.ndarray
    value: float
    method: str


def _as_slot(w, w_bar, b, valid):
    w = np.asarray(w, np.float64).reshape(-1)
    w_bar = np.asarray(w_bar, np.float64).reshape(-1)
    n = w.shape[0]
    if w_bar.shape != (n,):
        raise ValueError(f"w_bar has shape {w_bar.shape}, expected ({n},) like w")
    b = np.zeros(n) if b is None else np.asarray(b, np.float64).reshape(-1)
    if b.shape != (n,):
        raise ValueError(f"b has shape {b.shape}, expected ({n},) like w")
    if np.any(b < 0):
        raise ValueError("b (bandwidth need) must be >= 0")
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool).reshape(-1)
    if valid.shape != (n,):
        raise ValueError(f"valid has shape {valid.shape}, expected ({n},) like w")
    for name, arr in (("w", w), ("w_bar", w_bar), ("b", b)):
        if not np.all(np.isfinite(arr[valid])):
            raise ValueError(f"{name} has non-finite entries for valid candidates")
    return w, w_bar, b, valid


def slot_value(decision, w, w_bar) -> float:
    """V(decision) = Σ immediate·w + queue·w̄ (float64). decision, w, w_bar: [N]."""
    d = np.asarray(decision).reshape(-1)
    w = np.asarray(w, np.float64).reshape(-1)
    w_bar = np.asarray(w_bar, np.float64).reshape(-1)
    return float(np.sum(np.where(d == IMMEDIATE, w, 0.0) + np.where(d == QUEUE, w_bar, 0.0)))


def is_feasible(decision, b, free_units, free_bw, valid=None, atol: float = 1e-9) -> bool:
    """True iff the assignment respects both hard limits and keeps invalid candidates local."""
    d = np.asarray(decision).reshape(-1)
    b = np.zeros(d.shape) if b is None else np.asarray(b, np.float64).reshape(-1)
    imm = d == IMMEDIATE
    ok = imm.sum() <= free_units and float(np.sum(b[imm])) <= free_bw * (1 + atol) + atol
    if valid is not None:
        ok = ok and bool(np.all(d[~np.asarray(valid, bool)] == LOCAL))
    return bool(ok)


def enumerate_slot(w, w_bar, b=None, free_units=np.inf, free_bw=np.inf,
                   valid=None) -> SlotSolution:
    """Exact optimum by enumerating all 3^n assignments of the n valid candidates.

    Args:
      w, w_bar: [N] net advantage of immediate / queue over local (reward units).
      b: [N] bandwidth need (same unit as ``free_bw``), None = 0.
      free_units: free server units this slot (count, may be inf).
      free_bw: free bandwidth this slot (may be inf).
      valid: [N] bool mask of real candidates, None = all.
    Returns:
      SlotSolution; ties are broken towards the first assignment in lexicographic order of
      (candidate 0's choice, candidate 1's, ...) with local < queue < immediate.
    Raises:
      ValueError if more than ``MAX_ENUM`` candidates are valid.
    """
    w, w_bar, b, valid = _as_slot(w, w_bar, b, valid)
    idx = np.flatnonzero(valid)
    n = idx.size
    if n > MAX_ENUM:
        raise ValueError(f"enumerate_slot: {n} valid candidates > MAX_ENUM={MAX_ENUM}; "
                         "use milp_slot")
    decision = np.zeros(w.shape[0], np.int8)
    if n == 0:
        return SlotSolution(decision, 0.0, "enumerate")
    # All assignments as rows of a [3^n, n] table, built digit by digit.
    table = np.array(list(itertools.product((LOCAL, QUEUE, IMMEDIATE), repeat=n)), np.int8)
    imm = table == IMMEDIATE
    que = table == QUEUE
    values = imm @ w[idx] + que @ w_bar[idx]
    units = imm.sum(axis=1)
    bw = imm @ b[idx]
    feasible = (units <= free_units) & (bw <= free_bw * (1 + 1e-12) + 1e-12)
    values = np.where(feasible, values, -np.inf)
    best = int(np.argmax(values))  # all-local (row 0) is always feasible
    decision[idx] = table[best]
    return SlotSolution(decision, float(values[best]), "enumerate")


def milp_slot(w, w_bar, b=None, free_units=np.inf, free_bw=np.inf, valid=None,
              time_limit_s: float | None = None) -> SlotSolution:
    """Exact optimum with ``scipy.optimize.milp`` (HiGHS branch and bound); any N.

    Variables: x_imm[n], x_q[n] ∈ {0, 1} for the n valid candidates; maximise
    Σ x_imm·w + x_q·w̄ s.t. x_imm + x_q ≤ 1, Σ x_imm ≤ free_units, Σ b·x_imm ≤ free_bw.
    Args as :func:`enumerate_slot`; ``time_limit_s`` caps the solver (then the result may be
    suboptimal and a RuntimeError is raised instead of returning it).
    """
    from scipy.optimize import Bounds, LinearConstraint, milp  # lazy: scipy is a [dev] extra

    w, w_bar, b, valid = _as_slot(w, w_bar, b, valid)
    idx = np.flatnonzero(valid)
    n = idx.size
    decision = np.zeros(w.shape[0], np.int8)
    if n == 0:
        return SlotSolution(decision, 0.0, "milp")
    c = -np.concatenate([w[idx], w_bar[idx]])  # milp minimises
    eye = np.eye(n)
    rows = [np.hstack([eye, eye])]
    lo = [np.full(n, -np.inf)]
    hi = [np.ones(n)]
    if np.isfinite(free_units):
        rows.append(np.concatenate([np.ones(n), np.zeros(n)])[None])
        lo.append([-np.inf])
        hi.append([float(np.floor(free_units))])
    if np.isfinite(free_bw):
        rows.append(np.concatenate([b[idx], np.zeros(n)])[None])
        lo.append([-np.inf])
        hi.append([float(free_bw)])
    cons = LinearConstraint(np.vstack(rows), np.concatenate(lo), np.concatenate(hi))
    options = {"disp": False}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    res = milp(c, constraints=cons, integrality=np.ones(2 * n), bounds=Bounds(0, 1),
               options=options)
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"milp_slot: HiGHS did not prove optimality: {res.message}")
    x = np.round(res.x).astype(bool)
    x_imm, x_q = x[:n], x[n:] & ~x[:n]
    decision[idx] = np.where(x_imm, IMMEDIATE, np.where(x_q, QUEUE, LOCAL))
    return SlotSolution(decision, slot_value(decision, w, w_bar), "milp")


def solve_slot(w, w_bar, b=None, free_units=np.inf, free_bw=np.inf, valid=None,
               method: str = "auto") -> SlotSolution:
    """Exact optimum of one slot: enumeration for ≤ ``MAX_ENUM`` valid candidates, else MILP.

    ``method``: "auto", "enumerate" or "milp".
    """
    if method not in ("auto", "enumerate", "milp"):
        raise ValueError(f"method must be 'auto', 'enumerate' or 'milp', got {method!r}")
    if method == "auto":
        n = int(np.sum(valid)) if valid is not None else int(np.size(w))
        method = "enumerate" if n <= MAX_ENUM else "milp"
    fn = enumerate_slot if method == "enumerate" else milp_slot
    return fn(w, w_bar, b, free_units, free_bw, valid)


def enumerate_lagrangian(w, w_bar, b, lambda_s: float, mu: float,
                         valid=None) -> tuple[np.ndarray, float]:
    """Maximiser of the relaxed per-slot Lagrangian for fixed multipliers, by enumeration.

    L(x) = Σ_i [imm]·(w_i − λ_s − µ·b_i) + [queue]·w̄_i  (+ λ_s·free_units + µ·free_bw, a
    constant that does not change the maximiser). Enumerates all 3^n assignments of the n
    valid candidates; ties broken towards local < queue < immediate lexicographically.
    Returns (decision [N] int8, max L without the constant).
    """
    w, w_bar, b, valid = _as_slot(w, w_bar, b, valid)
    reduced = w - lambda_s - mu * b
    sol = enumerate_slot(reduced, w_bar, None, np.inf, np.inf, valid)
    return sol.decision, sol.value


class GapReport(NamedTuple):
    """Threshold rule vs exact oracle over many slots (host-side, float64).

    ratio: [S'] value(threshold) / value(oracle) on the S' slots whose oracle value > ``eps``.
    threshold_value, oracle_value: [S] per-slot values (all slots).
    slots: S, slots evaluated; positive: S'; mean, p5 (5th percentile), min of ``ratio``;
    pooled: Σ threshold / Σ oracle over all slots; infeasible: slots where the threshold
    decision broke a hard limit (must be 0); milp_slots: slots solved by MILP.
    """

    ratio: np.ndarray
    threshold_value: np.ndarray
    oracle_value: np.ndarray
    slots: int
    positive: int
    mean: float
    p5: float
    min: float
    pooled: float
    infeasible: int
    milp_slots: int


def threshold_vs_oracle(w, w_bar, b, valid, free_units, free_bw, decision,
                        eps: float = 1e-9) -> GapReport:
    """Compares given scheduler decisions with the exact optimum, slot by slot.

    Args:
      w, w_bar, b, valid: [S, N] candidates of S slots (see the module docstring).
      free_units, free_bw: [S] free resources per slot.
      decision: [S, N] int decisions of the rule under test (e.g. the hard threshold rule
        with learned multipliers, after its feasibility repair).
      eps: slots with oracle value ≤ eps have no gain to share and are left out of ``ratio``.
    """
    w, w_bar, b = (np.asarray(a, np.float64) for a in (w, w_bar, b))
    valid = np.asarray(valid, bool)
    decision = np.asarray(decision)
    free_units = np.asarray(free_units, np.float64).reshape(-1)
    free_bw = np.asarray(free_bw, np.float64).reshape(-1)
    s = w.shape[0]
    thr = np.zeros(s)
    opt = np.zeros(s)
    infeasible = 0
    milp_count = 0
    for i in range(s):
        d = np.where(valid[i], decision[i], LOCAL)
        thr[i] = slot_value(d, w[i], w_bar[i])
        infeasible += not is_feasible(d, b[i], free_units[i], free_bw[i] * (1 + 1e-6))
        sol = solve_slot(w[i], w_bar[i], b[i], free_units[i], free_bw[i], valid[i])
        milp_count += sol.method == "milp"
        opt[i] = sol.value
    pos = opt > eps
    ratio = thr[pos] / opt[pos]
    stat = (lambda f: float(f(ratio)) if ratio.size else float("nan"))  # noqa: E731
    return GapReport(ratio=ratio, threshold_value=thr, oracle_value=opt, slots=s,
                     positive=int(pos.sum()), mean=stat(np.mean),
                     p5=stat(lambda r: np.percentile(r, 5)), min=stat(np.min),
                     pooled=float(thr.sum() / opt.sum()) if opt.sum() > 0 else float("nan"),
                     infeasible=int(infeasible), milp_slots=int(milp_count))
