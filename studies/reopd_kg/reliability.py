"""The teacher's reliability by turn depth (issue 35, item 2), and the κ it implies: a
measurement of ``studies.reopd_kg`` (also read by ``studies.reopd_regime``); its statistics
(the cluster bootstrap, percentile intervals) are ``prada_jax.stats``.

ReOPD weights turn t of a replayed prefix by κ^t on the premise that the teacher's supervision
grows less reliable the deeper the prefix, roughly geometrically: log-reliability falling
linearly with depth, ``log r_t ≈ a + b·t``, so that ``r_t ∝ κ^t`` with ``κ = exp(b)``.

Measured here as the teacher's mean log-probability [nats] of the supervised action at agent
turn t (t from 0), on three kinds of rows:

* ``teacher``: the teacher's own pool trajectories (its prefix, its own sampled action);
* ``reopd``: a teacher prefix with the student's sampled action (what ReOPD supervises);
* ``opd``: the student's own episode (its prefix and action; what OPD supervises) — for each
  student given (e.g. the cold start and an OPD-trained student).

Per turn, ``logp_turn`` is the sum over the action's tokens (the log-probability of the whole
action) and ``logp_token`` the per-token mean. Confidence intervals are a cluster bootstrap
over trajectories / episodes (a turn's rows are not independent of their episode's other
turns); the fit is a least-squares line through the per-depth means weighted by their row
counts, with the bootstrap's percentile interval for the slope, the κ and a quadratic term
(its interval containing 0 is the "roughly linear" reading).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from prada_jax import stats


def _fit(depths: np.ndarray, means: np.ndarray, weights: np.ndarray, degree: int = 1
         ) -> np.ndarray:
    """Weighted least-squares polynomial coefficients, highest degree first (np.polyfit's
    order; weights are row counts, applied as sqrt to the residuals)."""
    return np.polyfit(depths, means, degree, w=np.sqrt(weights))


def kappa_of_slope(slope: float) -> float:
    """The κ of a log-reliability slope ``b`` [nats per turn]: ``exp(b)``, clipped to 1 (a
    slope >= 0 is no decay)."""
    return float(min(1.0, math.exp(slope)))


def depth_curve(clusters: Sequence, depths: Sequence[int], values: Sequence[float], *,
                n_boot: int = 1000, seed: int = 0, min_rows: int = 20,
                level: float = 0.95) -> dict:
    """Mean of ``values`` per depth with cluster-bootstrap CIs, and the linear fit.

    Args:
      clusters: per row, its trajectory / episode id (rows of one id are resampled together).
      depths: per row, its agent turn t (>= 0).
      values: per row, the measured value (e.g. the teacher's log-prob of the action) [nats].
      min_rows: depths with fewer rows are reported but left out of the fit.

    Returns a dict: ``depth`` rows (t, n, mean, ci_low, ci_high), ``fit`` (intercept, slope
    [nats/turn] with its CI, ``kappa`` = exp(slope) clipped to 1 with its CI, ``r2`` of the line
    through the fitted depths' means, ``quad`` the quadratic coefficient with its CI, depths
    used), ``n_rows``, ``n_clusters``.
    """
    if not (len(clusters) == len(depths) == len(values)):
        raise ValueError("clusters, depths and values must be equal-length")
    if len(values) == 0:
        return {"depth": [], "n_rows": 0, "n_clusters": 0, "min_rows": int(min_rows),
                "fit": None}
    g = stats.cluster_group_means(clusters, depths, values, n_boot=n_boot, seed=seed,
                                  level=level)
    n, mean, lo, hi = g["n"], g["mean"], g["ci_low"], g["ci_high"]
    bmean, bn = g["boot_mean"], g["boot_n"]
    rows = [{"t": t, "n": int(n[t]), "mean": float(mean[t]) if n[t] else None,
             "ci_low": float(lo[t]) if n[t] else None, "ci_high": float(hi[t]) if n[t] else None}
            for t in range(len(n))]
    use = np.flatnonzero(n >= min_rows)
    out = {"depth": rows, "n_rows": int(len(values)), "n_clusters": g["n_clusters"],
           "min_rows": int(min_rows), "fit": None}
    if len(use) < 2:
        return out
    t = use.astype(float)
    b1, b0 = _fit(t, mean[use], n[use])
    pred = b0 + b1 * t
    wm = np.average(mean[use], weights=n[use])
    ss_res = float(np.sum(n[use] * (mean[use] - pred) ** 2))
    ss_tot = float(np.sum(n[use] * (mean[use] - wm) ** 2))
    quad = float(_fit(t, mean[use], n[use], 2)[0]) if len(use) >= 3 else None
    slopes, quads = [], []
    for k in range(n_boot):
        m, w = bmean[k, use], bn[k, use]
        ok = np.isfinite(m) & (w > 0)
        if ok.sum() >= 2:
            slopes.append(_fit(t[ok], m[ok], w[ok])[0])
        if ok.sum() >= 3:
            quads.append(_fit(t[ok], m[ok], w[ok], 2)[0])
    def pct(xs):
        return list(stats.percentile_interval(xs, stats.tail_percents(level)))
    s_ci = pct(slopes)
    out["fit"] = {"depths": [int(x) for x in use], "intercept": float(b0), "slope": float(b1),
                  "slope_ci": s_ci, "kappa": kappa_of_slope(float(b1)),
                  "kappa_ci": [kappa_of_slope(x) if x is not None else None for x in s_ci],
                  "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else None,
                  "quad": quad, "quad_ci": pct(quads),
                  "linear": (None if not quads else
                             bool(pct(quads)[0] <= 0.0 <= pct(quads)[1]))}
    return out


def turn_logp(score: dict, spans: Sequence[tuple[int, int]]) -> list[tuple[float, int]]:
    """(sum of the teacher's log-probs over the turn's tokens [nats], tokens) per agent turn of
    one scored sequence (``score["logp_actual"][i]`` = log p of token i + 1)."""
    lp = np.asarray(score["logp_actual"], np.float64)
    return [(float(lp[a - 1:e - 1].sum()), int(e - a)) for a, e in spans]


def batch_rows(batch: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(turn, summed teacher log-prob, tokens) of the rows of an on-policy / OPD batch that
    carry a supervised token (``teacher_logp`` and ``action_mask`` [R, A])."""
    m = np.asarray(batch["action_mask"]) > 0
    keep = m.sum(-1) > 0
    lp = (np.asarray(batch["teacher_logp"], np.float64) * m).sum(-1)
    return (np.asarray(batch["turn"])[keep], lp[keep], m.sum(-1)[keep])


def episode_ids(turns: np.ndarray, start: int = 0) -> np.ndarray:
    """Episode ids of OPD rows laid out episode by episode (turn t restarts at 0 for each new
    episode): ``start`` + the number of turn-0 rows seen so far − 1."""
    return start + np.cumsum(np.asarray(turns) == 0) - 1


def teacher_rows(pool, score_fn: Callable, n: int) -> dict:
    """The ``teacher`` rows: the first ``n`` pool trajectories scored by the teacher."""
    seqs, spans = [], []
    for i in range(min(n, pool.num_trajectories)):
        base = int(pool.traj_offsets[i])
        a, b = int(pool.turn_offsets[i]), int(pool.turn_offsets[i + 1])
        seqs.append(pool.trajectory(i).tolist())
        spans.append([(int(s) - base, int(e) - base)
                      for s, e in zip(pool.turn_starts[a:b], pool.turn_ends[a:b])])
    scores = score_fn(seqs)
    rows = {"cluster": [], "t": [], "logp_turn": [], "tokens": []}
    for i, (sc, sp) in enumerate(zip(scores, spans)):
        for t, (lp, g) in enumerate(turn_logp(sc, sp)):
            rows["cluster"].append(i)
            rows["t"].append(t)
            rows["logp_turn"].append(lp)
            rows["tokens"].append(g)
    return rows


def add_batch(rows: dict, batch: dict, clusters: np.ndarray) -> None:
    """Appends an on-policy / OPD batch's supervised rows (``clusters``: one id per batch row,
    kept where the row carries a supervised token)."""
    t, lp, g = batch_rows(batch)
    keep = (np.asarray(batch["action_mask"]) > 0).sum(-1) > 0
    clusters = np.asarray(clusters)[keep]
    if (clusters < 0).any():
        raise ValueError("a supervised row without a cluster id")
    rows["cluster"] += [int(c) for c in clusters]
    rows["t"] += [int(x) for x in t]
    rows["logp_turn"] += [float(x) for x in lp]
    rows["tokens"] += [int(x) for x in g]


def curves(rows: dict, **kw) -> dict:
    """:func:`depth_curve` of one source's rows, per turn and per token."""
    g = np.maximum(np.asarray(rows["tokens"], np.float64), 1)
    return {"per_turn": depth_curve(rows["cluster"], rows["t"], rows["logp_turn"], **kw),
            "per_token": depth_curve(rows["cluster"], rows["t"],
                                     np.asarray(rows["logp_turn"]) / g, **kw)}
