"""Learns the admission prices λ_s (server) and µ (bandwidth) of the stage-2 threshold rule.

Shaped like an optax transformation: ``init(config) -> DualState``,
``update(state, batch, config) -> (multipliers, state)`` and ``metrics(state, batch, config)``,
all pure and jit-able (``config`` is a frozen, hashable :class:`DualConfig`: close over it or
pass it as a static argument). The rule itself lives in ``prada_jax.sched.threshold``; this
module only prices it. Rollouts that collect the slots live in ``prada_jax.dual_rollout``.

What is priced (DESIGN §6): the *long-run* constraints. Admitted server occupancy per slot,
averaged over the rollout, ≤ M, and admitted bandwidth occupancy ≤ B. A candidate ``i`` of slot
``t`` has run-now value ``w_i``, queue value ``w̄_i`` (PRM units), bandwidth ``b_i`` (Hz) and
service time ``k_i`` (slots it holds a unit and its bandwidth). The threshold rule charges the
price ``p_i = λ_s + µ·b_i`` to every admission (queue or run now), so the Lagrangian value of a
candidate is ``max(0, w̄_i − p_i, w_i − p_i)``. Each admission occupies ``k_i`` unit-slots; over
T slots the occupancy constraint ``Σ_t Σ_i admit_i·k_i ≤ T·M`` is, with the batch's mean
service time ``k̄`` of the new nominations, the admission-rate constraint
``mean_t Σ_i admit_i ≤ M / k̄`` (Little's law: M units each serving one job per k̄ slots); the
bandwidth one likewise ``mean_t Σ_i admit_i·b_i ≤ B / k̄``. The dual function

    D(λ_s, µ) = mean_t [ Σ_{i new} max(0, w̄_i − p_i, w_i − p_i)
                         + λ_s·M_t / k̄ + µ·B_t / k̄ ]

is convex and piecewise linear; its subgradient is minus the *long-run excess*
``(mean admissions − M/k̄, mean admitted bandwidth − B/k̄)`` (:func:`excess_demand`), so λ_s
rises exactly when admissions outrun capacity over time and falls to 0 when the system keeps
up. Only new nominations count (``SlotBatch.fresh``): a queued request was admitted once, in
the slot it was nominated; counting it again every slot it waits would charge it twice.
``k̄`` is treated as a constant (no gradient). With ``k = 1``, ``fresh = valid`` and the
capacity equal to the slot's free units this is the per-slot admission dual.

Two ways to learn the multipliers (``DualConfig.mode``):

* ``"subgradient"`` / ``"pid"`` (online): projected steps on the observed long-run excess of
  the hard rule (before repair). ``subgradient``: ``m ← [m + η_t·e + k_d·(e − e_prev)]₊`` with
  ``η_t = step_size / sqrt(1 + t/decay_steps)``; ``pid`` (Stooke et al. 2020):
  ``I ← [I + k_i·e]₊``, ``m = [k_p·e + I + k_d·(e − e_prev)]₊``. The rollout runs with the
  current iterate, but the constant pair the run exports (:func:`export_multipliers`) is the
  Polyak–Ruppert average of the iterates over the last ``average_tail`` share of the run's
  ``average_horizon`` updates: dual subgradient theory guarantees convergence of the averaged
  iterates, not of the last one, which keeps cycling when the load cycles (a burst scenario).
* ``"differentiable"``: the max inside D is the smooth max ``T·logsumexp(·/T)`` (the
  temperature-smoothed rule, ``sched.threshold.soft_choice``), the relaxed D_T is minimised
  with optax Adam over batches of slots, T annealed geometrically from ``temperature`` to
  ``temperature_min``, multipliers softplus-parameterised (never negative). Evaluation uses the
  hard rule.

Load-conditioned (``conditioned=True``; differentiable mode only): the multipliers are
``softplus(raw + MLP(load))`` with ``load`` [K] per-slot features the server observes
(``prada_jax.dual_rollout.load_features``); the MLP's output layer starts at zero, so training
starts from the scalar multipliers and is driven by the same dual objective.

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

from prada_jax.sched.base import IMMEDIATE, LOCAL, QUEUE  # noqa: F401  (re-exported)
from prada_jax.sched.threshold import choice_values as _choice_values
from prada_jax.sched.threshold import hard_choice, soft_choice

MODES = ("subgradient", "pid", "differentiable")


@dataclasses.dataclass(frozen=True)
class DualConfig:
    """Static settings of the multiplier learner (hashable; build with :func:`config_from`).

    Attributes:
      mode: "subgradient", "pid" or "differentiable".
      init_lambda_s: initial λ_s (reward units per admission), ≥ 0.
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
      skip_full_slots: slots without a free server unit get weight 0 in learning (off by
        default: the long-run constraints count every slot).
      queue_price: ignored, kept so older configs load: the price is always charged to
        queueing too (the admission-price rule is the rule).
      average_tail: online modes: the exported constant (:func:`export_multipliers`) is the
        mean of the multiplier iterates after the updates numbered
        ``floor((1 − average_tail)·average_horizon) + 1 … `` (Polyak–Ruppert averaging;
        0.5 = the second half of the run), in [0, 1]; 0 = the last iterate (the old
        behaviour). Ignored by the differentiable mode (its annealed Adam steps converge on
        their own; its export is the last iterate).
      average_horizon: number of updates the run will make (online modes: one per slot, set
        by ``prada_jax.dual_train.validate_config`` from ``train.*``); ≥ 0. 0 with
        ``average_tail > 0`` averages every iterate from the first update.
      utilisation: ρ in (0, 1], the share of the server capacity the long-run occupancy
        constraint allows: admissions per slot ≤ ρ·M_t / k̄ (bandwidth keeps B_t / k̄).
        1.0 (default) is the plain capacity constraint. ρ < 1 makes the price see the
        congestion cost the capacity constraint misses (docs/dual.md, "Utilisation target"):
        at ρ → 1 the queue, and the wait of every admitted request, grows without bound while
        the capacity constraint is still met. The queueing argument for a value: treat each
        server unit as an M/M/1 queue with mean service time k̄ slots; its mean wait in queue
        is W_q = k̄·ρ/(1 − ρ). Asking that an admitted request wait on average no longer than
        it is served, W_q ≤ θ·k̄ with θ = 1, gives ρ = θ/(1 + θ) = 0.5 (``dual_wait``
        variant). With M > 1 units pooled (M/M/c) the wait at the same ρ is shorter, so this
        is conservative; exponential service is an assumption (LLM job lengths vary).
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
    queue_price: bool = True
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


@struct.dataclass
class SlotBatch:
    """Candidate sets of S slots (any leading shape ``[...]`` works; N candidates per slot).

    w, w_bar: [..., N] float32, value of run now / queue over local before the price (PRM).
    b: [..., N] float32, bandwidth each candidate needs while it runs (Hz).
    valid: [..., N] bool, live candidates (new or queued, not expired): the slot problem.
    free_units: [...] float32, server units free this slot (the per-slot oracle's limit).
    free_bw: [...] float32, bandwidth free this slot (Hz).
    load: [..., K] float32, load features for the conditioned variant (zeros otherwise).
    work: [..., N] float32, service time k_i of each candidate (slots, ≥ 1).
    fresh: [..., N] bool, new nominations (the admissions the long-run constraints count).
    capacity_units: [...] float32, server units of the system this slot (M_t).
    capacity_bw: [...] float32, bandwidth of the system this slot (B_t, Hz).
    """

    w: jax.Array
    w_bar: jax.Array
    b: jax.Array
    valid: jax.Array
    free_units: jax.Array
    free_bw: jax.Array
    load: jax.Array
    work: jax.Array
    fresh: jax.Array
    capacity_units: jax.Array
    capacity_bw: jax.Array


def make_batch(w, w_bar, b, valid, free_units, free_bw, load=None, load_features: int = 3,
               work=None, fresh=None, capacity_units=None, capacity_bw=None) -> SlotBatch:
    """SlotBatch from arrays (casts dtypes). Defaults: ``load`` zeros [..., load_features],
    ``work`` 1, ``fresh`` = ``valid``, capacities = the free units / bandwidth (with these
    defaults the long-run dual is the per-slot admission dual)."""
    w = jnp.asarray(w, jnp.float32)
    valid = jnp.asarray(valid, bool)
    free_units = jnp.asarray(free_units, jnp.float32)
    free_bw = jnp.asarray(free_bw, jnp.float32)
    if load is None:
        load = jnp.zeros(w.shape[:-1] + (load_features,), jnp.float32)
    return SlotBatch(
        w=w, w_bar=jnp.asarray(w_bar, jnp.float32), b=jnp.asarray(b, jnp.float32), valid=valid,
        free_units=free_units, free_bw=free_bw, load=jnp.asarray(load, jnp.float32),
        work=jnp.ones_like(w) if work is None else jnp.asarray(work, jnp.float32),
        fresh=valid if fresh is None else jnp.asarray(fresh, bool) & valid,
        capacity_units=free_units if capacity_units is None else jnp.asarray(
            capacity_units, jnp.float32),
        capacity_bw=free_bw if capacity_bw is None else jnp.asarray(capacity_bw, jnp.float32))


class Multipliers(NamedTuple):
    """λ_s (reward per admission) and µ (reward per Hz); scalars or [...] per slot."""

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
    prev_error: [2] last excess (admissions, bw/bw_scale) for the derivative/damping term.
    step: [] int32 number of updates done.
    avg_sum: [2] sum of the iterates (λ_s, µ_scaled) inside the averaging window (online modes
      with ``average_tail > 0``), else zeros.
    avg_count: [] float32 number of iterates in ``avg_sum``.
    """

    params: Any
    opt_state: Any
    integral: jax.Array
    prev_error: jax.Array
    step: jax.Array
    avg_sum: jax.Array = None
    avg_count: jax.Array = None


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
                     step=jnp.zeros((), jnp.int32), avg_sum=z,
                     avg_count=jnp.zeros((), jnp.float32))


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
    """Current multipliers in natural units (λ_s per admission, µ per Hz).

    ``load`` [..., K] (conditioned variant only) gives per-slot multipliers [...].
    """
    m = _scaled_multipliers(state.params, config, load)
    return Multipliers(lambda_s=m[..., 0], mu=m[..., 1] / config.bw_scale_hz)


def averaging(config: DualConfig) -> bool:
    """True if the exported constant is an average of iterates (online modes, tail > 0)."""
    return config.mode != "differentiable" and config.average_tail > 0.0


def average_start(config: DualConfig) -> int:
    """Updates done before the averaging window opens: ``floor((1 − tail)·horizon)``; the
    iterates after updates ``average_start + 1, …`` are averaged."""
    return int((1.0 - config.average_tail) * config.average_horizon)


def export_multipliers(state: DualState, config: DualConfig, load=None) -> Multipliers:
    """The constant pair a run stores and evaluates (natural units, like :func:`multipliers`).

    Online modes with ``average_tail > 0``: the mean of the iterates in the averaging window
    (:func:`average_start`) once it holds at least one, else the current iterate. Otherwise
    (differentiable, conditioned at ``load``, tail 0): :func:`multipliers`.
    """
    if not averaging(config):
        return multipliers(state, config, load)
    cur = _scaled_multipliers(state.params, config)
    n = state.avg_count
    m = jnp.where(n > 0, state.avg_sum / jnp.maximum(n, 1.0), cur)
    return Multipliers(lambda_s=m[..., 0], mu=m[..., 1] / config.bw_scale_hz)


def temperature(step, config: DualConfig) -> jax.Array:
    """Annealed relaxation temperature after ``step`` updates (reward units)."""
    frac = jnp.minimum(jnp.asarray(step, jnp.float32) / config.anneal_steps, 1.0)
    t = config.temperature * (config.temperature_min / config.temperature) ** frac
    return jnp.maximum(t, config.temperature_min)


def _priced(w, w_bar, b, lambda_s, mu):
    """(g, c): priced run-now value ``w − λ_s − µ·b`` and wait cost ``w − w̄`` ([..., N])."""
    g = w - (jnp.asarray(lambda_s)[..., None] + jnp.asarray(mu)[..., None] * b)
    return g, w - w_bar


def choice_values(w, w_bar, b, lambda_s, mu, queue_price=None) -> jax.Array:
    """Per-candidate Lagrangian value of (local, queue, immediate): [..., N, 3] =
    ``(0, w̄ − p, w − p)``, ``p = λ_s + µ·b`` (``sched.threshold.choice_values``).
    w, w_bar, b: [..., N]; lambda_s, mu: scalars or [...] (µ in the unit of 1/b)."""
    del queue_price
    return _choice_values(*_priced(w, w_bar, b, lambda_s, mu))


def hard_decision(w, w_bar, b, lambda_s, mu, valid=None, queue_price=None) -> jax.Array:
    """The threshold rule before any feasibility repair (``sched.threshold.hard_choice``):
    [..., N] int8 in {0 local, 1 queue, 2 immediate}; invalid candidates are local."""
    del queue_price
    g, c = _priced(w, w_bar, b, lambda_s, mu)
    return hard_choice(g, c, valid)


def soft_decision(w, w_bar, b, lambda_s, mu, temp, valid=None, queue_price=None) -> jax.Array:
    """Smoothed threshold rule [..., N, 3] (``sched.threshold.soft_choice``); invalid
    candidates get probability 1 on local."""
    del queue_price
    g, c = _priced(w, w_bar, b, lambda_s, mu)
    return soft_choice(g, c, temp, valid)


def mean_work(batch: SlotBatch) -> jax.Array:
    """k̄: mean service time (slots) of the new nominations in the batch (1 if none), no
    gradient."""
    f = batch.fresh.astype(jnp.float32)
    k = jnp.sum(f * batch.work) / jnp.maximum(jnp.sum(f), 1.0)
    return jax.lax.stop_gradient(jnp.where(jnp.sum(f) > 0, jnp.maximum(k, 1.0), 1.0))


def _slot_dual(batch: SlotBatch, b_s, cap_bw_s, m, kbar, temp, utilisation=1.0):
    """Per-slot dual value [...]; hard max if ``temp`` is None, else smooth max at ``temp``.

    b_s, cap_bw_s in units of bw_scale_hz; m: [..., 2] or [2] (λ_s, µ_scaled);
    utilisation: ρ, the unit capacity counted is ρ·M_t.
    """
    g, c = _priced(batch.w, batch.w_bar, b_s, m[..., 0], m[..., 1])
    vals = _choice_values(g, c)
    if temp is None:
        best = vals.max(axis=-1)
    else:
        best = temp * jax.nn.logsumexp(vals / temp, axis=-1)
    inner = jnp.sum(jnp.where(batch.fresh, best, 0.0), axis=-1)
    return inner + (m[..., 0] * utilisation * batch.capacity_units + m[..., 1] * cap_bw_s) / kbar


def dual_objective(params, batch: SlotBatch, config: DualConfig, temp=None) -> jax.Array:
    """Mean over slots of the (relaxed if ``temp`` is given) long-run dual function. Scalar."""
    m = _scaled_multipliers(params, config, batch.load if config.conditioned else None)
    per_slot = _slot_dual(batch, batch.b / config.bw_scale_hz,
                          batch.capacity_bw / config.bw_scale_hz, m, mean_work(batch), temp,
                          config.utilisation)
    return _weighted_mean(per_slot, slot_weights(batch, config))


def slot_weights(batch: SlotBatch, config: DualConfig) -> jax.Array:
    """[...] weight of each slot in learning: 1, or (``skip_full_slots``) 0 for a slot with
    no free server unit."""
    if not config.skip_full_slots:
        return jnp.ones_like(batch.free_units)
    return (batch.free_units >= 1).astype(jnp.float32)


def _weighted_mean(v, weights):
    """Σ weights·v / max(Σ weights, 1) over all leading dims of v [..., (k)]."""
    wts = weights.reshape(-1)
    v = v.reshape((wts.shape[0],) + v.shape[weights.ndim:])
    wts = wts.reshape((-1,) + (1,) * (v.ndim - 1))
    return jnp.sum(wts * v, axis=0) / jnp.maximum(jnp.sum(wts), 1.0)


def excess_demand(batch: SlotBatch, mult: Multipliers, queue_price=None,
                  utilisation: float = 1.0) -> jax.Array:
    """Long-run excess of the hard rule before repair, per slot: [..., 2].

    [..., 0] = admissions of new nominations − ρ·M_t / k̄ (admissions per slot; ρ =
    ``utilisation``, ``DualConfig.utilisation``);
    [..., 1] = their bandwidth − B_t / k̄ (Hz). Its mean over slots is minus the subgradient
    of the dual function (module docstring).
    """
    del queue_price
    d = hard_decision(batch.w, batch.w_bar, batch.b, mult.lambda_s, mult.mu, batch.fresh)
    adm = (d != LOCAL).astype(jnp.float32)
    kbar = mean_work(batch)
    return jnp.stack([adm.sum(-1) - utilisation * batch.capacity_units / kbar,
                      (adm * batch.b).sum(-1) - batch.capacity_bw / kbar], axis=-1)


def update(state: DualState, batch: SlotBatch, config: DualConfig
           ) -> tuple[Multipliers, DualState]:
    """One learning step on a batch of slots (leading dims averaged). Pure and jit-able.

    Online modes step on the mean long-run excess of the hard rule under the current
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
    step = state.step + 1
    avg_sum, avg_count = state.avg_sum, state.avg_count
    if averaging(config):  # Polyak–Ruppert: iterates after update average_start + 1, ...
        inside = step > average_start(config)
        avg_sum = jnp.where(inside, avg_sum + m, avg_sum)
        avg_count = jnp.where(inside, avg_count + 1.0, avg_count)
    state = state._replace(params={"raw": m}, integral=integral, prev_error=e, step=step,
                           avg_sum=avg_sum, avg_count=avg_count)
    return multipliers(state, config), state


def _mean_excess(batch: SlotBatch, mult: Multipliers, config: DualConfig) -> jax.Array:
    """Mean long-run excess over slots, bandwidth in units of bw_scale_hz: [2]."""
    e = _weighted_mean(excess_demand(batch, mult, utilisation=config.utilisation),
                       slot_weights(batch, config))
    return e / jnp.array([1.0, config.bw_scale_hz], jnp.float32)


def metrics(state: DualState, batch: SlotBatch, config: DualConfig) -> dict[str, jax.Array]:
    """Scalars to log for a batch of slots under the current multipliers.

    dual/lambda_s, dual/mu (per Hz), dual/mu_per_mhz, dual/temperature,
    dual/excess_units and dual/excess_bw_hz (mean long-run excess before repair, can be < 0:
    admissions per slot − ρ·M/k̄, admitted Hz − B/k̄), dual/overflow_units and
    dual/overflow_bw_hz (mean positive part per slot), dual/admissions_per_slot,
    dual/capacity_per_slot (ρ·M/k̄), dual/mean_service_slots (k̄), dual/learning_slots (share of
    slots that count), dual/relaxed_objective and dual/hard_objective (the dual function with
    the smooth and the hard max), dual/relaxed_minus_hard (their gap, ≥ 0), and
    dual/export_lambda_s, dual/export_mu_per_mhz (the pair :func:`export_multipliers` gives:
    the averaged iterate in the online modes with ``average_tail > 0``).
    """
    load = batch.load if config.conditioned else None
    mult = multipliers(state, config, load)
    e = excess_demand(batch, mult, utilisation=config.utilisation)
    wts = slot_weights(batch, config)
    temp = temperature(state.step, config)
    relaxed = dual_objective(state.params, batch, config, temp)
    hard = dual_objective(state.params, batch, config, None)
    kbar = mean_work(batch)
    cap = _weighted_mean(config.utilisation * batch.capacity_units / kbar, wts)
    exp = export_multipliers(state, config, load)
    return {
        "dual/export_lambda_s": jnp.mean(exp.lambda_s),
        "dual/export_mu_per_mhz": jnp.mean(exp.mu) * 1e6,
        "dual/lambda_s": jnp.mean(mult.lambda_s),
        "dual/mu": jnp.mean(mult.mu),
        "dual/mu_per_mhz": jnp.mean(mult.mu) * 1e6,
        "dual/temperature": temp,
        "dual/excess_units": _weighted_mean(e[..., 0], wts),
        "dual/excess_bw_hz": _weighted_mean(e[..., 1], wts),
        "dual/overflow_units": _weighted_mean(jnp.maximum(e[..., 0], 0.0), wts),
        "dual/overflow_bw_hz": _weighted_mean(jnp.maximum(e[..., 1], 0.0), wts),
        "dual/admissions_per_slot": _weighted_mean(e[..., 0], wts) + cap,
        "dual/capacity_per_slot": cap,
        "dual/mean_service_slots": kbar,
        "dual/learning_slots": jnp.mean(wts),
        "dual/relaxed_objective": relaxed,
        "dual/hard_objective": hard,
        "dual/relaxed_minus_hard": relaxed - hard,
    }


class DualAscent(NamedTuple):
    """optax-style triple bound to one config: ``init(key=None)``, ``update(state, batch)``,
    ``metrics(state, batch)``."""

    init: Any
    update: Any
    metrics: Any = None


def make(config: DualConfig) -> DualAscent:
    """Binds ``config``: ``d = make(cfg); s = d.init(); m, s = d.update(s, batch)``."""
    return DualAscent(init=lambda key=None: init(config, key),
                      update=lambda state, batch: update(state, batch, config),
                      metrics=lambda state, batch: metrics(state, batch, config))


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


# Rollout names that lived here before ``prada_jax.dual_rollout`` (kept for older callers).
_MOVED = ("LOAD_FEATURES", "slot_from_sched", "edge_slot_inputs", "make_trace_rule_policy",
          "make_ppo_policy", "RolloutCarry", "init_rollout", "make_rollout", "make_train_chunk")


def __getattr__(name):
    if name in _MOVED:
        from prada_jax import dual_rollout
        return getattr(dual_rollout, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
