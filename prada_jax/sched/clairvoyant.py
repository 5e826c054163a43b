"""Open-loop clairvoyant upper bound over a replayed request stream (docs/design.md §6).

Model (units in brackets). A stream of N requests over a horizon of T slots; request i has

* ``arrival[i]`` a_i [slot index, 0 ≤ a_i < T],
* ``value[i]`` w_i [PRM units]: the net value of serving it on the server instead of locally
  (the same w the threshold rule ranks; local = not served = 0),
* ``service[i]`` k_i [slots, ≥ 1]: it holds one server unit and ``bw[i]`` b_i [Hz] during the
  slots [s, s + k_i) once started in slot s,

and per slot t the capacity ``units[t]`` M_t [server units] and ``bandwidth[t]`` B_t [Hz].
Waiting costs ``wait_cost`` = β·τ [PRM units per slot waited], the rule's wait charge.
The clairvoyant planner, knowing every arrival in advance, picks for each request a start slot
s ∈ [a_i, a_i + W) ∩ [0, T) or local, maximising

    Σ_{i served} (w_i − wait_cost·(s_i − a_i))
    s.t. for every slot t:  #{i running at t} ≤ M_t,  Σ_{i running at t} b_i ≤ B_t.

:func:`clairvoyant_bound` solves it exactly with ``scipy.optimize.milp`` (HiGHS) on binaries
x_{i,s}. Simplifications (why it is an *upper bound*, and only for this value model):

* open loop: the stream is fixed; a user's later requests do not depend on whether or when an
  earlier one was served (in the env they do: serving moves the user on). The bound is for any
  online scheduler facing *this* stream under *this* value model, not for the closed-loop env;
* the server starts empty and slots past T are unconstrained (a job may run past the horizon),
  which can only raise the optimum;
* start options with net value ≤ 0 are dropped (never needed in a maximum, since not serving
  is always feasible). With ``window=None`` W = ceil(max w / wait_cost) (or T if wait_cost = 0),
  so no dropped option could have helped: the optimum is then over *all* start slots. A
  smaller W gives the optimum over schedules that wait < W slots only.

:func:`greedy_online` is a simple causal reference (serve waiting requests by value when
capacity is free); :func:`synthetic_stream` draws a stream with documented distributions
(synthetic, not extracted from an env rollout); ``prada_jax.dual.stream`` reads a
stage-2 rollout as a stream. Pure NumPy/host code; scipy is imported inside the MILP function
only.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from prada_jax.errors import BadInput


class Stream(NamedTuple):
    """A replayed request stream. All [N] arrays; capacities are [T] arrays.

    arrival: int64 slot index; value: float64 [PRM units]; service: int64 [slots ≥ 1];
    bw: float64 [Hz]; units: int64 M_t [server units]; bandwidth: float64 B_t [Hz].
    """

    arrival: np.ndarray
    value: np.ndarray
    service: np.ndarray
    bw: np.ndarray
    units: np.ndarray
    bandwidth: np.ndarray

    @property
    def horizon(self) -> int:
        return int(self.units.shape[0])


class Plan(NamedTuple):
    """A schedule of a stream.

    start: [N] int64, start slot of each request or -1 for local (not served).
    value: float, Σ served (w_i − wait_cost·(s_i − a_i)) [PRM units].
    method: "milp", "greedy" or "enumerate".
    """

    start: np.ndarray
    value: float
    method: str


def make_stream(arrival, value, service, bw, units, bandwidth, horizon=None) -> Stream:
    """Validate and build a :class:`Stream`. ``units``/``bandwidth`` may be scalars (constant
    over ``horizon`` slots) or [T] arrays. Raises :class:`BadInput` naming the field."""
    arrival = np.asarray(arrival, np.int64).reshape(-1)
    n = arrival.shape[0]
    value = np.asarray(value, np.float64).reshape(-1)
    service = np.asarray(service, np.int64).reshape(-1)
    bw = np.asarray(bw, np.float64).reshape(-1)
    for name, arr in (("value", value), ("service", service), ("bw", bw)):
        if arr.shape != (n,):
            raise BadInput(f"stream field {name} has shape {arr.shape}, "
                           f"expected ({n},) like arrival")
    if horizon is None:  # T from whichever capacity is an array
        arrays = [np.shape(c)[0] for c in (units, bandwidth) if np.ndim(c)]
        if not arrays:
            raise BadInput("stream field horizon is needed when units and bandwidth are scalars")
        horizon = arrays[0]
    t_len = int(horizon)
    if t_len < 1:
        raise BadInput(f"stream field horizon must be >= 1, got {t_len}")
    units = np.broadcast_to(np.asarray(units, np.int64), (t_len,)).copy() if np.ndim(units) == 0 \
        else np.asarray(units, np.int64).reshape(-1)
    bandwidth = np.broadcast_to(np.asarray(bandwidth, np.float64), (t_len,)).copy() \
        if np.ndim(bandwidth) == 0 else np.asarray(bandwidth, np.float64).reshape(-1)
    if units.shape != (t_len,) or bandwidth.shape != (t_len,):
        raise BadInput(f"stream fields units/bandwidth must have length T={t_len}")
    if np.any(arrival < 0) or np.any(arrival >= t_len):
        raise BadInput(f"stream field arrival must lie in [0, {t_len})")
    if np.any(service < 1):
        raise BadInput("stream field service must be >= 1 slot")
    if not np.all(np.isfinite(value)):
        raise BadInput("stream field value has non-finite entries")
    if not np.all(np.isfinite(bw)) or np.any(bw < 0):
        raise BadInput("stream field bw must be finite and >= 0")
    if np.any(units < 0) or not np.all(np.isfinite(bandwidth)) or np.any(bandwidth < 0):
        raise BadInput("stream fields units/bandwidth must be finite and >= 0")
    return Stream(arrival, value, service, bw, units, bandwidth)


def default_window(stream: Stream, wait_cost: float) -> int:
    """W such that waiting W or more slots never pays: ceil(max w / wait_cost) (≥ 1), or T if
    wait_cost is 0."""
    if wait_cost < 0 or not math.isfinite(wait_cost):
        raise BadInput("wait_cost must be finite and >= 0")
    wmax = float(np.max(stream.value, initial=0.0))
    if wait_cost == 0:
        return stream.horizon
    return max(1, min(stream.horizon, math.ceil(wmax / wait_cost)))


def _options(stream: Stream, wait_cost: float, window: int):
    """Start options (i, s, net value) with net value > 0, s in [a_i, a_i+W) ∩ [0, T)."""
    opts = []
    for i in range(stream.arrival.shape[0]):
        a = int(stream.arrival[i])
        for s in range(a, min(a + window, stream.horizon)):
            net = float(stream.value[i]) - wait_cost * (s - a)
            if net > 0:
                opts.append((i, s, net))
    return opts


def plan_value(stream: Stream, start, wait_cost: float) -> float:
    """Σ served (w_i − wait_cost·(s_i − a_i)) of a plan's ``start`` [N] (−1 = local)."""
    start = np.asarray(start, np.int64)
    served = start >= 0
    return float(np.sum(stream.value[served] - wait_cost * (start[served] - stream.arrival[served])))


def is_feasible(stream: Stream, start, tol: float = 1e-9) -> bool:
    """True iff ``start`` respects arrival and the per-slot units/bandwidth limits."""
    start = np.asarray(start, np.int64)
    t_len = stream.horizon
    use_u = np.zeros(t_len)
    use_b = np.zeros(t_len)
    for i, s in enumerate(start):
        if s < 0:
            continue
        if s < stream.arrival[i] or s >= t_len:
            return False
        end = min(t_len, s + int(stream.service[i]))
        use_u[s:end] += 1
        use_b[s:end] += stream.bw[i]
    return bool(np.all(use_u <= stream.units + tol) and np.all(use_b <= stream.bandwidth + tol))


def clairvoyant_bound(stream: Stream, wait_cost: float, window: int | None = None,
                      time_limit_s: float = 60.0) -> Plan:
    """Exact clairvoyant optimum of the model in the module docstring (``scipy.optimize.milp``).

    wait_cost: β·τ [PRM units per slot]; window: W [slots] (None → :func:`default_window`).
    Returns a :class:`Plan` (method "milp"). Raises RuntimeError if HiGHS does not prove
    optimality within ``time_limit_s`` (the result would not be a bound).
    """
    from scipy.optimize import Bounds, LinearConstraint, milp  # lazy: scipy is a [dev] extra
    from scipy.sparse import coo_matrix  # lazy: scipy is a [dev] extra

    if window is None:
        window = default_window(stream, wait_cost)
    if int(window) < 1:
        raise BadInput("window must be >= 1 slot")
    n = stream.arrival.shape[0]
    opts = _options(stream, float(wait_cost), int(window))
    start = -np.ones(n, np.int64)
    if not opts:
        return Plan(start, 0.0, "milp")
    t_len = stream.horizon
    nv = len(opts)
    c = -np.array([o[2] for o in opts])
    rows, cols, vals = [], [], []
    # one start per request
    for j, (i, _, _) in enumerate(opts):
        rows.append(i)
        cols.append(j)
        vals.append(1.0)
    a_one = coo_matrix((vals, (rows, cols)), shape=(n, nv))
    # per-slot units and bandwidth (slots ≥ T unconstrained)
    ru, cu, vu, rb, cb, vb = [], [], [], [], [], []
    for j, (i, s, _) in enumerate(opts):
        for t in range(s, min(t_len, s + int(stream.service[i]))):
            ru.append(t)
            cu.append(j)
            vu.append(1.0)
            if stream.bw[i] > 0:
                rb.append(t)
                cb.append(j)
                vb.append(float(stream.bw[i]))
    a_u = coo_matrix((vu, (ru, cu)), shape=(t_len, nv))
    a_b = coo_matrix((vb, (rb, cb)), shape=(t_len, nv))
    cons = [LinearConstraint(a_one, -np.inf, 1.0),
            LinearConstraint(a_u, -np.inf, stream.units.astype(np.float64)),
            LinearConstraint(a_b, -np.inf, stream.bandwidth)]
    res = milp(c, constraints=cons, integrality=np.ones(nv), bounds=Bounds(0, 1),
               options={"time_limit": float(time_limit_s)})
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"clairvoyant MILP not solved to optimality: {res.message}")
    x = np.round(res.x).astype(int)
    for j, (i, s, _) in enumerate(opts):
        if x[j]:
            start[i] = s
    return Plan(start, plan_value(stream, start, float(wait_cost)), "milp")


def greedy_online(stream: Stream, wait_cost: float, window: int | None = None,
                  threshold=None) -> Plan:
    """A causal reference: in each slot t, among requests that have arrived, are not yet served
    and waited < W slots, start them in decreasing net value (ties: earlier arrival) while a
    unit and their bandwidth are free and the net value exceeds ``threshold(i)`` (default 0).

    threshold: None or a function of the request index returning the minimum net value
    [PRM units] to admit (e.g. λ_s + µ·b_i for a constant-multiplier threshold rule).
    """
    if window is None:
        window = default_window(stream, wait_cost)
    t_len = stream.horizon
    n = stream.arrival.shape[0]
    start = -np.ones(n, np.int64)
    use_u = np.zeros(t_len + int(np.max(stream.service, initial=1)) + 1)
    use_b = np.zeros_like(use_u)
    for t in range(t_len):
        waiting = [i for i in range(n)
                   if start[i] < 0 and stream.arrival[i] <= t < stream.arrival[i] + window]
        nets = {i: float(stream.value[i]) - wait_cost * (t - int(stream.arrival[i])) for i in waiting}
        for i in sorted(waiting, key=lambda i: (-nets[i], int(stream.arrival[i]), i)):
            floor = 0.0 if threshold is None else float(threshold(i))
            if nets[i] <= max(0.0, floor):
                continue
            if use_u[t] + 1 <= stream.units[t] and use_b[t] + stream.bw[i] <= stream.bandwidth[t] + 1e-9:
                # the job must also fit in its later slots (capacity may drop over time)
                end = min(t_len, t + int(stream.service[i]))
                if np.all(use_u[t:end] + 1 <= stream.units[t:end]) and \
                        np.all(use_b[t:end] + stream.bw[i] <= stream.bandwidth[t:end] + 1e-9):
                    start[i] = t
                    use_u[t:t + int(stream.service[i])] += 1
                    use_b[t:t + int(stream.service[i])] += stream.bw[i]
    return Plan(start, plan_value(stream, start, wait_cost), "greedy")


def synthetic_stream(seed: int, horizon: int = 200, users: int = 8, p_arrival: float = 0.1,
                     units: int = 2, bandwidth_hz: float = 20e6, value_mean: float = 0.3,
                     value_sd: float = 0.3, service_max: int = 6, bw_lo_hz: float = 1e6,
                     bw_hi_hz: float = 8e6) -> Stream:
    """A synthetic stream (NOT extracted from an env rollout). Distributions:

    * each of ``users`` users issues a request in each slot independently with probability
      ``p_arrival`` (Bernoulli arrivals, open loop);
    * value w ~ Normal(value_mean, value_sd) [PRM units] (negative = local is better);
    * service k ~ Uniform{1, …, service_max} [slots];
    * bandwidth b ~ Uniform(bw_lo_hz, bw_hi_hz) [Hz];
    * constant capacity M_t = ``units``, B_t = ``bandwidth_hz``.
    """
    rng = np.random.default_rng(seed)
    arr = rng.random((horizon, users)) < p_arrival
    arrival = np.nonzero(arr)[0].astype(np.int64)
    n = arrival.shape[0]
    return make_stream(arrival, rng.normal(value_mean, value_sd, n),
                       rng.integers(1, service_max + 1, n), rng.uniform(bw_lo_hz, bw_hi_hz, n),
                       units, bandwidth_hz, horizon=horizon)
