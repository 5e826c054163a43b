"""Rolls the edge env out for each evaluated policy over seeds and reduces it to per-seed metrics.

One jitted function (``make_evaluator``) serves every policy and every sweep point: the screening
mode, the random-nomination probability, the critic's threshold θ, the oracle's table and
budget, the scheduler index, the multipliers, M, B and λ are all array leaves, so only the
trace-set shape, the user slots U and the slot counts are static (one compile per trace set;
a θ, p, k or RSD-threshold grid does not recompile, ``evals.knobs``). Seeds are vmapped: seed ``s`` uses ``jax.random.key(seed0 + s)``
for the same arrivals, problems and fading in every policy (paired comparisons).

Policies (``PolicySpec``; docs/design.md §8):

* ``All-SLM``: never nominate (every draft kept), keep-local scheduler.
* ``All-LLM``: nominate every step, offload-all scheduler (immediate while M and B last, else
  queue; a request that waited ``max_wait_slots`` is kept local — the env's hard rule).
* ``Random``: nominate with probability p, FIFO-greedy scheduler; p is matched to PRADA's
  measured offload rate (one correction pass, see ``matched_random_probability``).
* ``critic`` screen: nominate iff the critic's ΔQ > θ (``PolicySpec.theta``, default 0: greedy
  in the critic); θ is PRADA's knob (``evals.knobs``). ``margin`` screen: nominate iff the
  actor's logit margin (log-odds of nominating) > θ; θ = 0 is the ``policy`` screen.
* ``oracle`` screen (``prada_jax.traces.oracle``): a user at node n that has had ``offloads``
  steps served by the server nominates ``table[n, min(k − offloads, K)]``, the step of a
  minimum-offload path to a correct answer within its budget of k offloads per problem
  (``PolicySpec.oracle_budget``; None: unlimited, column K); a problem with no correct answer
  within the budget keeps every draft. It knows the answers: the ceiling of any screening
  policy on the traces, not a system. Its rows use the offload-all scheduler (immediate while
  M and B last, else queue; the same rule as FIFO-greedy), so at light load every nomination
  is served and the oracle's path is the one the table plans; a refused nomination (outage,
  expiry) sends the user down the SLM branch, and the table replans from there.
* ``RSD``: online PRM thresholding (keep the draft if its PRM score ≥ 0.7, else the LLM); the
  env charges the PRM's forward pass to every draft.
* ``Policy (no limits)``: the screening policy's greedy action, offload-all scheduler, with
  M = U (no server contention) and B = 1e12 Hz (no bandwidth limit).
* ``PRADA``: the screening policy's greedy action carrying the critic's ΔQ, threshold scheduler
  with the learned multipliers (λ_s, µ).
* ``PRADA (λ=µ=0)``: the same scheduler with both multipliers at 0 (what the dual ascent buys).
* ``Policy + FIFO-greedy``: the same nominations served first come first served while M and B
  last (docs/design.md §6: the scheduler baseline).

Measurement (docs/design.md §8, "measurement under load"); one rule for every row:

* **Empty start.** Every rollout starts from an empty system (``initial_users = 0`` whatever
  the params say): a start with U users at slot 0 is a backlog, not a load.
* **The cohort.** The measured users are the cohort that ARRIVES in the window, slots
  ``[W, T)`` (``warmup_slots`` W, ``num_slots`` T), blocked arrivals included. After the window
  the env runs ``drain_slots`` D more slots (arrivals continue, so the cohort's tail still
  meets steady-state contention; the drain's own arrivals are not measured). Each cohort user
  is watched for the same D slots after it arrived: the **timeout** is ``D·τ`` seconds.
* **Every arrival counted.** A cohort user that finishes within the timeout counts with its
  answer and its latency. A blocked arrival, or one still unfinished at the timeout, counts as
  a failure: accuracy 0 and latency = the timeout (censored). So ``accuracy`` = correct answers
  / cohort arrivals, ``latency_mean_s`` / ``latency_p90_s`` / ``latency_p95_s`` are over every cohort arrival with
  failures at the timeout, and ``objective`` = ``accuracy − β · latency_mean_s``. No
  survivor-only mean is reported. ``goodput_hz`` = correct answers of the cohort per second
  of window, ``(T − W)·τ``. The delay split (processing / communication / queueing), offload
  and outage rates are over the cohort users that finished within the timeout.
* **Steady state.** ``steady_drift`` = (mean censored latency of the cohort arriving in the
  second half of the window − that of the first half) / the whole cohort's, per seed.
  ``evals.report`` flags a row ``not steady`` when the mean drift over seeds exceeds
  ``evals.report.STEADY_TOL`` (10 %) in size and its 95 % CI excludes 0.
* **Offered server load ρ.** ``rho`` = Σ over the window of the server-unit seconds requested
  by new nominations that asked for the server (``envs.edge`` info ``offered_job_s``: each at
  ``phase_slots(delay_s)·τ``, the slots it holds one of the M units, at a full batch) ÷ Σ over
  the window of ``M_t·τ``, scaled by arrivals / admitted arrivals (a blocked arrival would have
  asked for as much as an admitted one). ρ ≥ 1: the row is unstable, ``evals.report`` flags it
  and withholds its latencies.

Metrics per seed (units in ``evals.report.METRICS``): the above; processing / communication /
queueing delay per finished user, offload rate (offloaded steps / steps of finished users),
nomination rate, server utilisation (mean busy units / M per slot), mean queue length (requests
per slot), outage rate (outages / upload attempts), blocked rate (blocked / arrivals), timeout
rate (admitted cohort users unfinished at the timeout / arrivals), fallback share (steps that
used a trace fallback / steps), the share of slots in which capacity binds (a request waits
while all M_t available units are busy) and in which bandwidth binds (a request waits while a
unit is free: its bandwidth does not fit in what is left of B_t); per-slot shares are over the
window's slots. β is in PRM units per second.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from envs import edge
from prada_jax.rl.screen import critic_screen, greedy_screen, margin_screen, screen_scores
from prada_jax.sched.registry import scheduler_index
from prada_jax.traces import oracle as oracle_lib

(SCREEN_NEVER, SCREEN_ALWAYS, SCREEN_RANDOM, SCREEN_POLICY, SCREEN_CRITIC, SCREEN_ORACLE,
 SCREEN_MARGIN) = range(7)
#: ``PolicySpec.screen`` name -> the screening-mode code the jitted evaluator switches on.
SCREEN_MODES = {"never": SCREEN_NEVER, "always": SCREEN_ALWAYS, "random": SCREEN_RANDOM,
                "policy": SCREEN_POLICY, "critic": SCREEN_CRITIC, "oracle": SCREEN_ORACLE,
                "margin": SCREEN_MARGIN}
UNLIMITED_BANDWIDTH_HZ = 1e12


def screen_mode(name: str) -> jax.Array:
    """int32 [] code of a screening mode name (a key of ``SCREEN_MODES``)."""
    return jnp.asarray(SCREEN_MODES[name], jnp.int32)


class PolicySpec(NamedTuple):
    """One evaluated system (host side).

    name: row label. screen: "never" | "always" | "random" | "policy" (the actor's greedy
    action) | "critic" (nominate iff the critic's ΔQ > ``theta``; ``prada_jax.rl.screen``'s
    ``nominate_by="critic"`` at θ = 0) | "margin" (iff the actor's logit margin > ``theta``;
    "policy" at θ = 0) | "oracle" (``prada_jax.traces.oracle``'s table, at most
    ``oracle_budget`` offloads per problem). scheduler: a name in
    ``prada_jax.sched.registry.SCHEDULER_NAMES``. lambda_s, mu: multipliers (mu per Hz).
    unlimited: lift M and B (M = U, B = 1e12 Hz). p_random: nomination probability ("random").
    theta: the nomination threshold on the critic's ΔQ [PRM units] ("critic") or on the
    actor's logit margin ("margin"). oracle_budget: k, offloads
    per problem ("oracle"; None: unlimited). rsd_threshold: the RSD rule keeps a draft whose
    PRM score is ≥ this (None: the env params' value, 0.7 by default).
    """

    name: str
    screen: str
    scheduler: str
    lambda_s: float = 0.0
    mu: float = 0.0
    unlimited: bool = False
    p_random: float = 0.0
    theta: float = 0.0
    oracle_budget: int | None = None
    rsd_threshold: float | None = None


def baseline_specs() -> list[PolicySpec]:
    """The rows that need no trained policy: All-SLM, All-LLM, RSD."""
    return [PolicySpec("All-SLM", "never", "keep_local"),
            PolicySpec("All-LLM", "always", "offload_all"),
            PolicySpec("RSD (online PRM)", "always", "rsd")]


def policy_specs(lambda_s: float | None, mu: float | None) -> list[PolicySpec]:
    """Rows that use the screening policy. PRADA rows need multipliers (None: only λ=µ=0)."""
    rows = [PolicySpec("Policy (no limits)", "policy", "offload_all", unlimited=True),
            PolicySpec("Policy + FIFO-greedy", "policy", "fifo_greedy")]
    if lambda_s is not None:
        rows.append(PolicySpec("PRADA", "policy", "threshold", float(lambda_s), float(mu or 0.0)))
    rows.append(PolicySpec("PRADA (λ=µ=0)", "policy", "threshold", 0.0, 0.0))
    return rows


def apply_spec(params: edge.EnvParams, spec: PolicySpec) -> edge.EnvParams:
    """Env params for one policy row (same shapes: no recompilation)."""
    if spec.screen not in SCREEN_MODES:
        raise ValueError(f"policy '{spec.name}': screen must be one of {sorted(SCREEN_MODES)}, "
                         f"got {spec.screen!r}")
    p = params.replace(scheduler=jnp.asarray(scheduler_index(spec.scheduler), jnp.int32),
                       lambda_s=jnp.asarray(spec.lambda_s, jnp.float32),
                       mu=jnp.asarray(spec.mu, jnp.float32))
    if spec.rsd_threshold is not None:
        p = p.replace(rsd_threshold=jnp.asarray(spec.rsd_threshold, jnp.float32))
    if spec.unlimited:
        p = p.replace(num_servers=jnp.asarray(params.num_users, jnp.int32),
                      bandwidth_hz=jnp.asarray(UNLIMITED_BANDWIDTH_HZ, jnp.float32))
    return p


def _zero_apply(params, obs):
    del params
    z = jnp.zeros(obs.shape[:-1] + (2,), jnp.float32)
    return z, z


#: Default drain D after the window, in slots: the timeout of a cohort user is D·τ (20 s at
#: τ = 50 ms, about ten times the slowest stable row's mean latency in docs/evals.md).
DEFAULT_DRAIN_SLOTS = 400
#: Window sums of the cohort kept per half of the window ([2]: first, second).
_HALF_KEYS = ("arrivals", "blocked", "finished", "correct", "latency_s")


def _zero_totals(n_bins: int) -> dict:
    """The evaluator's per-env totals at the start: every sum 0."""
    zf = jnp.zeros((), jnp.float32)
    z2 = jnp.zeros((2,), jnp.float32)
    acc0 = dict(processing_s=zf, communication_s=zf, queueing_s=zf, offloads=zf,
                outages=zf, steps=zf, fallbacks=zf, server_busy=zf, queue_len=zf,
                slots=zf, decisions=zf, nominations=zf, capacity_bound=zf,
                bandwidth_bound=zf, offered_job_s=zf, capacity_s=zf, uplink_bound=zf,
                downlink_bound=zf, server_batch=zf, prefix_hit_tokens=zf,
                prefix_ctx_tokens=zf, evicted_tokens=zf, kv_in_use_tokens=zf,
                latency_hist=jnp.zeros((n_bins,), jnp.float32),
                **{f"half_{k}": z2 for k in _HALF_KEYS})
    return acc0


class OracleInputs(NamedTuple):
    """The oracle screen's arrays (device): ``table`` [N, K + 1] int8
    (``prada_jax.traces.oracle.OracleTables.nominate`` of the env's trace set) and ``budget``
    int32 [] (k offloads per problem; K or more: unlimited)."""

    table: Any
    budget: Any


def oracle_screen(oracle: OracleInputs, state: edge.EnvState) -> jax.Array:
    """int32 [U]: ``table[node, clip(k − offloads, 0, K)]`` of each user slot (meaningful at
    its decision points)."""
    k_max = oracle.table.shape[1] - 1
    left = jnp.clip(oracle.budget - state.offloads, 0, k_max)
    return oracle.table[state.node, left].astype(jnp.int32)


def _screen(apply_fn, net_params, obs, act_key, screen_mode, p_random, params, state=None,
            theta=0.0, oracle: OracleInputs | None = None):
    """The slot's screening decisions [U] and gains [U] under ``screen_mode`` (``state``: the
    env state the observation was taken from, read by the oracle screen; ``theta``: the critic
    screen's threshold; ``oracle``: None makes the oracle screen keep every draft)."""
    logits, dq = screen_scores(apply_fn, net_params, obs)
    greedy = greedy_screen(logits)
    critic = critic_screen(dq, theta)  # greedy in the critic at θ = 0
    margin = margin_screen(logits, theta)  # the actor's greedy action at θ = 0
    u = params.num_users
    rand = jax.random.bernoulli(act_key, p_random, (u,)).astype(jnp.int32)
    orc = (oracle_screen(oracle, state) if oracle is not None and state is not None
           else jnp.zeros((u,), jnp.int32))
    screen = jnp.select([screen_mode == SCREEN_NEVER, screen_mode == SCREEN_ALWAYS,
                         screen_mode == SCREEN_RANDOM, screen_mode == SCREEN_CRITIC,
                         screen_mode == SCREEN_ORACLE, screen_mode == SCREEN_MARGIN],
                        [jnp.zeros((u,), jnp.int32), jnp.ones((u,), jnp.int32), rand,
                         critic, orc, margin], greedy)
    gain = jnp.where((screen_mode == SCREEN_POLICY) | (screen_mode == SCREEN_CRITIC)
                     | (screen_mode == SCREEN_MARGIN), dq, params.default_gain).astype(jnp.float32)
    return screen, gain


def _slot_sums(info, done, arrival_slot, t, params, warmup_slots: int, num_slots: int,
               half_len: int, drain: int):
    """One slot's additions to the totals (the cohort's users that finished in it within
    the timeout, the window's per-slot sums): (sums, finished-in-cohort [U], latency
    [U] in slots)."""
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    in_window = (t >= warmup_slots) & (t < num_slots)
    w = f32(in_window)
    # The cohort: users whose arrival was counted in a window slot s (arrival slot
    # s + 1); half 1 from slot W + half_len on.
    a_slot = arrival_slot - 1
    cohort = (a_slot >= warmup_slots) & (a_slot < num_slots)
    lat_slots = jnp.round(info["user_latency_s"] / params.tau_s).astype(jnp.int32)
    d = f32(done & cohort & (lat_slots <= drain))
    half = (a_slot >= warmup_slots + half_len).astype(jnp.int32)
    arr_half = (t >= warmup_slots + half_len).astype(jnp.int32)
    onehot = jax.nn.one_hot(half, 2, dtype=jnp.float32)          # [U, 2]
    arr_hot = jax.nn.one_hot(arr_half, 2, dtype=jnp.float32) * w  # [2]
    # A resource binds in a slot where a request is made to wait: capacity if every
    # available unit (M_t) is busy, else bandwidth (a unit is free but the request's
    # bandwidth does not fit in what is left of B_t).
    waits = jnp.any(info["decision"] == edge.QUEUE)
    full = info["server_in_use"] >= info["num_servers_t"]
    upd = dict(
        processing_s=jnp.sum(d * info["user_processing_s"]),
        communication_s=jnp.sum(d * info["user_communication_s"]),
        queueing_s=jnp.sum(d * info["user_queueing_s"]),
        offloads=jnp.sum(d * f32(info["user_offloads"])),
        outages=jnp.sum(d * f32(info["user_outages"])),
        steps=jnp.sum(d * f32(info["user_steps"])),
        fallbacks=jnp.sum(d * f32(info["user_fallbacks"])),
        server_busy=w * f32(info["server_in_use"]) / f32(params.num_servers),
        queue_len=w * f32(info["queue_len"]),
        slots=w, decisions=w * jnp.sum(f32(info["decision_mask"])),
        nominations=w * jnp.sum(f32(info["nominated"])),
        capacity_bound=w * f32(waits & full), bandwidth_bound=w * f32(waits & ~full),
        offered_job_s=w * info["offered_job_s"],
        # the cell's links: a slot whose transfers ask more than B_t·τ (serving server)
        uplink_bound=w * f32(info["uplink_demand"] > 1.0),
        downlink_bound=w * f32(info["downlink_demand"] > 1.0),
        server_batch=w * f32(info["server_batch"]),
        # the server's prefix cache (envs.prefix_cache)
        prefix_hit_tokens=w * info["prefix_hit_tokens"],
        prefix_ctx_tokens=w * info["prefix_ctx_tokens"],
        evicted_tokens=w * info["evicted_tokens"], kv_in_use_tokens=w * info["kv_in_use_tokens"],
        capacity_s=w * f32(info["num_servers_t"]) * params.tau_s,
        half_arrivals=arr_hot * f32(info["arrivals"]),
        half_blocked=arr_hot * f32(info["blocked"]),
        half_finished=d @ onehot,
        half_correct=(d * f32(info["user_correct"])) @ onehot,
        half_latency_s=(d * info["user_latency_s"]) @ onehot)
    return upd, d, lat_slots


@functools.lru_cache(maxsize=16)
def make_evaluator(num_slots: int, warmup_slots: int,
                   apply_fn: Callable | None = None, mult_fn: Callable | None = None,
                   drain_slots: int = DEFAULT_DRAIN_SLOTS) -> Callable:
    """Builds ``evaluate(keys [S], params, net_params, screen_mode, p_random[, mult_params,
    theta, oracle]) -> totals`` (``theta``: float32 [] the critic screen's threshold, default
    0; ``oracle``: ``OracleInputs`` of the params' trace set, needed by the oracle screen; its
    presence is part of the compiled signature, so pass it on every call or on none).

    Args:
      num_slots: T, the window ends at slot T (static).
      warmup_slots: W < T, the window starts at slot W (static).
      apply_fn: ``apply_fn(net_params, obs [U, D]) -> (logits [U, 2], q [U, 2])`` of the
        screening policy; None for the baselines (net_params is then ignored).
      mult_fn: optional ``mult_fn(mult_params, state, params, action, env_key) -> (lambda_s,
        mu)`` giving the multipliers of each slot from what the server sees before it
        (``env_key`` is the key ``edge.step`` draws the slot's noise from; load-conditioned
        multipliers, ``studies.stage2_verdict``); None: the constant ``params.lambda_s`` / ``params.mu``.
      drain_slots: D ≥ 1, slots run after the window; the cohort's timeout is D·τ (static).
    Returns:
      a jitted function; ``totals`` is a dict of [S] sums (cohort sums per half [S, 2] under
      ``half_<key>``, per-slot sums over the window) plus ``latency_hist`` [S, D + 1] (cohort
      users per censored latency in slots; failures at D). Cached per (T, W, apply_fn,
      mult_fn, D), so evaluators of the same sizes share one compilation. The module
      docstring states the measurement rule.
    """
    if not 0 <= warmup_slots < num_slots:
        raise ValueError(f"warmup_slots must be in [0, slots={num_slots}), got {warmup_slots}")
    if int(drain_slots) < 1:
        raise ValueError(f"drain_slots must be >= 1, got {drain_slots}")
    apply_fn = apply_fn or _zero_apply
    drain = int(drain_slots)
    n_bins = drain + 1
    half_len = (num_slots - warmup_slots + 1) // 2   # first half: slots [W, W + half_len)

    def _one(key, params, net_params, screen_mode, p_random, mult_params, theta, oracle):
        reset_key, run_key = jax.random.split(key)
        params = params.replace(initial_users=jnp.zeros_like(params.initial_users))
        obs, state = edge.reset(reset_key, params)
        acc0 = _zero_totals(n_bins)

        def _slot(carry, t):
            obs, state, acc = carry
            slot_key = jax.random.fold_in(run_key, t)
            act_key, env_key = jax.random.split(slot_key)
            screen, gain = _screen(apply_fn, net_params, obs, act_key, screen_mode, p_random,
                                   params, state, theta, oracle)
            p_t = params
            if mult_fn is not None:
                lam, mu = mult_fn(mult_params, state, params, edge.EdgeAction(screen, gain),
                                  env_key)
                p_t = params.replace(lambda_s=lam, mu=mu)
            arrival_slot = state.arrival_slot   # of the users present before the step
            obs, state, _, done, info = edge.step(env_key, state, edge.EdgeAction(screen, gain),
                                                  p_t)
            upd, d, lat_slots = _slot_sums(info, done, arrival_slot, t, params, warmup_slots,
                                           num_slots, half_len, drain)
            hist = acc["latency_hist"].at[jnp.clip(lat_slots, 0, n_bins - 1)].add(d)
            acc = {k: (hist if k == "latency_hist" else acc[k] + upd[k]) for k in acc}
            return (obs, state, acc), None

        (_, _, acc), _ = jax.lax.scan(_slot, (obs, state, acc0),
                                      jnp.arange(num_slots + drain, dtype=jnp.int32))
        # Failures (blocked or unfinished at the timeout) sit at the timeout bin.
        failed = jnp.sum(acc["half_arrivals"] - acc["half_finished"])
        acc["latency_hist"] = acc["latency_hist"].at[n_bins - 1].add(failed)
        acc["timeout_s"] = drain * params.tau_s
        return acc

    def batched(keys, params, net_params, screen_mode, p_random, mult_params=None, theta=0.0,
                oracle=None):
        return jax.vmap(_one, in_axes=(0, None, None, None, None, None, None, None))(
            keys, params, net_params, screen_mode, p_random, mult_params,
            jnp.asarray(theta, jnp.float32), oracle)

    return jax.jit(batched)


def quantile_from_hist(hist: np.ndarray, tau_s: float, q: float) -> float:
    """Smallest latency L (s) with at least a share ``q`` of the counted users at latency
    ≤ L (``hist``: users per latency in slots of ``tau_s``); NaN with nobody counted."""
    total = hist.sum()
    if total <= 0:
        return float("nan")
    cdf = np.cumsum(hist) / total
    return float(np.argmax(cdf >= q - 1e-12)) * tau_s


def per_seed_metrics(totals: dict, tau_s: float) -> dict[str, np.ndarray]:
    """Reduces the sums of ``make_evaluator`` ([S] each; ``half_*`` [S, 2]) to per-seed
    metrics [S] by the rule of the module docstring (failures at the timeout)."""
    t = {k: np.asarray(v, np.float64) for k, v in totals.items()}

    def ratio(a, b):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(b > 0, a / np.maximum(b, 1e-300), np.nan)

    timeout = t["timeout_s"] if t["timeout_s"].ndim == 1 else t["timeout_s"].reshape(-1)
    arr_h = t["half_arrivals"]                          # [S, 2]
    fin_h = t["half_finished"]
    lat_h = t["half_latency_s"] + (arr_h - fin_h) * timeout[:, None]   # censored sums
    arrivals, blocked = arr_h.sum(1), t["half_blocked"].sum(1)
    fin, correct, lat = fin_h.sum(1), t["half_correct"].sum(1), lat_h.sum(1)
    latency = ratio(lat, arrivals)
    half_lat = ratio(lat_h, arr_h)
    admitted = arrivals - blocked
    rho = ratio(t["offered_job_s"], t["capacity_s"]) * ratio(arrivals, admitted)
    return {
        "accuracy": ratio(correct, arrivals),
        "latency_mean_s": latency,
        "latency_p95_s": np.array([quantile_from_hist(h, tau_s, 0.95)
                                   for h in t["latency_hist"]]),
        "latency_p90_s": np.array([quantile_from_hist(h, tau_s, 0.90)
                                   for h in t["latency_hist"]]),
        "goodput_hz": ratio(correct, t["slots"] * tau_s),
        "rho": rho,
        "steady_drift": ratio(half_lat[:, 1] - half_lat[:, 0], latency),
        "processing_s": ratio(t["processing_s"], fin),
        "communication_s": ratio(t["communication_s"], fin),
        "queueing_s": ratio(t["queueing_s"], fin),
        "offload_rate": ratio(t["offloads"], t["steps"]),
        "nomination_rate": ratio(t["nominations"], t["decisions"]),
        "server_util": ratio(t["server_busy"], t["slots"]),
        "queue_len": ratio(t["queue_len"], t["slots"]),
        "outage_rate": ratio(t["outages"], t["offloads"] + t["outages"]),
        "blocked_rate": ratio(blocked, arrivals),
        "timeout_rate": ratio(admitted - fin, arrivals),
        "fallback_share": ratio(t["fallbacks"], t["steps"]),
        "capacity_bound_share": ratio(t["capacity_bound"], t["slots"]),
        "bandwidth_bound_share": ratio(t["bandwidth_bound"], t["slots"]),
        "uplink_bound_share": ratio(t["uplink_bound"], t["slots"]),
        "downlink_bound_share": ratio(t["downlink_bound"], t["slots"]),
        "server_batch": ratio(t["server_batch"], t["slots"]),
        "prefix_hit_rate": ratio(t["prefix_hit_tokens"], t["prefix_ctx_tokens"]),
        "evicted_tokens_per_s": ratio(t["evicted_tokens"], t["slots"] * tau_s),
        "kv_in_use_tokens": ratio(t["kv_in_use_tokens"], t["slots"]),
        "finished": fin,
        "arrivals": arrivals,
    }


class Evaluator:
    """Evaluates ``PolicySpec`` rows on one env configuration over seeds (host-side driver).

    Args:
      base_params: env params (trace set, U, latency, M, B, λ, β, ...); may be replaced
        between runs (same shapes: no recompilation).
      seeds: number of seeds S; seed s uses ``jax.random.key(seed0 + s)``.
      num_slots, warmup_slots, mult_fn, drain_slots: see ``make_evaluator``.
      apply_fn, net_params: the screening policy (None: only rows with screen != "policy").

    Attributes:
      evaluate_fn: the jitted ``make_evaluator`` function (for callers that vmap it, e.g. over
        multiplier pairs); ``keys`` [S] its seed keys; ``net_params`` its policy parameters.
    """

    def __init__(self, base_params: edge.EnvParams, seeds: int, num_slots: int,
                 warmup_slots: int, apply_fn: Callable | None = None, net_params: Any = None,
                 seed0: int = 0, mult_fn: Callable | None = None,
                 drain_slots: int = DEFAULT_DRAIN_SLOTS):
        if seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {seeds}")
        self.base_params = base_params
        self.keys = jax.vmap(jax.random.key)(jnp.arange(seed0, seed0 + seeds, dtype=jnp.uint32))
        self.has_policy = apply_fn is not None
        self.net_params = net_params if net_params is not None else jnp.zeros(())
        self.evaluate_fn = make_evaluator(num_slots, warmup_slots, apply_fn, mult_fn,
                                          int(drain_slots))
        self.timeout_s = int(drain_slots) * float(base_params.tau_s)
        self._oracle: tuple[Any, oracle_lib.OracleTables, Any] | None = None

    def oracle_tables(self, params: edge.EnvParams | None = None) -> oracle_lib.OracleTables:
        """The oracle screen's tables of ``params.traces`` (default: ``base_params``), computed
        on the host once per trace set (``prada_jax.traces.oracle.oracle_tables``)."""
        traces = (params or self.base_params).traces
        if self._oracle is None or self._oracle[0] is not traces:
            tables = oracle_lib.oracle_tables(jax.device_get(traces))
            self._oracle = (traces, tables, jnp.asarray(tables.nominate))
        return self._oracle[1]

    def oracle_inputs(self, params: edge.EnvParams, budget: int | None) -> OracleInputs:
        """``OracleInputs`` of ``params.traces`` at ``budget`` offloads per problem (None:
        unlimited, the table's last column)."""
        k = self.oracle_tables(params).max_budget
        b = k if budget is None else min(int(budget), k)
        if b < 0:
            raise ValueError(f"oracle_budget must be >= 0 or None, got {budget}")
        return OracleInputs(self._oracle[2], jnp.asarray(b, jnp.int32))

    def metrics(self, totals: dict, params: edge.EnvParams) -> dict[str, np.ndarray]:
        """Per-seed metrics [S] of ``evaluate_fn`` window sums (one row's), with the env
        objective ``accuracy − β · mean latency`` (β of ``params``)."""
        m = per_seed_metrics(jax.device_get(totals), float(params.tau_s))
        m["objective"] = m["accuracy"] - float(params.beta) * m["latency_mean_s"]
        return m

    def run(self, spec: PolicySpec, mult_params: Any = None, **param_overrides
            ) -> dict[str, np.ndarray]:
        """Per-seed metrics of one row; ``param_overrides`` replace env param leaves (e.g.
        ``num_servers``, ``bandwidth_hz``, ``arrival_rate_hz``) before the row is applied;
        ``mult_params``: the argument of the evaluator's ``mult_fn`` (if it has one)."""
        if spec.screen in ("policy", "critic", "margin") and not self.has_policy:
            raise ValueError(f"policy row '{spec.name}' needs a screening policy (--policy)")
        params = self.base_params
        if param_overrides:
            params = params.replace(**{k: jnp.asarray(v, getattr(params, k).dtype)
                                       for k, v in param_overrides.items()})
        params = apply_spec(params, spec)
        # Every row passes θ and the oracle's table (one compiled signature for every row).
        totals = self.evaluate_fn(self.keys, params, self.net_params, screen_mode(spec.screen),
                                  jnp.asarray(spec.p_random, jnp.float32), mult_params,
                                  jnp.asarray(spec.theta, jnp.float32),
                                  self.oracle_inputs(params, spec.oracle_budget))
        return self.metrics(totals, params)

    def run_all(self, specs: Sequence[PolicySpec], **param_overrides
                ) -> dict[str, dict[str, np.ndarray]]:
        return {s.name: self.run(s, **param_overrides) for s in specs}


def matched_random_probability(evaluator: Evaluator, target_offload_rate: float,
                               **param_overrides) -> tuple[float, dict]:
    """Nomination probability p for the Random row whose realised offload rate matches
    ``target_offload_rate`` (PRADA's mean over seeds).

    Nominations can be refused (resources, outage, expiry), so the realised rate is below p:
    a first pass at p0 = target measures it, and p1 = clip(p0 · target / realised, 0, 1).
    Returns (p1, per-seed metrics of the Random row at p1).
    """
    target = float(np.clip(target_offload_rate, 0.0, 1.0))
    if not math.isfinite(target) or target <= 0.0:
        p = 0.0
    else:
        first = evaluator.run(PolicySpec("Random", "random", "fifo_greedy", p_random=target),
                              **param_overrides)
        realised = float(np.nanmean(first["offload_rate"]))
        p = target if realised <= 0 else float(np.clip(target * target / realised, 0.0, 1.0))
    spec = PolicySpec("Random (matched)", "random", "fifo_greedy", p_random=p)
    return p, evaluator.run(spec, **param_overrides)
