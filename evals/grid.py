"""Best constant multiplier pair by exhaustive search (the reference stage 2 is held to, §6).

``search(eval_fn)`` scores every pair (λ_s, µ) of a grid by closed-loop env rollouts
(``eval_fn(lams [G], mus_per_hz [G]) -> objective [G, S]``, the mean of accuracy − β·latency
over the same S seeds for every pair) and returns the best pair. Coarse to fine, on a log scale:

* coarse: λ_s ∈ {0} ∪ {10^-3, 10^-2.5, …, 10^0} PRM units per server unit (8 values),
  µ ∈ {0} ∪ {10^-3, 10^-2, 10^-1} PRM units per MHz (4 values): 32 pairs;
* fine: around the coarse best (λ*, µ*): λ*·10^{−0.3, −0.2, …, 0.3} (7 values; if λ* = 0:
  {0, 10^-4, 2·10^-4, 5·10^-4}) × µ*·10^{−0.5, 0, 0.5} (if µ* = 0: µ = 0 only).

Callers may pass a smaller coarse µ grid (``studies.stage2_verdict`` measures with µ ∈ {0, 10^-2}).

The ΔQ a nomination carries is O(0.01–0.1) PRM units, so 10^-3 … 1 spans "no effect" to "keeps
everything local". The grid pairs are vmapped into one compiled rollout. Because the grid picks
its best on the evaluation seeds, its score is optimistic (a bias in the reference's favour).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

COARSE_LAMBDA = (0.0,) + tuple(float(10.0 ** e) for e in np.arange(-3.0, 0.01, 0.5))
COARSE_MU_PER_MHZ = (0.0, 1e-3, 1e-2, 1e-1)


def fine_values(best: float, decades: Sequence[float], zero_values: Sequence[float]):
    """Points around ``best`` (×10^d for d in ``decades``) or ``zero_values`` if best is 0."""
    if best <= 0.0:
        return tuple(float(v) for v in zero_values)
    return tuple(float(best * 10.0 ** d) for d in decades)


def _score(obj: np.ndarray) -> np.ndarray:
    """Mean over seeds [G] of the finite seeds (NaN/inf seeds ignored; a pair with no finite
    seed, e.g. every seed over an occupancy budget, scores −inf). The mean is taken only over
    rows that have a finite seed (``np.nanmean`` of an all-NaN row warned "Mean of empty
    slice"); the same sum / count as ``np.nanmean`` elsewhere."""
    obj = np.asarray(obj, np.float64)
    ok = np.isfinite(obj)
    count = ok.sum(axis=-1)
    total = np.where(ok, obj, 0.0).sum(axis=-1)
    m = np.divide(total, count, out=np.full(count.shape, -np.inf), where=count > 0)
    return np.where(np.isfinite(m), m, -np.inf)


def search(eval_fn: Callable, lam: Sequence[float] = COARSE_LAMBDA,
           mu_per_mhz: Sequence[float] = COARSE_MU_PER_MHZ, fine: bool = True) -> dict:
    """Exhaustive coarse (+ fine) search. Returns {"best": {"lambda_s", "mu_per_mhz",
    "objective"}, "evaluated": count, "points": [[λ_s, µ per MHz, mean objective], ...]}.
    Ties go to the smaller λ_s, then the smaller µ (the first in sorted order)."""
    seen: dict[tuple[float, float], float] = {}

    def run(lams, mus):
        pairs = [(float(a), float(b)) for a in lams for b in mus if (float(a), float(b))
                 not in seen]
        if not pairs:
            return
        la = np.array([p[0] for p in pairs], np.float32)
        mu = np.array([p[1] for p in pairs], np.float64) / 1e6
        scores = _score(eval_fn(la, mu.astype(np.float32)))
        for p, s in zip(pairs, scores):
            seen[p] = float(s)

    def best():
        return max(sorted(seen), key=lambda p: seen[p])  # stable: ties to the smallest pair

    run(lam, mu_per_mhz)
    if fine:
        b_lam, b_mu = best()
        mus = (0.0,) if b_mu <= 0.0 else fine_values(b_mu, (-0.5, 0.0, 0.5), ())
        run(fine_values(b_lam, np.arange(-0.3, 0.31, 0.1), (0.0, 1e-4, 2e-4, 5e-4)), mus)
    b = best()
    fin = lambda v: v if np.isfinite(v) else None  # noqa: E731  (strict JSON)
    return {"best": {"lambda_s": b[0], "mu_per_mhz": b[1], "objective": fin(seen[b])},
            "evaluated": len(seen),
            "points": [[p[0], p[1], fin(seen[p])] for p in sorted(seen)]}
