"""Learns the Lagrange multipliers λ_s (server units) and µ (bandwidth) of the stage-2 scheduler.

Shaped like an optax transformation: ``init(config) -> DualState`` and
``update(state, batch, config) -> (multipliers, state)``, both pure and jit-able, so an update
can run per slot inside a ``lax.scan`` (``config`` is a frozen, hashable :class:`DualConfig`:
close over it or pass it as a static argument).

The slot (DESIGN §6). Candidate ``i`` of a slot has ``w_i`` (net advantage of running now over
local, reward units), ``w̄_i`` (net advantage of queueing over local) and ``b_i`` (bandwidth it
needs, Hz). With multipliers the per-slot Lagrangian is

    L(x; λ_s, µ) = Σ_i [imm]·(w_i − λ_s − µ·b_i) + [queue]·w̄_i + λ_s·free_units + µ·free_bw,

maximised candidate by candidate by the threshold rule (:func:`hard_decision`). The dual
function of a set of slots S is the mean over slots of that maximum,

    D(λ_s, µ) = mean_s [ Σ_i max(0, w̄_i, w_i − λ_s − µ·b_i) + λ_s·free_units_s + µ·free_bw_s ],

a convex piecewise-linear function whose minimiser over λ_s, µ ≥ 0 prices the resources; its
subgradient is minus the *excess demand* of the threshold rule (Σ imm − free_units,
Σ b·imm − free_bw).

Two ways to learn the multipliers (``DualConfig.mode``):

* ``"subgradient"`` / ``"pid"`` (online): per-slot projected steps on the observed excess
  demand of the hard rule (before the feasibility repair). ``subgradient``:
  ``m ← [m + η_t·e + k_d·(e − e_prev)]₊`` with ``η_t = step_size / sqrt(1 + t/decay_steps)``;
  ``pid`` (Stooke et al. 2020): ``I ← [I + k_i·e]₊``, ``m = [k_p·e + I + k_d·(e − e_prev)]₊``.
  Multipliers are kept ≥ 0 by projection.
* ``"differentiable"``: the max inside D is replaced by the smooth max
  ``T·logsumexp(·/T)`` (softmax relaxation of the local/queue/immediate decision with
  temperature T), the relaxed D_T is minimised with an optax Adam over batches of slots
  (the launcher collects them from rollouts of the edge env with the screening policy fixed),
  T is annealed geometrically from ``temperature`` to ``temperature_min``, and multipliers
  are softplus-parameterised (never negative). Evaluation uses the hard rule.

Opt-in admission price (``queue_price=True``, off by default). DESIGN §6's rule charges the
price only to running now, so it prefers immediate over queue iff ``λ_s + µ·b_i ≤ β·τ·(1+q)``
and the learned price parks at that kink (docs/dual.md). With ``queue_price`` the price is
charged to queueing too (a queued request will use a unit and its upload later): the choice
values are ``(0, w̄_i − λ_s − µ·b_i, w_i − λ_s − µ·b_i)``, so

    D(λ_s, µ) = mean_s [ Σ_i max(0, w̄_i − λ_s − µ·b_i, w_i − λ_s − µ·b_i)
                         + λ_s·free_units_s + µ·free_bw_s ].

This is the dual of the slot problem with the relaxed limits on *admissions*,
``Σ_i (queue_i + imm_i) ≤ free_units`` and ``Σ_i b_i·(queue_i + imm_i) ≤ free_bw``: the price
controls how many requests leave the edge (queued or run now) against the units and bandwidth
free this slot. Its subgradient is minus the excess *admission* demand
``(Σ (imm + queue) − free_units, Σ b·(imm + queue) − free_bw)`` of the unrepaired rule
(:func:`excess_demand`); with ``β·τ > 0`` the unrepaired rule never queues (``w_i > w̄_i``),
so this equals the immediate demand, and the smoothed form counts ``p_queue + p_imm``. Why
free units and not "free units plus what the queue can absorb": the env's queue has no
capacity of its own (a request leaves it by being served or by expiring after
``max_wait_slots``), so every admission is eventually paid for by a unit that frees up; the
supply of a slot is the units idle at its start (with ``skip_full_slots`` only slots with a
free unit count). Counting a queue allowance would need a model of future free units, which
the per-slot dual does not have. The env runs this rule as scheduler ``threshold_admission``.

Optional (off by default, ``conditioned=True``; differentiable mode only): the multipliers
are ``softplus(raw + MLP(load))`` where ``load`` [K] are per-slot load features (queue length,
active users, free units, …, scaled by the caller to O(1)); the MLP's output layer starts at
zero so training starts from the scalar multipliers. The paper uses scalars.

Units. Internally bandwidth is measured in units of ``bw_scale_hz`` (default 1 MHz) so both
multipliers are O(1): ``mu_scaled`` is reward per ``bw_scale_hz``. :class:`Multipliers`
returned to callers carry µ per Hz (``mu``) as the env's threshold rule expects.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

LOCAL, QUEUE, IMMEDIATE = 0, 1, 2
MODES = ("subgradient", "pid", "differentiable")


@dataclasses.dataclass(frozen=True)
class DualConfig:
    """Static settings of the multiplier learner (hashable; build with :func:`config_from`).

    Attributes:
      mode: "subgradient", "pid" or "differentiable".
      init_lambda_s: initial λ_s (reward units per server unit), ≥ 0.
      init_mu: initial µ (reward units per ``bw_scale_hz`` of bandwidth), ≥ 0.
      bw_scale_hz: bandwidth unit used internally (Hz); µ per Hz = mu_scaled / bw_scale_hz.
      step_size: subgradient step η (multiplier units per unit of excess).
      decay_steps: η_t = η / sqrt(1 + t / decay_steps); 0 = constant step.
      kp, ki, kd: PID gains (mode "pid"); kd is also the damping term of "subgradient".
      learning_rate: optax Adam learning rate on the softplus pre-images (differentiable).
      temperature: initial relaxation temperature T_0 (reward units), > 0.
      temperature_min: final temperature, 0 < T_min ≤ T_0.
      anneal_steps: T_t = max(T_min, T_0·(T_min/T_0)^(t/anneal_steps)).
      conditioned: multipliers depend on per-slot load features through a tiny MLP.
      load_features: number K of load features (conditioned only).
      hidden: hidden width of that MLP.
      skip_full_slots: slots without a free server unit do not count in the excess demand
        or the dual objective (see :func:`slot_weights`).
      queue_price: opt-in admission price: the multipliers are charged to queueing too
        (module docstring); the env then runs scheduler ``threshold_admission``.
    """

    mode: str = "differentiable"
    init_lambda_s: float = 0.0
    init_mu: float = 0.0
    bw_scale_hz: float = 1e6
    step_size: float = 0.05
    decay_steps: float = 0.0
    kp: float = 0.1
    ki: float = 0.01
    kd: float = 0.0
    learning_rate: float = 0.05
    temperature: float = 0.3
    temperature_min: float = 0.01
    anneal_steps: int = 500
    conditioned: bool = False
    load_features: int = 3
    hidden: int = 8
    skip_full_slots: bool = True
    queue_price: bool = False

    def __post_init__(self):
        def bad(field, msg):
            raise ValueError(f"config.dual.{field} {msg}")

        if self.mode not in MODES:
            bad("mode", f"must be one of {MODES}, got {self.mode!r}")
        for f in ("init_lambda_s", "init_mu", "decay_steps", "kp", "ki", "kd"):
            if not getattr(self, f) >= 0:
                bad(f, f"must be >= 0, got {getattr(self, f)!r}")
        for f in ("bw_scale_hz", "step_size", "learning_rate", "temperature",
                  "temperature_min"):
            if not getattr(self, f) > 0:
                bad(f, f"must be > 0, got {getattr(self, f)!r}")
        if self.temperature_min > self.temperature:
            bad("temperature_min", f"must be <= temperature ({self.temperature}), got "
                f"{self.temperature_min}")
        if self.anneal_steps < 1:
            bad("anneal_steps", f"must be >= 1, got {self.anneal_steps}")
        if self.conditioned and self.mode != "differentiable":
            bad("conditioned", "needs mode='differentiable' (the MLP is learned by gradient)")
        if self.conditioned and (self.load_features < 1 or self.hidden < 1):
            bad("load_features", "and hidden must be >= 1 when conditioned")


def config_from(cfg: Any) -> DualConfig:
    """A DualConfig from a ConfigDict/dict holding any subset of its fields (others default).

    Unknown keys raise ValueError naming them.
    """
    d = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
    names = {f.name for f in dataclasses.fields(DualConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"config.dual has unknown fields {unknown}; known: {sorted(names)}")
    return DualConfig(**d)


@struct.dataclass
class SlotBatch:
    """Candidate sets of S slots (any leading shape ``[...]`` works; N candidates per slot).

    w, w_bar: [..., N] float32, net advantage of immediate / queue over local (reward units).
    b: [..., N] float32, bandwidth each candidate needs if run now (Hz).
    valid: [..., N] bool, real candidates (others are ignored).
    free_units: [...] float32, free server units this slot.
    free_bw: [...] float32, free bandwidth this slot (Hz).
    load: [..., K] float32, load features for the conditioned variant (zeros otherwise).
    """

    w: jax.Array
    w_bar: jax.Array
    b: jax.Array
    valid: jax.Array
    free_units: jax.Array
    free_bw: jax.Array
    load: jax.Array


def make_batch(w, w_bar, b, valid, free_units, free_bw, load=None, load_features: int = 3):
    """SlotBatch from arrays (casts dtypes; ``load`` defaults to zeros [..., load_features])."""
    w = jnp.asarray(w, jnp.float32)
    if load is None:
        load = jnp.zeros(w.shape[:-1] + (load_features,), jnp.float32)
    return SlotBatch(w=w, w_bar=jnp.asarray(w_bar, jnp.float32),
                     b=jnp.asarray(b, jnp.float32), valid=jnp.asarray(valid, bool),
                     free_units=jnp.asarray(free_units, jnp.float32),
                     free_bw=jnp.asarray(free_bw, jnp.float32),
                     load=jnp.asarray(load, jnp.float32))


class Multipliers(NamedTuple):
    """λ_s (reward per server unit) and µ (reward per Hz); scalars or [...] per slot."""

    lambda_s: jax.Array
    mu: jax.Array


class DualState(NamedTuple):
    """Learner state (a pytree).

    params: {"raw": [2]} — differentiable mode: softplus pre-images of (λ_s, µ_scaled);
      online modes: the multipliers (λ_s, µ_scaled) themselves (kept ≥ 0 by projection).
      Conditioned: also {"net": {"w1" [K,H], "b1" [H], "w2" [H,2], "b2" [2], "skip" [K,2]}}
      (one tanh hidden layer plus a linear skip; w2, b2, skip start at zero).
    opt_state: optax state of ``params`` (differentiable mode), else ().
    integral: [2] PID integral term (pid mode), else unused.
    prev_error: [2] last excess demand (units, bw/bw_scale) for the derivative/damping term.
    step: [] int32 number of updates done.
    """

    params: Any
    opt_state: Any
    integral: jax.Array
    prev_error: jax.Array
    step: jax.Array


def _inv_softplus(x):
    x = jnp.maximum(jnp.asarray(x, jnp.float32), 1e-4)
    return x + jnp.log(-jnp.expm1(-x))


def _optimizer(config: DualConfig):
    return optax.adam(config.learning_rate)


def init(config: DualConfig, key: jax.Array | None = None) -> DualState:
    """Initial learner state. ``key`` initialises the conditioned MLP's hidden layer."""
    m0 = jnp.array([config.init_lambda_s, config.init_mu], jnp.float32)
    if config.mode == "differentiable":
        params = {"raw": _inv_softplus(m0)}
        if config.conditioned:
            key = jax.random.key(0) if key is None else key
            k = config.load_features
            params["net"] = {
                "w1": jax.random.normal(key, (k, config.hidden), jnp.float32) / jnp.sqrt(k),
                "b1": jnp.zeros((config.hidden,), jnp.float32),
                "w2": jnp.zeros((config.hidden, 2), jnp.float32),
                "b2": jnp.zeros((2,), jnp.float32),
                "skip": jnp.zeros((k, 2), jnp.float32),
            }
        opt_state = _optimizer(config).init(params)
    else:
        params = {"raw": m0}
        opt_state = ()
    z = jnp.zeros((2,), jnp.float32)
    integral = m0 if config.mode == "pid" else z
    return DualState(params=params, opt_state=opt_state, integral=integral, prev_error=z,
                     step=jnp.zeros((), jnp.int32))


def _scaled_multipliers(params, config: DualConfig, load=None) -> jax.Array:
    """(λ_s, µ_scaled) as [..., 2]: [2] unless conditioned with ``load`` [..., K]."""
    raw = params["raw"]
    if config.mode != "differentiable":
        return raw
    if config.conditioned and load is not None:
        net = params["net"]
        h = jnp.tanh(load @ net["w1"] + net["b1"])
        raw = raw + h @ net["w2"] + net["b2"] + load @ net["skip"]
    return jax.nn.softplus(raw)


def multipliers(state: DualState, config: DualConfig, load=None) -> Multipliers:
    """Current multipliers in natural units (λ_s per server unit, µ per Hz).

    ``load`` [..., K] (conditioned variant only) gives per-slot multipliers [...].
    """
    m = _scaled_multipliers(state.params, config, load)
    return Multipliers(lambda_s=m[..., 0], mu=m[..., 1] / config.bw_scale_hz)


def temperature(step, config: DualConfig) -> jax.Array:
    """Annealed relaxation temperature after ``step`` updates (reward units)."""
    frac = jnp.minimum(jnp.asarray(step, jnp.float32) / config.anneal_steps, 1.0)
    t = config.temperature * (config.temperature_min / config.temperature) ** frac
    return jnp.maximum(t, config.temperature_min)


def choice_values(w, w_bar, b, lambda_s, mu, queue_price: bool = False) -> jax.Array:
    """Per-candidate Lagrangian value of (local, queue, immediate): [..., N, 3].

    w, w_bar, b: [..., N]; lambda_s, mu: scalars or [...] (µ in the unit of 1/b).
    ``queue_price`` (static): queue is worth ``w̄ − λ_s − µ·b`` instead of ``w̄``.
    """
    lam = jnp.asarray(lambda_s)[..., None]
    mu = jnp.asarray(mu)[..., None]
    if not queue_price:
        imm = w - lam - mu * b  # DESIGN §6 (same operation order as before the option)
        queue = w_bar
    else:
        price = lam + mu * b
        imm = w - price
        queue = w_bar - price
    return jnp.stack([jnp.zeros_like(w), queue, imm], axis=-1)


def hard_decision(w, w_bar, b, lambda_s, mu, valid=None, queue_price: bool = False
                  ) -> jax.Array:
    """Threshold rule before any feasibility repair: the per-slot Lagrangian maximiser.

    Immediate if ``w − λ_s − µ·b ≥ max(v_q, 0)``, else queue if ``v_q > 0``, else local, with
    ``v_q = w̄`` (default) or ``w̄ − λ_s − µ·b`` (``queue_price``, static).
    Returns [..., N] int8 in {0 local, 1 queue, 2 immediate}; invalid candidates are local.
    """
    if not queue_price:
        imm = w - jnp.asarray(lambda_s)[..., None] - jnp.asarray(mu)[..., None] * b
        vq = w_bar
    else:
        price = jnp.asarray(lambda_s)[..., None] + jnp.asarray(mu)[..., None] * b
        imm = w - price
        vq = w_bar - price
    d = jnp.where(imm >= jnp.maximum(vq, 0.0), IMMEDIATE,
                  jnp.where(vq > 0.0, QUEUE, LOCAL)).astype(jnp.int8)
    if valid is not None:
        d = jnp.where(valid, d, LOCAL).astype(jnp.int8)
    return d


def soft_decision(w, w_bar, b, lambda_s, mu, temp, valid=None, queue_price: bool = False
                  ) -> jax.Array:
    """Relaxed threshold rule: softmax over (local, queue, immediate) values / T: [..., N, 3].

    As T → 0 it tends to the one-hot of :func:`hard_decision` (away from ties). Invalid
    candidates get probability 1 on local. ``queue_price``: see :func:`choice_values`.
    """
    p = jax.nn.softmax(choice_values(w, w_bar, b, lambda_s, mu, queue_price) / temp, axis=-1)
    if valid is not None:
        p = jnp.where(valid[..., None], p, jnp.array([1.0, 0.0, 0.0], p.dtype))
    return p


def _slot_dual(w, w_bar, b_s, valid, free_units, free_bw_s, m, temp, queue_price=False):
    """Per-slot dual value [...]; hard max if ``temp`` is None, else smooth max at ``temp``.

    b_s, free_bw_s already in units of bw_scale_hz; m: [..., 2] or [2] (λ_s, µ_scaled).
    """
    vals = choice_values(w, w_bar, b_s, m[..., 0], m[..., 1], queue_price)
    if temp is None:
        best = vals.max(axis=-1)
    else:
        best = temp * jax.nn.logsumexp(vals / temp, axis=-1)
    inner = jnp.sum(jnp.where(valid, best, 0.0), axis=-1)
    return inner + m[..., 0] * free_units + m[..., 1] * free_bw_s


def dual_objective(params, batch: SlotBatch, config: DualConfig, temp=None) -> jax.Array:
    """Mean over slots of the (relaxed if ``temp`` is given) per-slot dual function. Scalar."""
    m = _scaled_multipliers(params, config, batch.load if config.conditioned else None)
    b_s = batch.b / config.bw_scale_hz
    free_bw_s = batch.free_bw / config.bw_scale_hz
    per_slot = _slot_dual(batch.w, batch.w_bar, b_s, batch.valid, batch.free_units,
                          free_bw_s, m, temp, config.queue_price)
    return _weighted_mean(per_slot, slot_weights(batch, config))


def slot_weights(batch: SlotBatch, config: DualConfig) -> jax.Array:
    """[...] weight of each slot in learning: 1, or (``skip_full_slots``) 0 for a slot with
    no free server unit — there the repair queues or keeps local every request whatever the
    multipliers are, so its demand says nothing about their price (and a request waiting
    through several full slots would be counted once per slot)."""
    if not config.skip_full_slots:
        return jnp.ones_like(batch.free_units)
    return (batch.free_units >= 1).astype(jnp.float32)


def _weighted_mean(v, weights):
    """Σ weights·v / max(Σ weights, 1) over all leading dims of v [..., (k)]."""
    wts = weights.reshape(-1)
    v = v.reshape((wts.shape[0],) + v.shape[weights.ndim:])
    wts = wts.reshape((-1,) + (1,) * (v.ndim - 1))
    return jnp.sum(wts * v, axis=0) / jnp.maximum(jnp.sum(wts), 1.0)


def excess_demand(batch: SlotBatch, mult: Multipliers, queue_price: bool = False) -> jax.Array:
    """Excess demand of the hard rule before repair, per slot: [..., 2].

    [..., 0] = Σ immediate − free_units (units); [..., 1] = Σ b·immediate − free_bw (Hz).
    With ``queue_price`` (static) the demand the price controls is admissions: immediate and
    queue both count (minus the subgradient of that dual function; module docstring).
    """
    d = hard_decision(batch.w, batch.w_bar, batch.b, mult.lambda_s, mult.mu, batch.valid,
                      queue_price=queue_price)
    if queue_price:
        imm = ((d == IMMEDIATE) | (d == QUEUE)).astype(jnp.float32)
    else:
        imm = (d == IMMEDIATE).astype(jnp.float32)
    return jnp.stack([imm.sum(-1) - batch.free_units,
                      (imm * batch.b).sum(-1) - batch.free_bw], axis=-1)


def update(state: DualState, batch: SlotBatch, config: DualConfig
           ) -> tuple[Multipliers, DualState]:
    """One learning step on a batch of slots (leading dims averaged). Pure and jit-able.

    Online modes step on the mean excess demand of the hard rule under the current
    multipliers; the differentiable mode takes one optax step on the relaxed dual objective
    at the current annealed temperature. Returns the new multipliers (natural units; for the
    conditioned variant the load-free base values) and the new state.
    """
    load = batch.load if config.conditioned else None
    if config.mode == "differentiable":
        temp = temperature(state.step, config)
        grads = jax.grad(dual_objective)(state.params, batch, config, temp)
        updates, opt_state = _optimizer(config).update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        mult_now = multipliers(state, config, load)
        e = _mean_excess(batch, mult_now, config)
        state = state._replace(params=params, opt_state=opt_state, prev_error=e,
                               step=state.step + 1)
        return multipliers(state, config), state

    e = _mean_excess(batch, multipliers(state, config), config)
    de = jnp.where(state.step > 0, e - state.prev_error, 0.0)
    if config.mode == "subgradient":
        eta = config.step_size
        if config.decay_steps > 0:
            eta = eta / jnp.sqrt(1.0 + state.step.astype(jnp.float32) / config.decay_steps)
        m = jnp.maximum(state.params["raw"] + eta * e + config.kd * de, 0.0)
        integral = state.integral
    else:  # pid
        integral = jnp.maximum(state.integral + config.ki * e, 0.0)
        m = jnp.maximum(config.kp * e + integral + config.kd * de, 0.0)
    state = state._replace(params={"raw": m}, integral=integral, prev_error=e,
                           step=state.step + 1)
    return multipliers(state, config), state


def _mean_excess(batch: SlotBatch, mult: Multipliers, config: DualConfig) -> jax.Array:
    """Mean excess over slots, bandwidth in units of bw_scale_hz: [2]."""
    e = _weighted_mean(excess_demand(batch, mult, config.queue_price),
                       slot_weights(batch, config))
    return e / jnp.array([1.0, config.bw_scale_hz], jnp.float32)


def metrics(state: DualState, batch: SlotBatch, config: DualConfig) -> dict[str, jax.Array]:
    """Scalars to log for a batch of slots under the current multipliers.

    dual/lambda_s, dual/mu (per Hz), dual/mu_per_mhz, dual/temperature,
    dual/excess_units and dual/excess_bw_hz (mean excess demand before repair, can be < 0),
    dual/overflow_units and dual/overflow_bw_hz (mean positive part: what a repair must
    remove) — means over the slots that count for learning (:func:`slot_weights`);
    dual/learning_slots (their share), dual/relaxed_objective and dual/hard_objective (the dual function with the smooth
    and the hard max) and dual/relaxed_minus_hard (their gap, ≥ 0).
    """
    load = batch.load if config.conditioned else None
    mult = multipliers(state, config, load)
    e = excess_demand(batch, mult, config.queue_price)
    wts = slot_weights(batch, config)
    temp = temperature(state.step, config)
    relaxed = dual_objective(state.params, batch, config, temp)
    hard = dual_objective(state.params, batch, config, None)
    return {
        "dual/lambda_s": jnp.mean(mult.lambda_s),
        "dual/mu": jnp.mean(mult.mu),
        "dual/mu_per_mhz": jnp.mean(mult.mu) * 1e6,
        "dual/temperature": temp,
        "dual/excess_units": _weighted_mean(e[..., 0], wts),
        "dual/excess_bw_hz": _weighted_mean(e[..., 1], wts),
        "dual/overflow_units": _weighted_mean(jnp.maximum(e[..., 0], 0.0), wts),
        "dual/overflow_bw_hz": _weighted_mean(jnp.maximum(e[..., 1], 0.0), wts),
        "dual/learning_slots": jnp.mean(wts),
        "dual/relaxed_objective": relaxed,
        "dual/hard_objective": hard,
        "dual/relaxed_minus_hard": relaxed - hard,
    }


class DualAscent(NamedTuple):
    """optax-style pair bound to one config: ``init(key=None)``, ``update(state, batch)``."""

    init: Any
    update: Any


def make(config: DualConfig) -> DualAscent:
    """Binds ``config``: ``d = make(cfg); s = d.init(); m, s = d.update(s, batch)``."""
    return DualAscent(init=lambda key=None: init(config, key),
                      update=lambda state, batch: update(state, batch, config))


# Saved multipliers -------------------------------------------------------------------------

MULTIPLIERS_FILE = "multipliers.json"


def save_multipliers(workdir, mult: Multipliers, info: dict | None = None):
    """Writes ``<workdir>/multipliers.json`` atomically (temp file + rename).

    Fields: ``lambda_s`` (PRM units per server unit), ``mu`` (PRM units per Hz),
    ``mu_per_mhz``, plus ``info`` (mode, chunk, slots, scenario, ...). Returns the path.
    """
    import json
    import math
    import os
    from pathlib import Path

    lam, mu = float(mult.lambda_s), float(mult.mu)
    if not (math.isfinite(lam) and math.isfinite(mu) and lam >= 0 and mu >= 0):
        raise ValueError(f"save_multipliers: multipliers must be finite and >= 0, got "
                         f"lambda_s={lam}, mu={mu}")
    path = Path(workdir) / MULTIPLIERS_FILE
    payload = dict(info or {}, lambda_s=lam, mu=mu, mu_per_mhz=mu * 1e6)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
    return path


def load_multipliers(workdir) -> Multipliers:
    """(λ_s, µ) learned by a ``train.dual`` run, as plain floats (µ per Hz).

    Reads ``<workdir>/multipliers.json`` (written at every checkpoint and at the end).
    For a load-conditioned run these are its multipliers at the mean load features of the
    last training chunk (the scalar form the paper and the evaluation use). Raises
    FileNotFoundError / ValueError naming the file.
    """
    import json
    import math
    from pathlib import Path

    path = Path(workdir) / MULTIPLIERS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (is {workdir} a train.dual run directory "
                                "that saved at least one checkpoint?)")
    try:
        d = json.loads(path.read_text())
        lam, mu = float(d["lambda_s"]), float(d["mu"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed ({type(e).__name__}: {e})") from None
    for name, v in (("lambda_s", lam), ("mu", mu)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{path}: field '{name}' must be a finite number >= 0, got {v}")
    return Multipliers(lambda_s=lam, mu=mu)


# Slots from the edge env -------------------------------------------------------------------
# The functions below read one slot's candidate set out of ``envs.edge`` so multipliers can be
# learned over env rollouts. ``envs`` is imported inside functions (``prada_jax`` never needs it
# at import time).

LOAD_FEATURES = 3  # queue length / M, active users / U, free server units / M


def slot_from_sched(x, free_units, free_bw_hz, sp, load) -> SlotBatch:
    """SlotBatch of one slot from the scheduler's view (``prada_jax.sched`` types).

    ``w``/``w̄`` are the threshold rule's own net advantages (``sched.threshold.advantages``);
    candidates that already waited ``max_wait_slots`` are not valid (kept local by every
    scheduler and by the env). x: SchedInputs with [U] fields; load: [K].
    """
    from prada_jax.sched.base import expired
    from prada_jax.sched.threshold import advantages

    w, w_bar, _ = advantages(x, sp)
    valid = x.candidate & ~expired(x, sp)
    return SlotBatch(w=w, w_bar=w_bar, b=x.bandwidth_hz.astype(jnp.float32), valid=valid,
                     free_units=jnp.asarray(free_units, jnp.float32),
                     free_bw=jnp.asarray(free_bw_hz, jnp.float32),
                     load=jnp.asarray(load, jnp.float32))


def edge_slot_inputs(state, action, params, noise):
    """The candidate set the env's scheduler will see in this slot, before ``step``.

    Mirrors the first lines of ``envs.edge.step_with_noise`` (a test checks the env decides
    exactly what the threshold rule decides on these inputs).

    Args:
      state: ``envs.edge.EnvState``; action: ``EdgeAction`` or [U] int32; params: EnvParams;
      noise: the slot's ``envs.edge.Noise``.
    Returns:
      (x: SchedInputs [U], free_units int32, free_bw_hz float32, load [3] float32).
    """
    from envs import edge
    from prada_jax.sched.base import SchedInputs
    from prada_jax.sched.registry import RSD_INDEX

    u = params.num_users
    if isinstance(action, edge.EdgeAction):
        screen = jnp.asarray(action.screen, jnp.int32)
        gain_in = jnp.asarray(action.gain, jnp.float32)
    else:
        screen = jnp.asarray(action, jnp.int32)
        gain_in = jnp.full((u,), params.default_gain, jnp.float32)
    deciding = state.phase == edge.DECIDE
    nominated = deciding & ((screen == 1) | (params.scheduler == RSD_INDEX))
    queued = state.phase == edge.QUEUE_PHASE
    cand = nominated | queued
    gain = jnp.where(deciding, gain_in, state.gain)
    req = edge.request_scalars(state, params, noise.fading)
    free_units, free_bw = edge.free_resources(state, params)  # scenario's M_t, B_t
    tr = params.traces
    n = state.node
    queue_len = jnp.sum(queued.astype(jnp.int32))
    x = SchedInputs(candidate=cand, gain=gain, delay_s=req["delay_s"],
                    bandwidth_hz=req["bandwidth_hz"], wait_slots=state.wait,
                    ctx_tokens=tr.ctx_tokens[n], snr=req["snr"], draft_prm=tr.cand_prm[n, 0],
                    u_rand=noise.u_sched, queue_len=queue_len)
    m = params.num_servers.astype(jnp.float32)
    load = jnp.stack([queue_len / m, jnp.mean(state.active.astype(jnp.float32)),
                      free_units / m]).astype(jnp.float32)
    return x, free_units, free_bw, load


def make_trace_rule_policy(threshold: float = 0.0):
    """A simple nomination rule for runs without a trained PPO policy (tests, smoke runs).

    It is *privileged*: it reads the trace's PRM scores of both candidates (which the real
    edge cannot see). ``gain = cand_prm[node, 1] − cand_prm[node, 0]`` (PRM units) is carried
    to the server and the step is nominated iff ``gain > threshold``.
    Returns ``policy_fn(key, obs [U, D], state, params) -> EdgeAction``.
    """
    from envs import edge

    def policy_fn(key, obs, state, params):
        del key, obs
        cp = params.traces.cand_prm[state.node]
        gain = (cp[:, 1] - cp[:, 0]).astype(jnp.float32)
        return edge.EdgeAction(screen=(gain > threshold).astype(jnp.int32), gain=gain)

    return policy_fn


def make_ppo_policy(apply_fn, net_params, greedy: bool = True):
    """The trained screening policy: ``apply_fn(params, obs) -> (logits [U,2], q [U,2])``.

    Nominates by argmax of the logits (``greedy``) or by sampling; the nomination carries the
    critic's ΔQ = Q(s,1) − Q(s,0). Returns ``policy_fn(key, obs, state, params)``.
    """
    from envs import edge

    def policy_fn(key, obs, state, params):
        del state, params
        logits, q = apply_fn(net_params, obs)
        screen = (jnp.argmax(logits, -1) if greedy
                  else jax.random.categorical(key, logits, axis=-1))
        return edge.EdgeAction(screen=screen.astype(jnp.int32),
                               gain=(q[..., 1] - q[..., 0]).astype(jnp.float32))

    return policy_fn


class RolloutCarry(NamedTuple):
    """Scan carry of the env rollout: env_state [E, ...], obs [E, U, D], dual DualState,
    key (typed), slots (int32, slots simulated per env so far)."""

    env_state: Any
    obs: jax.Array
    dual: DualState
    key: jax.Array
    slots: jax.Array


def init_rollout(key, env_params, config: DualConfig, num_envs: int) -> RolloutCarry:
    """Resets ``num_envs`` edge envs and the dual state."""
    from envs import edge

    k_dual, k_reset, k_next = jax.random.split(key, 3)
    obs, env_state = jax.vmap(edge.reset, in_axes=(0, None))(
        jax.random.split(k_reset, num_envs), env_params)
    return RolloutCarry(env_state=env_state, obs=obs, dual=init(config, k_dual), key=k_next,
                        slots=jnp.zeros((), jnp.int32))


def make_rollout(config: DualConfig, policy_fn, rollout_len: int, learn: bool = True):
    """``rollout(carry, env_params) -> (carry, out)``: ``rollout_len`` slots of E envs.

    Every env runs the *hard* threshold rule (``env_params.scheduler`` should be the threshold
    index; with ``config.queue_price`` it is set to ``threshold_admission``) with the current
    multipliers (per env and slot when conditioned). In the online
    modes the dual state is updated every slot on the E envs' candidate sets (inside the scan);
    in the differentiable mode (or with ``learn=False``, for evaluation) it is left unchanged
    (see :func:`make_train_chunk`).

    ``out``: ``batch`` SlotBatch [T, E, U], ``x`` SchedInputs [T, E, U], ``lambda_s``/``mu``
    [T, E] used, ``reward`` [T, E] (sum over users), and per-slot env metrics [T, E]
    (``server_in_use``, ``bandwidth_in_use_hz``, ``queue_len``, ``finished``, ``correct``,
    ``latency_s`` (sum over finished users), ``blocked``), and the env's own
    ``decision`` / ``outage`` [T, E, U] (after its enforcement).
    """
    from envs import edge

    def _one_env(key, env_state, obs, lam, mu, env_params):
        k_noise, k_pol = jax.random.split(key)
        noise = edge.draw_noise(k_noise, env_params)
        action = policy_fn(k_pol, obs, env_state, env_params)
        x, free_units, free_bw, load = edge_slot_inputs(env_state, action, env_params, noise)
        sp = edge.sched_params(env_params)
        batch = slot_from_sched(x, free_units, free_bw, sp, load)
        p = env_params.replace(lambda_s=lam, mu=mu)
        if config.queue_price:  # the env must run the rule the learner prices
            from prada_jax.sched.registry import THRESHOLD_ADMISSION_INDEX
            p = p.replace(scheduler=jnp.asarray(THRESHOLD_ADMISSION_INDEX, jnp.int32))
        obs, env_state, reward, done, info = edge.step_with_noise(env_state, action, p, noise)
        stats = dict(reward=jnp.sum(reward), server_in_use=info["server_in_use"],
                     bandwidth_in_use_hz=info["bandwidth_in_use_hz"],
                     queue_len=info["queue_len"], blocked=info["blocked"],
                     finished=jnp.sum(done.astype(jnp.int32)),
                     correct=jnp.sum(info["user_correct"].astype(jnp.int32)),
                     latency_s=jnp.sum(info["user_latency_s"]),
                     decision=info["decision"], outage=info["outage"])
        return env_state, obs, batch, x, stats

    def _slot(carry: RolloutCarry, _, env_params):
        key, k_slot = jax.random.split(carry.key)
        num_envs = carry.obs.shape[0]
        keys = jax.random.split(k_slot, num_envs)
        # Multipliers this slot: per env from its load when conditioned.
        if config.conditioned:
            _, _, _, load = jax.vmap(_peek_load, in_axes=(0, 0, 0, 0, None))(
                keys, carry.env_state, carry.obs, jnp.zeros(num_envs), env_params)
            mult = multipliers(carry.dual, config, load)
        else:
            m = multipliers(carry.dual, config)
            mult = Multipliers(jnp.full((num_envs,), m.lambda_s), jnp.full((num_envs,), m.mu))
        env_state, obs, batch, x, stats = jax.vmap(_one_env, in_axes=(0, 0, 0, 0, 0, None))(
            keys, carry.env_state, carry.obs, mult.lambda_s, mult.mu, env_params)
        dual_state = carry.dual
        if learn and config.mode != "differentiable":
            _, dual_state = update(dual_state, batch, config)
        carry = RolloutCarry(env_state=env_state, obs=obs, dual=dual_state, key=key,
                             slots=carry.slots + 1)
        out = dict(batch=batch, x=x, lambda_s=mult.lambda_s, mu=mult.mu, **stats)
        return carry, out

    def _peek_load(key, env_state, obs, _unused, env_params):
        k_noise, k_pol = jax.random.split(key)
        noise = edge.draw_noise(k_noise, env_params)
        action = policy_fn(k_pol, obs, env_state, env_params)
        return edge_slot_inputs(env_state, action, env_params, noise)

    def rollout(carry: RolloutCarry, env_params):
        return jax.lax.scan(lambda c, _: _slot(c, _, env_params), carry, None,
                            length=rollout_len)

    return rollout


def make_train_chunk(config: DualConfig, policy_fn, rollout_len: int, sgd_steps: int = 1):
    """``train_chunk(carry, env_params) -> (carry, metrics)``: one rollout, then learning.

    Online modes learn inside the rollout (one update per slot). The differentiable mode then
    takes ``sgd_steps`` optax steps on the relaxed dual objective of all T·E collected slots.
    ``metrics`` (scalars): :func:`metrics` on the collected slots after learning, plus
    ``env/reward_per_slot`` (sum over users, mean over envs and slots), ``env/server_in_use``,
    ``env/bandwidth_in_use_hz``, ``env/queue_len``, ``env/finished``, ``env/accuracy`` and
    ``env/latency_s`` (over users finished in this chunk; NaN if none), ``env/blocked``,
    ``dual/candidates_per_slot``, and ``dual/rollout_*``: the multipliers each slot actually
    ran with and the excess demand (before repair) they produced, averaged over the chunk;
    ``dual/load_mean`` [K] is the mean load-feature vector of the chunk (not a scalar).
    """
    rollout = make_rollout(config, policy_fn, rollout_len)

    def train_chunk(carry: RolloutCarry, env_params):
        carry, out = rollout(carry, env_params)
        batch = out["batch"]
        dual_state = carry.dual
        if config.mode == "differentiable":
            def _sgd(s, _):
                _, s = update(s, batch, config)
                return s, None
            dual_state, _ = jax.lax.scan(_sgd, dual_state, None, length=sgd_steps)
        carry = carry._replace(dual=dual_state)
        m = metrics(dual_state, batch, config)
        used = Multipliers(out["lambda_s"], out["mu"])  # [T, E], what each slot ran with
        e_used = excess_demand(batch, used, config.queue_price)
        w_used = slot_weights(batch, config)
        fin = jnp.sum(out["finished"])
        m.update({
            "env/reward_per_slot": jnp.mean(out["reward"]),
            "env/server_in_use": jnp.mean(out["server_in_use"]),
            "env/bandwidth_in_use_hz": jnp.mean(out["bandwidth_in_use_hz"]),
            "env/queue_len": jnp.mean(out["queue_len"]),
            "env/finished": fin.astype(jnp.float32),
            "env/accuracy": jnp.sum(out["correct"]) / fin,
            "env/latency_s": jnp.sum(out["latency_s"]) / fin,
            "env/blocked": jnp.sum(out["blocked"]).astype(jnp.float32),
            "dual/candidates_per_slot": jnp.mean(jnp.sum(batch.valid, -1)),
            "dual/rollout_lambda_s": jnp.mean(used.lambda_s),
            "dual/rollout_mu_per_mhz": jnp.mean(used.mu) * 1e6,
            "dual/rollout_excess_units": _weighted_mean(e_used[..., 0], w_used),
            "dual/rollout_excess_bw_hz": _weighted_mean(e_used[..., 1], w_used),
            "dual/rollout_overflow_units": _weighted_mean(jnp.maximum(e_used[..., 0], 0.0),
                                                          w_used),
            "dual/load_mean": jnp.mean(batch.load.reshape(-1, batch.load.shape[-1]), axis=0),
        })
        return carry, m

    return train_chunk
