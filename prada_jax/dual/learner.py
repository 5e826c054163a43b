"""Learns the admission prices λ_s (server) and µ (bandwidth) of the stage-2 threshold rule.

Shaped like an optax transformation: ``init(config, key) -> state``,
``update(state, batch, config) -> (multipliers, state)`` and ``metrics(state, batch, config)``,
all pure and jit-able (``config`` is a frozen, hashable :class:`DualConfig`: close over it or
pass it as a static argument). The problem priced (the long-run dual function, its batch type)
is ``prada_jax.dual.problem``; derivation and measured numbers: docs/dual.md.

Each learner mode (``DualConfig.mode``) has its own state type:

* ``"subgradient"`` (:class:`SubgradientState`): projected steps on the observed long-run
  occupancy excess ``e`` of the hard rule (before repair; each admission counted with its own
  service time, ``problem.excess_demand``), ``m ← [m + η_t·e + k_d·(e − e_prev)]₊`` with
  ``η_t = step_size / sqrt(1 + t/decay_steps)``.
* ``"pid"`` (:class:`PidState`, Stooke et al. 2020): ``I ← [I + k_i·e]₊``,
  ``m = [k_p·e + I + k_d·(e − e_prev)]₊``.
* ``"differentiable"`` (:class:`AdamState`): the max inside D is the smooth max
  ``T·logsumexp(·/T)`` (``sched.threshold.soft_choice``); the relaxed D_T is minimised with
  optax Adam over batches of slots, T annealed geometrically from ``temperature`` to
  ``temperature_min``, multipliers softplus-parameterised (never negative). Evaluation uses the
  hard rule. Load-conditioned (``conditioned=True``): ``softplus(raw + MLP(load))`` with
  ``load`` [K] per-slot features (the env's, e.g. ``envs.stage2.load_features``); the MLP's
  output layer starts at zero, so training starts from the scalar multipliers.

The online modes export (:func:`export_multipliers`) the Polyak–Ruppert average of the iterates
over the last ``average_tail`` share of the run's ``average_horizon`` updates: dual subgradient
theory guarantees convergence of the averaged iterates, not of the last one.

Units. Internally bandwidth is measured in units of ``bw_scale_hz`` (default 1 MHz) so both
multipliers are O(1): ``mu_scaled`` is reward per ``bw_scale_hz``. :class:`Multipliers`
returned to callers carry µ per Hz (``mu``) as the env's threshold rule expects.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Union

import jax
import jax.numpy as jnp
import optax

from prada_jax.dual.problem import (Multipliers, SlotBatch, admitted, excess_demand,
                                      service_time, slot_dual, weighted_mean)

MODES = ("subgradient", "pid", "differentiable")


@dataclasses.dataclass(frozen=True)
class DualConfig:
    """Static settings of the multiplier learner (hashable; build with :func:`config_from`).

    Attributes:
      mode: "subgradient", "pid" or "differentiable".
      init_lambda_s: initial λ_s (reward units per admission), ≥ 0.
      init_mu: initial µ (reward units per ``bw_scale_hz`` of bandwidth), ≥ 0.
      bw_scale_hz: bandwidth unit used internally (Hz); µ per Hz = mu_scaled / bw_scale_hz.
      step_size: subgradient step η (multiplier units per unit of excess: per busy unit-slot
        for λ_s, per ``bw_scale_hz``·slot for µ; with one-slot jobs, per admission).
      decay_steps: η_t = η / sqrt(1 + t / decay_steps); 0 = constant step.
      kp, ki, kd: PID gains (mode "pid"); kd is also the damping term of "subgradient".
      learning_rate: optax Adam learning rate on the softplus pre-images (differentiable).
      temperature: initial relaxation temperature T_0 (reward units), > 0.
      temperature_min: final temperature, 0 < T_min ≤ T_0.
      anneal_steps: T_t = max(T_min, T_0·(T_min/T_0)^(t/anneal_steps)).
      conditioned: multipliers depend on per-slot load features through a tiny MLP.
      load_features: number K of load features (conditioned only).
      hidden: hidden width of that MLP.
      skip_full_slots: slots without a free server unit get weight 0 in learning (off by
        default: the long-run constraints count every slot).
      average_tail: online modes: the exported constant is the mean of the multiplier iterates
        after the updates numbered ``floor((1 − average_tail)·average_horizon) + 1 …``
        (Polyak–Ruppert averaging; 0.5 = the second half of the run), in [0, 1]; 0 = the last
        iterate. Ignored by the differentiable mode (its export is the last iterate).
      average_horizon: number of updates the run will make (online modes: one per slot, set
        by ``prada_jax.dual.trainer.validate_config`` from ``train.*``); ≥ 0.
      utilisation: ρ in (0, 1], the share of the server capacity the long-run occupancy
        constraint allows: busy units the admissions ask for, each with its own service time,
        ≤ ρ·M_t per slot on average (bandwidth keeps B_t).
        1.0 (default) is the plain capacity constraint; docs/dual.md, "Utilisation target",
        gives the M/M/1 argument for ρ = 0.5 (mean wait in queue ≤ service time).
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
    skip_full_slots: bool = False
    utilisation: float = 1.0
    average_tail: float = 0.0
    average_horizon: int = 0

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
        if not 0.0 < self.utilisation <= 1.0:
            bad("utilisation", f"must be in (0, 1], got {self.utilisation!r}")
        if not 0.0 <= self.average_tail <= 1.0:
            bad("average_tail", f"must be in [0, 1], got {self.average_tail!r}")
        if self.average_horizon < 0:
            bad("average_horizon", f"must be >= 0, got {self.average_horizon!r}")
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


class SubgradientState(NamedTuple):
    """Projected subgradient learner (a pytree).

    m: [2] the multipliers (λ_s, µ_scaled), kept ≥ 0 by projection.
    prev_error: [2] last mean excess (admissions, bw / bw_scale) for the damping term.
    step: [] int32 number of updates done.
    avg_sum: [2] sum of the iterates inside the averaging window; avg_count: [] float32 their
      number (both zero unless ``average_tail > 0``).
    """

    m: jax.Array
    prev_error: jax.Array
    step: jax.Array
    avg_sum: jax.Array
    avg_count: jax.Array


class PidState(NamedTuple):
    """PID learner (a pytree): the fields of :class:`SubgradientState` plus
    ``integral`` [2], the clipped integral term."""

    m: jax.Array
    integral: jax.Array
    prev_error: jax.Array
    step: jax.Array
    avg_sum: jax.Array
    avg_count: jax.Array


class AdamState(NamedTuple):
    """Differentiable learner (a pytree).

    params: {"raw": [2]} softplus pre-images of (λ_s, µ_scaled); conditioned: also
      {"net": {"w1" [K,H], "b1" [H], "w2" [H,2], "b2" [2], "skip" [K,2]}} (one tanh hidden
      layer plus a linear skip; w2, b2, skip start at zero).
    opt_state: optax Adam state of ``params``.
    step: [] int32 number of updates done (drives the temperature schedule).
    """

    params: Any
    opt_state: Any
    step: jax.Array


LearnerState = Union[SubgradientState, PidState, AdamState]


def _inv_softplus(x):
    x = jnp.maximum(jnp.asarray(x, jnp.float32), 1e-4)
    return x + jnp.log(-jnp.expm1(-x))


def _optimizer(config: DualConfig):
    return optax.adam(config.learning_rate)


def init(config: DualConfig, key: jax.Array | None = None) -> LearnerState:
    """Initial state of the mode's learner. ``key`` initialises the conditioned MLP."""
    m0 = jnp.array([config.init_lambda_s, config.init_mu], jnp.float32)
    z = jnp.zeros((2,), jnp.float32)
    step = jnp.zeros((), jnp.int32)
    if config.mode == "subgradient":
        return SubgradientState(m=m0, prev_error=z, step=step, avg_sum=z,
                                avg_count=jnp.zeros((), jnp.float32))
    if config.mode == "pid":
        return PidState(m=m0, integral=m0, prev_error=z, step=step, avg_sum=z,
                        avg_count=jnp.zeros((), jnp.float32))
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
    return AdamState(params=params, opt_state=_optimizer(config).init(params), step=step)


def _softplus_multipliers(params, config: DualConfig, load=None) -> jax.Array:
    """(λ_s, µ_scaled) [..., 2] of the differentiable learner's ``params``: [2] unless
    conditioned with ``load`` [..., K]."""
    raw = params["raw"]
    if config.conditioned and load is not None:
        net = params["net"]
        h = jnp.tanh(load @ net["w1"] + net["b1"])
        raw = raw + h @ net["w2"] + net["b2"] + load @ net["skip"]
    return jax.nn.softplus(raw)


def _scaled(state: LearnerState, config: DualConfig, load=None) -> jax.Array:
    if isinstance(state, AdamState):
        return _softplus_multipliers(state.params, config, load)
    return state.m


def _natural(m: jax.Array, config: DualConfig) -> Multipliers:
    return Multipliers(lambda_s=m[..., 0], mu=m[..., 1] / config.bw_scale_hz)


def multipliers(state: LearnerState, config: DualConfig, load=None) -> Multipliers:
    """Current multipliers in natural units (λ_s per admission, µ per Hz).

    ``load`` [..., K] (conditioned variant only) gives per-slot multipliers [...].
    """
    return _natural(_scaled(state, config, load), config)


def averaging(config: DualConfig) -> bool:
    """True if the exported constant is an average of iterates (online modes, tail > 0)."""
    return config.mode != "differentiable" and config.average_tail > 0.0


def average_start(config: DualConfig) -> int:
    """Updates done before the averaging window opens: ``floor((1 − tail)·horizon)``; the
    iterates after updates ``average_start + 1, …`` are averaged."""
    return int((1.0 - config.average_tail) * config.average_horizon)


def export_multipliers(state: LearnerState, config: DualConfig, load=None) -> Multipliers:
    """The constant pair a run stores and evaluates (natural units, like :func:`multipliers`).

    Online modes with ``average_tail > 0``: the mean of the iterates in the averaging window
    (:func:`average_start`) once it holds at least one, else the current iterate. Otherwise
    (differentiable, conditioned at ``load``, tail 0): :func:`multipliers`.
    """
    if not averaging(config):
        return multipliers(state, config, load)
    n = state.avg_count
    return _natural(jnp.where(n > 0, state.avg_sum / jnp.maximum(n, 1.0), state.m), config)


def temperature(step, config: DualConfig) -> jax.Array:
    """Annealed relaxation temperature after ``step`` updates (reward units)."""
    frac = jnp.minimum(jnp.asarray(step, jnp.float32) / config.anneal_steps, 1.0)
    t = config.temperature * (config.temperature_min / config.temperature) ** frac
    return jnp.maximum(t, config.temperature_min)


def slot_weights(batch: SlotBatch, config: DualConfig) -> jax.Array:
    """[...] weight of each slot in learning: 1, or (``skip_full_slots``) 0 for a slot with
    no free server unit."""
    if not config.skip_full_slots:
        return jnp.ones_like(batch.free_units)
    return (batch.free_units >= 1).astype(jnp.float32)


def _objective(m: jax.Array, batch: SlotBatch, config: DualConfig, temp) -> jax.Array:
    """Weighted mean over slots of the dual function at (λ_s, µ_scaled) ``m`` [2] or [..., 2],
    with the admissions' mean service times at ``m`` (``problem.service_time``, no gradient)."""
    wts = slot_weights(batch, config)
    kbar = service_time(batch, _natural(jax.lax.stop_gradient(m), config), wts)
    per_slot = slot_dual(batch, batch.b / config.bw_scale_hz,
                         batch.capacity_bw / config.bw_scale_hz, m, kbar, temp,
                         config.utilisation)
    return weighted_mean(per_slot, wts)


def dual_objective(params, batch: SlotBatch, config: DualConfig, temp=None) -> jax.Array:
    """Mean over slots of the (relaxed if ``temp`` is given) long-run dual function at the
    differentiable learner's ``params`` (softplus pre-images). Scalar."""
    load = batch.load if config.conditioned else None
    return _objective(_softplus_multipliers(params, config, load), batch, config, temp)


def state_objective(state: LearnerState, batch: SlotBatch, config: DualConfig,
                    temp=None) -> jax.Array:
    """The dual function of :func:`dual_objective` at any learner's current multipliers."""
    load = batch.load if config.conditioned else None
    return _objective(_scaled(state, config, load), batch, config, temp)


def _mean_excess(batch: SlotBatch, mult: Multipliers, config: DualConfig) -> jax.Array:
    """Mean long-run occupancy excess over slots (busy unit-slots − ρ·M per slot; bandwidth
    in ``bw_scale_hz``·slots − B): [2]."""
    e = weighted_mean(excess_demand(batch, mult, utilisation=config.utilisation),
                      slot_weights(batch, config))
    return e / jnp.array([1.0, config.bw_scale_hz], jnp.float32)


def update(state: LearnerState, batch: SlotBatch, config: DualConfig
           ) -> tuple[Multipliers, LearnerState]:
    """One learning step on a batch of slots (leading dims averaged). Pure and jit-able.

    Online modes step on the mean long-run occupancy excess of the hard rule under the
    current multipliers (``problem.excess_demand``: unbiased for the long-run mean, since each
    admission counts with its own service time and no ratio is taken per batch); the
    differentiable mode takes one optax step on the relaxed dual objective
    at the current annealed temperature. Returns the new multipliers (natural units; for the
    conditioned variant the load-free base values) and the new state.
    """
    if isinstance(state, AdamState):
        temp = temperature(state.step, config)
        grads = jax.grad(dual_objective)(state.params, batch, config, temp)
        updates, opt_state = _optimizer(config).update(grads, state.opt_state, state.params)
        state = AdamState(params=optax.apply_updates(state.params, updates),
                          opt_state=opt_state, step=state.step + 1)
        return multipliers(state, config), state

    e = _mean_excess(batch, multipliers(state, config), config)
    de = jnp.where(state.step > 0, e - state.prev_error, 0.0)
    if isinstance(state, PidState):
        integral = jnp.maximum(state.integral + config.ki * e, 0.0)
        m = jnp.maximum(config.kp * e + integral + config.kd * de, 0.0)
    else:
        eta = config.step_size
        if config.decay_steps > 0:
            eta = eta / jnp.sqrt(1.0 + state.step.astype(jnp.float32) / config.decay_steps)
        m = jnp.maximum(state.m + eta * e + config.kd * de, 0.0)
    step = state.step + 1
    avg_sum, avg_count = state.avg_sum, state.avg_count
    if averaging(config):  # Polyak–Ruppert: iterates after update average_start + 1, ...
        inside = step > average_start(config)
        avg_sum = jnp.where(inside, avg_sum + m, avg_sum)
        avg_count = jnp.where(inside, avg_count + 1.0, avg_count)
    state = state._replace(m=m, prev_error=e, step=step, avg_sum=avg_sum, avg_count=avg_count)
    if isinstance(state, PidState):
        state = state._replace(integral=integral)
    return multipliers(state, config), state


def metrics(state: LearnerState, batch: SlotBatch, config: DualConfig) -> dict[str, jax.Array]:
    """Scalars to log for a batch of slots under the current multipliers.

    dual/lambda_s, dual/mu (per Hz), dual/mu_per_mhz, dual/temperature,
    dual/excess_units and dual/excess_bw_hz (mean long-run occupancy excess before repair, can
    be < 0: busy unit-slots the admissions ask for − ρ·M per slot, Hz·slots − B;
    ``problem.excess_demand``), dual/overflow_units and dual/overflow_bw_hz (mean positive part
    per slot), dual/occupancy_per_slot (busy unit-slots asked per slot, Σ admit_i·k_i),
    dual/admissions_per_slot, dual/capacity_per_slot (ρ·M/k̄_u: admissions per slot the
    constraint allows), dual/mean_service_slots (k̄_u, the admissions' mean service time,
    ``problem.service_time``), dual/learning_slots (share of slots that count),
    dual/relaxed_objective and dual/hard_objective (the dual function with the smooth and the
    hard max), dual/relaxed_minus_hard (their gap, ≥ 0), and dual/export_lambda_s,
    dual/export_mu_per_mhz (the pair :func:`export_multipliers` gives).
    """
    load = batch.load if config.conditioned else None
    mult = multipliers(state, config, load)
    e = excess_demand(batch, mult, utilisation=config.utilisation)
    wts = slot_weights(batch, config)
    temp = temperature(state.step, config)
    relaxed = state_objective(state, batch, config, temp)
    hard = state_objective(state, batch, config, None)
    kbar = service_time(batch, mult, wts)[0]
    adm = admitted(batch, mult)
    cap = weighted_mean(config.utilisation * batch.capacity_units / kbar, wts)
    exp = export_multipliers(state, config, load)
    return {
        "dual/export_lambda_s": jnp.mean(exp.lambda_s),
        "dual/export_mu_per_mhz": jnp.mean(exp.mu) * 1e6,
        "dual/lambda_s": jnp.mean(mult.lambda_s),
        "dual/mu": jnp.mean(mult.mu),
        "dual/mu_per_mhz": jnp.mean(mult.mu) * 1e6,
        "dual/temperature": temp,
        "dual/excess_units": weighted_mean(e[..., 0], wts),
        "dual/excess_bw_hz": weighted_mean(e[..., 1], wts),
        "dual/overflow_units": weighted_mean(jnp.maximum(e[..., 0], 0.0), wts),
        "dual/overflow_bw_hz": weighted_mean(jnp.maximum(e[..., 1], 0.0), wts),
        "dual/occupancy_per_slot": weighted_mean((adm * batch.work).sum(-1), wts),
        "dual/admissions_per_slot": weighted_mean(adm.sum(-1), wts),
        "dual/capacity_per_slot": cap,
        "dual/mean_service_slots": kbar,
        "dual/learning_slots": jnp.mean(wts),
        "dual/relaxed_objective": relaxed,
        "dual/hard_objective": hard,
        "dual/relaxed_minus_hard": relaxed - hard,
    }
