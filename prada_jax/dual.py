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


def choice_values(w, w_bar, b, lambda_s, mu) -> jax.Array:
    """Per-candidate Lagrangian value of (local, queue, immediate): [..., N, 3].

    w, w_bar, b: [..., N]; lambda_s, mu: scalars or [...] (µ in the unit of 1/b).
    """
    lam = jnp.asarray(lambda_s)[..., None]
    mu = jnp.asarray(mu)[..., None]
    imm = w - lam - mu * b
    return jnp.stack([jnp.zeros_like(w), w_bar, imm], axis=-1)


def hard_decision(w, w_bar, b, lambda_s, mu, valid=None) -> jax.Array:
    """Threshold rule before any feasibility repair: the per-slot Lagrangian maximiser.

    Immediate if ``w − λ_s − µ·b ≥ max(w̄, 0)``, else queue if ``w̄ > 0``, else local.
    Returns [..., N] int8 in {0 local, 1 queue, 2 immediate}; invalid candidates are local.
    """
    imm = w - jnp.asarray(lambda_s)[..., None] - jnp.asarray(mu)[..., None] * b
    d = jnp.where(imm >= jnp.maximum(w_bar, 0.0), IMMEDIATE,
                  jnp.where(w_bar > 0.0, QUEUE, LOCAL)).astype(jnp.int8)
    if valid is not None:
        d = jnp.where(valid, d, LOCAL).astype(jnp.int8)
    return d


def soft_decision(w, w_bar, b, lambda_s, mu, temp, valid=None) -> jax.Array:
    """Relaxed threshold rule: softmax over (local, queue, immediate) values / T: [..., N, 3].

    As T → 0 it tends to the one-hot of :func:`hard_decision` (away from ties). Invalid
    candidates get probability 1 on local.
    """
    p = jax.nn.softmax(choice_values(w, w_bar, b, lambda_s, mu) / temp, axis=-1)
    if valid is not None:
        p = jnp.where(valid[..., None], p, jnp.array([1.0, 0.0, 0.0], p.dtype))
    return p


def _slot_dual(w, w_bar, b_s, valid, free_units, free_bw_s, m, temp):
    """Per-slot dual value [...]; hard max if ``temp`` is None, else smooth max at ``temp``.

    b_s, free_bw_s already in units of bw_scale_hz; m: [..., 2] or [2] (λ_s, µ_scaled).
    """
    vals = choice_values(w, w_bar, b_s, m[..., 0], m[..., 1])
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
    return jnp.mean(_slot_dual(batch.w, batch.w_bar, b_s, batch.valid, batch.free_units,
                               free_bw_s, m, temp))


def excess_demand(batch: SlotBatch, mult: Multipliers) -> jax.Array:
    """Excess demand of the hard rule before repair, per slot: [..., 2].

    [..., 0] = Σ immediate − free_units (units); [..., 1] = Σ b·immediate − free_bw (Hz).
    """
    d = hard_decision(batch.w, batch.w_bar, batch.b, mult.lambda_s, mult.mu, batch.valid)
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
    e = excess_demand(batch, mult).reshape(-1, 2)
    return jnp.mean(e, axis=0) / jnp.array([1.0, config.bw_scale_hz], jnp.float32)


def metrics(state: DualState, batch: SlotBatch, config: DualConfig) -> dict[str, jax.Array]:
    """Scalars to log for a batch of slots under the current multipliers.

    dual/lambda_s, dual/mu (per Hz), dual/mu_per_mhz, dual/temperature,
    dual/excess_units and dual/excess_bw_hz (mean excess demand before repair, can be < 0),
    dual/overflow_units and dual/overflow_bw_hz (mean positive part: what a repair must
    remove), dual/relaxed_objective and dual/hard_objective (the dual function with the smooth
    and the hard max) and dual/relaxed_minus_hard (their gap, ≥ 0).
    """
    load = batch.load if config.conditioned else None
    mult = multipliers(state, config, load)
    e = excess_demand(batch, mult).reshape(-1, 2)
    temp = temperature(state.step, config)
    relaxed = dual_objective(state.params, batch, config, temp)
    hard = dual_objective(state.params, batch, config, None)
    return {
        "dual/lambda_s": jnp.mean(mult.lambda_s),
        "dual/mu": jnp.mean(mult.mu),
        "dual/mu_per_mhz": jnp.mean(mult.mu) * 1e6,
        "dual/temperature": temp,
        "dual/excess_units": jnp.mean(e[:, 0]),
        "dual/excess_bw_hz": jnp.mean(e[:, 1]),
        "dual/overflow_units": jnp.mean(jnp.maximum(e[:, 0], 0.0)),
        "dual/overflow_bw_hz": jnp.mean(jnp.maximum(e[:, 1], 0.0)),
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
