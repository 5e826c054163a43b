"""Every method's knob as evaluator rows, so a frontier sweeps each method the same way.

A method trades quality for server work through one knob (docs/design.md §8, "compare designs
as frontiers"; issue 51 item 4). :func:`knob_specs` turns a grid of knob values into
``evals.evaluate.PolicySpec`` rows; every knob is an array leaf of the one jitted evaluator, so
a grid costs one compilation per trace set, and every row runs on the evaluator's seeds (same
arrivals, problems and fading: paired comparisons).

===========  ====================  ==========================================  =============
method       knob                  rule                                        scheduler
===========  ====================  ==========================================  =============
prada        θ [PRM units]         nominate iff the critic's ΔQ > θ            threshold (λ, µ)
prada_actor  m (log-odds)          nominate iff the actor's logit margin > m   threshold (λ, µ)
random       p                     nominate each draft with probability p      fifo_greedy
rsd          PRM threshold τ       keep a draft whose PRM score ≥ τ, else LLM  rsd
oracle       k (offloads/problem)  ``prada_jax.traces.oracle``'s table         offload_all
===========  ====================  ==========================================  =============

``prada`` is the issue's knob (ΔQ is what a nomination carries to the server). ``prada_actor``
thresholds the actor's own log-odds instead; at m = 0 it is the policy's greedy action, so its
curve passes through the operating point training put the policy at (the critic, refit to the
final actor's Monte-Carlo values, can rank states worse than the actor does: both curves are
worth drawing).

The scheduler of a PRADA, random or oracle grid can be overridden (``scheduler=``, with λ_s,
µ for ``threshold``): a screening comparison serves every method's nominations by one rule
(``evals.screening`` uses ``fifo_greedy`` for all three, so only the screen differs); a
capacity frontier gives PRADA its fitted price. RSD's scheduler is its rule and is fixed.

θ has no natural scale (it is in the critic's units), so :func:`theta_grid` picks θ values
that land on chosen offload shares: the critic's ΔQ (and the actor's margin) is a function of
the node alone (the observation is the node's features, depth and context), so for any θ the
path of every problem of the pool under "offload iff ΔQ > θ" follows from the trace tree
(``prada_jax.traces.oracle.walk``), and with it the offload share at light load when every
nomination is served (an outage refuses a few). The grid is that share over candidate θ (the
quantiles of ΔQ over the pool's nodes), and each target share takes the candidate closest to
it. The realised share of each row is measured and reported; the grid only places the points.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from evals.evaluate import PolicySpec
from prada_jax.errors import BadInput
from prada_jax.rl.evaluate import node_observations
from prada_jax.rl.screen import screen_scores
from prada_jax.traces import oracle as oracle_lib


class Knob(NamedTuple):
    """A method's knob: ``name`` (the ``PolicySpec`` field it sets), ``symbol`` (for labels),
    ``grid`` (the default values; None: θ needs :func:`theta_grid`), ``rule``."""

    name: str
    symbol: str
    grid: tuple | None
    rule: str


#: The paper's RSD threshold (a draft is kept if its PRM score is ≥ 0.7).
RSD_PAPER_THRESHOLD = 0.7
KNOBS: dict[str, Knob] = {
    "prada": Knob("theta", "θ", None, "nominate iff the critic's ΔQ > θ"),
    "prada_actor": Knob("theta", "m", None, "nominate iff the actor's logit margin > m"),
    "random": Knob("p_random", "p", (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                   "nominate each draft with probability p"),
    "rsd": Knob("rsd_threshold", "τ_PRM", (0.5, 0.6, RSD_PAPER_THRESHOLD, 0.8, 0.9),
                "keep a draft whose PRM score is ≥ τ_PRM, else the LLM's step"),
    "oracle": Knob("oracle_budget", "k", (0, 1, 2, 3, 4, None),
                   "the fewest offloads to a correct answer, at most k per problem"),
}
METHODS = tuple(KNOBS)
_DEFAULT_SCHEDULER = {"prada": "threshold", "prada_actor": "threshold",
                      "random": "fifo_greedy", "rsd": "rsd", "oracle": "offload_all"}
_SCREEN = {"prada": "critic", "prada_actor": "margin", "random": "random", "rsd": "always",
           "oracle": "oracle"}
#: Offload shares a default θ grid aims at (issue 51: from ≈ 5 % to ≈ 80 %).
THETA_TARGET_SHARES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def _label(method: str, v) -> str:
    name = {"prada": "PRADA", "prada_actor": "PRADA", "random": "Random", "rsd": "RSD",
            "oracle": "Oracle"}[method]
    sym = KNOBS[method].symbol
    if v is None:
        return f"{name} {sym}=∞"
    return f"{name} {sym}={v:+.4g}" if method.startswith("prada") else f"{name} {sym}={v:g}"


def _check_value(method: str, v):
    """The knob value as the spec stores it; ``BadInput`` naming the method and value."""
    if method == "oracle":
        if v is None or (isinstance(v, float) and math.isinf(v) and v > 0):
            return None
        if float(v) != int(v) or int(v) < 0:
            raise BadInput(f"oracle budget k must be an integer >= 0 or None (unlimited), "
                           f"got {v!r}")
        return int(v)
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise BadInput(f"{method} knob {KNOBS[method].symbol}: not a number: {v!r}") from None
    if not math.isfinite(x):
        raise BadInput(f"{method} knob {KNOBS[method].symbol} must be finite, got {v!r}")
    if method in ("random", "rsd") and not 0.0 <= x <= 1.0:
        raise BadInput(f"{method} knob {KNOBS[method].symbol} must be in [0, 1], got {v!r}")
    return x


def knob_specs(method: str, values: Sequence | None = None, *, scheduler: str | None = None,
               lambda_s: float = 0.0, mu: float = 0.0) -> list[PolicySpec]:
    """Evaluator rows of ``method`` at each knob value (the table of the module docstring).

    Args:
      method: one of :data:`METHODS`.
      values: knob values (None: the method's default grid; PRADA's two have none, use
        :func:`theta_grid`). Oracle: integers k ≥ 0, None or ``inf`` for unlimited.
      scheduler: overrides the method's scheduler (not for ``rsd``); lambda_s, mu: its
        multipliers (the threshold rule's price).
    Returns:
      one ``PolicySpec`` per value, in order, named e.g. ``Random p=0.2``; :func:`knob_value`
      reads the value back.
    """
    if method not in KNOBS:
        raise BadInput(f"method must be one of {METHODS}, got {method!r}")
    if values is None:
        values = KNOBS[method].grid
        if values is None:
            raise BadInput(f"{method}: give the knob values (theta_grid picks a θ grid)")
    if method == "rsd" and scheduler not in (None, "rsd"):
        raise BadInput(f"rsd: the scheduler is the RSD rule itself, got scheduler={scheduler!r}")
    sched = scheduler or _DEFAULT_SCHEDULER[method]
    screen = _SCREEN[method]
    out = []
    for v in values:
        x = _check_value(method, v)
        out.append(PolicySpec(_label(method, x), screen, sched, float(lambda_s), float(mu),
                              **{KNOBS[method].name: x}))
    return out


def knob_value(spec: PolicySpec) -> Any:
    """The knob value a spec sits at (θ, p, τ_PRM, or k with None = unlimited), by its screen
    and scheduler; None for a row that is not one of the methods."""
    if spec.screen in ("critic", "margin"):
        return spec.theta
    if spec.screen == "random":
        return spec.p_random
    if spec.screen == "oracle":
        return spec.oracle_budget
    if spec.scheduler == "rsd":
        return RSD_PAPER_THRESHOLD if spec.rsd_threshold is None else spec.rsd_threshold
    return None


def node_scores(apply_fn: Callable, net_params: Any, params, method: str = "prada"
                ) -> np.ndarray:
    """[N] float64: the score a PRADA knob thresholds at every node of ``params.traces``, from
    the observation the env gives a user there (``prada_jax.rl.evaluate.node_observations``):
    the critic's ΔQ = Q(s, 1) − Q(s, 0) (``prada``) or the actor's logit margin
    (``prada_actor``)."""
    if method not in ("prada", "prada_actor"):
        raise BadInput(f"node_scores: method must be prada or prada_actor, got {method!r}")
    obs = jnp.asarray(node_observations(params))
    logits, gain = jax.jit(screen_scores, static_argnums=0)(apply_fn, net_params, obs)
    score = gain if method == "prada" else logits[:, 1] - logits[:, 0]
    return np.asarray(score, np.float64)


def threshold_share(traces, scores: np.ndarray, theta: float) -> float:
    """Offload share (offloaded steps / steps over the pool's problems, each once) of the
    screen "score > θ" when every nomination is served (``prada_jax.traces.oracle.walk``)."""
    w = oracle_lib.walk(traces, np.asarray(scores) > theta)
    return float(w["offloads"].sum() / max(w["steps"].sum(), 1))


def theta_grid(traces, gains: np.ndarray, shares: Sequence[float] = THETA_TARGET_SHARES,
               candidates: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """θ values whose served-every-nomination offload share is closest to each target share
    (module docstring).

    Args:
      traces: the pool's trace set (NumPy or JAX arrays).
      gains: [N] the thresholded score per node (:func:`node_scores`: the critic's ΔQ, or
        the actor's logit margin).
      shares: target offload shares in (0, 1).
      candidates: quantiles of ΔQ tried as θ.
    Returns:
      ``(thetas, predicted_shares)``, distinct θ in decreasing order (increasing share).
    """
    g = np.asarray(gains, np.float64)
    if g.ndim != 1 or g.size == 0 or not np.all(np.isfinite(g)):
        raise BadInput("theta_grid: gains must be a non-empty finite [N] array")
    tr = jax.device_get(traces)
    cand = np.unique(np.concatenate([np.quantile(g, np.linspace(0, 1, int(candidates) + 1)),
                                     [g.min() - 1.0]]))
    got = np.array([threshold_share(tr, g, t) for t in cand])
    picks = {}
    for s in shares:
        i = int(np.argmin(np.abs(got - float(s))))
        picks[float(cand[i])] = float(got[i])
    thetas = np.array(sorted(picks, reverse=True))
    return thetas, np.array([picks[t] for t in thetas])
