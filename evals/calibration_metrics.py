"""PRM calibration metrics of a trace set: step-gain AUC, reliability bins and ECE (NumPy only).

The question (docs/design.md §2, the reviews' load-bearing premise): does the PRM's step gain
``PRM(x_{k+1}) − PRM(x_k)`` track whether the solution ends correct? For every candidate step
(node n, candidate c ∈ {0 = SLM draft, 1 = LLM step}) of a trace set we take

* the score ``cand_prm[n, c]`` (probability-like) and the gain ``cand_prm[n, c] − prm[n]``;
* the label: whether the solution that takes this step and is then *continued by one fixed
  policy* ends with a correct answer. The continuation follows candidate ``follow`` (0 = keep
  every SLM draft, the default; 1 = always the LLM step) and uses the trace's ``fallback``
  successor where that child was not expanded, exactly as the env does.

Metrics: the AUC (probability that a random correct-labelled step has a higher value than a
random incorrect-labelled one, ties count ½) of the gain and of the score, and the reliability
diagram (equal-width bins of the score against the observed correct frequency) with its
expected calibration error.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from prada_jax.traces.format import TraceSet


def continuation_labels(traces: TraceSet, follow: int = 0) -> np.ndarray:
    """Final correctness of each candidate step when the solution is continued by ``follow``.

    Args:
      traces: a trace set (N nodes).
      follow: candidate taken after the labelled step (0 = SLM draft, 1 = LLM step).
    Returns:
      labels: [N, 2] uint8, 1 if the path ends with a correct answer.
    """
    if follow not in (0, 1):
        raise ValueError(f"follow must be 0 or 1, got {follow!r}")
    child = np.asarray(traces.child)
    fallback = np.asarray(traces.fallback)
    terminal = np.asarray(traces.terminal).astype(bool)
    correct = np.asarray(traces.correct).astype(np.uint8)
    depth = np.asarray(traces.depth)
    n = child.shape[0]
    succ = np.where(child >= 0, child, fallback[:, None])   # [N, 2]
    labels = np.zeros((n, 2), np.uint8)
    value = np.zeros(n, np.uint8)                            # V[n] = labels[n, follow]
    # Edges go from depth k to k + 1, so deepest-first order sees every successor first.
    for d in range(int(depth.max()), -1, -1):
        ids = np.nonzero(depth == d)[0]
        nxt = succ[ids]
        lab = np.where(terminal[ids], correct[ids], value[np.maximum(nxt, 0)])
        labels[ids] = lab
        value[ids] = lab[:, follow]
    return labels


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` [K] for binary ``labels`` [K] (ties count ½).

    Computed from average ranks (the Mann–Whitney U statistic). NaN if one class is empty.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(bool)
    if s.shape != y.shape:
        raise ValueError(f"scores and labels need the same size, got {s.shape} and {y.shape}")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    ranks = np.empty(s.size, np.float64)
    # Average rank (1-based) for each block of tied scores.
    starts = np.r_[0, np.nonzero(np.diff(sorted_s))[0] + 1]
    ends = np.r_[starts[1:], s.size]
    for a, b in zip(starts, ends):
        ranks[order[a:b]] = 0.5 * (a + 1 + b)
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


class Reliability(NamedTuple):
    """Reliability diagram data for B equal-width bins over [0, 1]."""

    edges: np.ndarray       # [B + 1]
    count: np.ndarray       # [B] candidates per bin
    mean_pred: np.ndarray   # [B] mean score in the bin (NaN if empty)
    frac_pos: np.ndarray    # [B] observed correct frequency (NaN if empty)
    ece: float              # sum_b count_b / K * |frac_pos_b − mean_pred_b|


def reliability(prob: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> Reliability:
    """Bins ``prob`` [K] (in [0, 1]) and compares it with ``labels`` [K] per bin."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    p = np.asarray(prob, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.floor(p * n_bins).astype(np.int64), 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins).astype(np.int64)
    sum_p = np.bincount(idx, weights=p, minlength=n_bins)
    sum_y = np.bincount(idx, weights=y, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pred = np.where(count > 0, sum_p / np.maximum(count, 1), np.nan)
        frac_pos = np.where(count > 0, sum_y / np.maximum(count, 1), np.nan)
    filled = count > 0
    ece = float(np.sum(count[filled] / max(p.size, 1)
                       * np.abs(frac_pos[filled] - mean_pred[filled])))
    return Reliability(edges, count, mean_pred, frac_pos, ece)


def calibration_report(traces: TraceSet, follow: int = 0, n_bins: int = 10) -> dict:
    """All calibration numbers of one trace set (see the module docstring).

    Returns a JSON-ready dict: ``auc_step_gain``, ``auc_prm_score``, ``auc_step_gain_slm`` /
    ``_llm`` (candidates 0 / 1 only), ``ece``, ``reliability`` (bins), ``n_steps``,
    ``positive_rate``, ``follow``.
    """
    labels = continuation_labels(traces, follow)
    cand = np.asarray(traces.cand_prm, np.float64)
    gain = cand - np.asarray(traces.prm, np.float64)[:, None]
    rel = reliability(cand.reshape(-1), labels.reshape(-1), n_bins)
    return {
        "follow": "slm" if follow == 0 else "llm",
        "n_steps": int(labels.size),
        "positive_rate": float(labels.mean()),
        "auc_step_gain": auc(gain.reshape(-1), labels.reshape(-1)),
        "auc_step_gain_slm": auc(gain[:, 0], labels[:, 0]),
        "auc_step_gain_llm": auc(gain[:, 1], labels[:, 1]),
        "auc_prm_score": auc(cand.reshape(-1), labels.reshape(-1)),
        "ece": rel.ece,
        "reliability": {"edges": rel.edges.tolist(), "count": rel.count.tolist(),
                        "mean_pred": [None if np.isnan(v) else float(v) for v in rel.mean_pred],
                        "frac_pos": [None if np.isnan(v) else float(v) for v in rel.frac_pos]},
    }
