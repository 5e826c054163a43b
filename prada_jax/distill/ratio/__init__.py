"""Prefix likelihood ratios on a trajectory pool: the gap-adaptive κ, the exact-ratio turn
weighting, and the log-ratio-vs-turn diagnostic (beyond the ReOPD paper).

Notation (turns counted from t = 0, as in :mod:`prada_jax.distill.sampler`). Trajectory i of
the pool holds the teacher's recorded agent turns a_0 .. a_{K_i-1}; turn s consists of action
tokens y_j, each predicted from the history h_j before it (the teacher's own prefix). For a
student π_S and the teacher π_T (its exported log-probs, ``logp_actual``):

* per-turn gap, in nats:   c_{i,s} = Σ_{j ∈ turn s} [log π_T(y_j | h_j) − log π_S(y_j | h_j)]
  (its expectation under the teacher is the turn-level KL(π_T ‖ π_S) ≥ 0);
* prefix log-ratio:        log br_{i,t} = Σ_{s<t} Σ_{j ∈ turn s} [log π_S − log π_T]
                                         = −Σ_{s<t} c_{i,s},   log br_{i,0} = 0.

br_t is the exact importance weight of the replayed prefix, ∏_{s<t} π_θold(a_s)/π_T(a_s), that
the paper replaces with ω(t) = κ^t (Liao et al., arXiv 2607.04763, §4 Eqs. (7)–(8) and Fig. 4,
as summarised in the review ``shared/seeds/002_*``). If the gap is stationary,
log br_t ≈ −t·c̄, so the bridge-to-schedule map is κ = exp(−c̄) (γ_t = 1). Because t counts
from 0 here, br_0 = κ^0 = 1 exactly; the review's remark that Eq. (8) should read κ^{t−1} for
turns counted from 1 is the same statement.

Functions:

* :func:`token_logp_fn`, :func:`student_token_logp` — teacher-forced student log-prob of every pool token (one jitted
  forward per fixed-shape batch of whole trajectories).
* :func:`turn_gaps`, :func:`prefix_log_ratio` — c_{i,s} and log br_{i,t} per (trajectory, turn)
  pair, in pool order.
* :func:`kappa_from_gap` — κ = clip(exp(−c̄), κ_min, 1).
* :func:`exact_ratio_probs` — sampling probabilities: trajectory uniform, then turn t within it
  ∝ clip(br_{i,t}, r_min, r_max) (per-prefix, so the weight varies within a turn index).
* :func:`regress_on_turn` — ordinary least squares of log br on t: slope, intercept, R² (the
  check the paper's reviewers asked for: is log br linear in depth, and how much of its variance
  does depth explain?).
* :func:`diagnose` — all of the above for one student, as a :class:`RatioDiagnostics`.

CLI (any student HF folder, e.g. ``<workdir>/student_hf``, on a pool and its exported logits)::

    python -m prada_jax.distill.ratio --pool DIR --logits DIR --student HF_DIR [--json OUT]
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax.distill.pool import Pool
from prada_jax.distill.sampler import exact_ratio_probs, pair_index  # noqa: F401 (re-export)


# --------------------------------------------------------------------------- pure NumPy parts


def turn_gaps(pool: Pool, teacher_logp: np.ndarray, student_logp: np.ndarray) -> np.ndarray:
    """[K_total] float64 per-turn gap c_{i,s} = Σ_{turn tokens} (log π_T − log π_S) [nats].

    ``teacher_logp`` / ``student_logp``: [T] log-prob of each pool token given the trajectory
    before it (the :class:`~prada_jax.distill.teacher_table.TeacherTable` ``logp_actual``
    layout). The first token of a trajectory has no prediction and contributes nothing, as in
    the sampler's loss mask.
    """
    T = int(np.asarray(pool.tokens).shape[0])
    lt = np.asarray(teacher_logp, np.float64)
    ls = np.asarray(student_logp, np.float64)
    if lt.shape != (T,) or ls.shape != (T,):
        raise ValueError(f"log-probs must have shape [{T}] (one per pool token), got "
                         f"teacher {lt.shape} and student {ls.shape}")
    d = lt - ls
    d[np.asarray(pool.traj_offsets[:-1], np.int64)] = 0.0
    if not np.all(np.isfinite(d)):
        bad = int(np.argmax(~np.isfinite(d)))
        raise ValueError(f"non-finite log-prob difference at pool token {bad} "
                         f"(teacher {lt[bad]}, student {ls[bad]})")
    cs = np.concatenate([[0.0], np.cumsum(d)])
    return cs[np.asarray(pool.turn_ends, np.int64)] - cs[np.asarray(pool.turn_starts, np.int64)]


def prefix_log_ratio(pool: Pool, gaps: np.ndarray) -> np.ndarray:
    """[K_total] float64 log br_{i,t} = −Σ_{s<t} c_{i,s} (0 at each trajectory's first turn)."""
    gaps = np.asarray(gaps, np.float64)
    offs = np.asarray(pool.turn_offsets, np.int64)
    if gaps.shape != (int(offs[-1]),):
        raise ValueError(f"gaps must have one entry per pool turn ({int(offs[-1])}), "
                         f"got shape {gaps.shape}")
    excl = np.concatenate([[0.0], np.cumsum(gaps)])[:-1]   # Σ of all earlier pool turns
    start = np.repeat(excl[offs[:-1]], np.diff(offs))       # ... up to the trajectory's start
    return -(excl - start)


def kappa_from_gap(mean_gap: float, kappa_min: float = 1e-3) -> float:
    """κ = exp(−c̄) clipped to [kappa_min, 1] (a negative c̄, where the student out-scores the
    teacher on its own tokens, gives κ = 1: uniform)."""
    if not (0.0 < kappa_min <= 1.0):
        raise ValueError(f"kappa_min must lie in (0, 1], got {kappa_min!r}")
    if not math.isfinite(mean_gap):
        raise ValueError(f"the mean per-turn gap is not finite ({mean_gap!r})")
    return float(min(1.0, max(kappa_min, math.exp(-max(mean_gap, 0.0)))))


def regress_on_turn(turn: np.ndarray, y: np.ndarray) -> dict:
    """OLS ``y ≈ intercept + slope·t``: slope, intercept, R² and n (NaN when t is constant)."""
    t = np.asarray(turn, np.float64)
    y = np.asarray(y, np.float64)
    n = int(t.size)
    if n == 0 or t.shape != y.shape:
        raise ValueError(f"turn and y must be non-empty and of equal shape, got {t.shape} and "
                         f"{y.shape}")
    tc, yc = t - t.mean(), y - y.mean()
    stt, syy = float(tc @ tc), float(yc @ yc)
    if stt == 0.0:
        return {"slope": float("nan"), "intercept": float(y.mean()), "r2": float("nan"),
                "n": n}
    slope = float(tc @ yc) / stt
    r2 = 1.0 if syy == 0.0 else 1.0 - float(((yc - slope * tc) ** 2).sum()) / syy
    return {"slope": slope, "intercept": float(y.mean() - slope * t.mean()), "r2": r2, "n": n}


@dataclasses.dataclass
class RatioDiagnostics:
    """Pool-level likelihood-ratio statistics for one student (all in nats).

    mean_gap: c̄, mean of c_{i,s} over all pool turns; kappa_auto: clip(exp(−c̄), κ_min, 1);
    slope / intercept / r2: OLS of log br_{i,t} on t over all pairs; mean_gap_turn[t] and
    mean_log_ratio_turn[t]: means over the pairs at turn t; n_turn[t]: their count;
    gaps / log_ratio: the per-pair arrays (pool order).
    """

    mean_gap: float
    kappa_auto: float
    slope: float
    intercept: float
    r2: float
    mean_gap_turn: list
    mean_log_ratio_turn: list
    n_turn: list
    gaps: np.ndarray
    log_ratio: np.ndarray

    def summary(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("gaps")
        d.pop("log_ratio")
        return d

    def scalars(self, prefix: str = "ratio/") -> dict:
        """TensorBoard scalars: mean gap, κ_auto, slope, R², per-turn means."""
        out = {f"{prefix}mean_gap": self.mean_gap, f"{prefix}kappa_auto": self.kappa_auto,
               f"{prefix}slope": self.slope, f"{prefix}r2": self.r2}
        for t, (g, r) in enumerate(zip(self.mean_gap_turn, self.mean_log_ratio_turn)):
            out[f"{prefix}gap_turn_{t}"] = g
            out[f"{prefix}log_ratio_turn_{t}"] = r
        return {k: v for k, v in out.items() if math.isfinite(v)}


def diagnose(pool: Pool, teacher_logp: np.ndarray, student_logp: np.ndarray,
             kappa_min: float = 1e-3) -> RatioDiagnostics:
    """Per-turn gaps, prefix log-ratios, c̄ → κ, and the log-ratio-on-turn regression."""
    gaps = turn_gaps(pool, teacher_logp, student_logp)
    lr = prefix_log_ratio(pool, gaps)
    _, turn = pair_index(pool)
    reg = regress_on_turn(turn, lr)
    K = int(turn.max()) + 1
    n = np.bincount(turn, minlength=K)
    mg = np.bincount(turn, weights=gaps, minlength=K) / n
    ml = np.bincount(turn, weights=lr, minlength=K) / n
    cbar = float(gaps.mean())
    return RatioDiagnostics(mean_gap=cbar, kappa_auto=kappa_from_gap(cbar, kappa_min),
                            slope=reg["slope"], intercept=reg["intercept"], r2=reg["r2"],
                            mean_gap_turn=mg.tolist(), mean_log_ratio_turn=ml.tolist(),
                            n_turn=n.tolist(), gaps=gaps, log_ratio=lr)


# --------------------------------------------------------------------------- the student pass


_LOGP_FNS: dict = {}   # one jitted function per model graph (its compilations are reused)


def token_logp_fn(graphdef):
    """jit(params, ids [B, L], mask [B, L]) -> [B, L-1] float32 log π(ids[:, 1:] | prefix).

    Cached per model graph: students of the same architecture (equal ``graphdef``) share one
    function, so a report that diagnoses many students compiles once per shape."""

    fn = _LOGP_FNS.get(graphdef)
    if fn is not None:
        return fn

    @jax.jit
    def fn(params, ids, mask):
        logits = nnx.merge(graphdef, params)(ids, mask).astype(jnp.float32)
        lp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1)[..., 0]

    _LOGP_FNS[graphdef] = fn
    return fn


def student_token_logp(logp_fn, params, pool: Pool, batch_size: int = 64) -> np.ndarray:
    """[T] float32 teacher-forced log π_S of every pool token given its trajectory before it
    (0 at trajectory starts), with ``logp_fn = token_logp_fn(graphdef)``. Trajectories are
    right-padded to the pool's longest and run in batches of ``batch_size`` (the last one
    padded), so the forward compiles once per pool."""
    tokens = np.asarray(pool.tokens)
    offs = np.asarray(pool.traj_offsets, np.int64)
    lens = np.diff(offs)
    N, L = lens.size, int(lens.max())
    out = np.zeros(tokens.shape[0], np.float32)
    if L < 2:
        return out
    B = max(1, min(int(batch_size), N))
    for b0 in range(0, N, B):
        idx = np.arange(b0, min(b0 + B, N))
        ids = np.zeros((B, L), np.int32)
        mask = np.zeros((B, L), np.int32)
        for r, i in enumerate(idx):
            ids[r, : lens[i]] = tokens[offs[i]: offs[i + 1]]
            mask[r, : lens[i]] = 1
        lp = np.asarray(logp_fn(params, ids, mask))
        for r, i in enumerate(idx):
            out[offs[i] + 1: offs[i + 1]] = lp[r, : lens[i] - 1]
    return out


def diagnose_student(logp_fn, params, pool: Pool, table, kappa_min: float = 1e-3,
                     batch_size: int = 64) -> RatioDiagnostics:
    """:func:`diagnose` with the student's log-probs computed by ``logp_fn``
    (:func:`token_logp_fn`) and the teacher's from an exported-logits table
    (:mod:`prada_jax.distill.teacher_table`)."""
    ls = student_token_logp(logp_fn, params, pool, batch_size)
    return diagnose(pool, np.asarray(table.logp_actual), ls, kappa_min)

