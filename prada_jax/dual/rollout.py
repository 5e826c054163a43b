"""Runs E edge envs for T slots under ``lax.scan`` with the threshold rule at given or learned prices.

The env is an argument (:class:`Stage2Env`, its pure functions; the edge env's is
``envs.stage2.EDGE``), as PureJaxRL's ``make_train`` receives ``env, env_params``. One
rollout serves learning and evaluation: ``make_rollout(env, policy_fn, T, mult_fn, learn_fn)``
prices every slot with ``mult_fn(prices, batch)``, where ``prices`` is whatever the carry holds
(a learner state, ``prada_jax.dual.learner``, or a fixed pair, :func:`fixed_prices`), and,
with ``learn_fn``, updates ``prices`` after every slot on the E envs' slots (the online
learner modes).

Measurement (the rule of ``evals``, ``prada_jax.dual.measure``): every rollout starts from an
empty system (``initial_users = 0`` whatever the params say), and each slot reports who
resolved in it — users finished within the timeout (``ok_*``), users unfinished ``timeout_slots``
after their arrival (``timed_out``) and blocked arrivals — so that every arrival is counted
once, failures at the timeout. Before issue 41 rollouts started with U users and reported only
finished users.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from prada_jax.dual.measure import DEFAULT_TIMEOUT_SLOTS, resolve
from prada_jax.dual.problem import Multipliers, SlotBatch

#: Bandwidth unit (Hz) in which a fixed pair holds µ: the learner's default ``bw_scale_hz``,
#: so a run's stored pair replays with the arithmetic of the rollouts that learned it.
FIXED_BW_SCALE_HZ = 1e6

# Jitted functions reused by later calls in the same process with the same static settings
# (tests, resumption, train.main's stages): a new closure would trace and compile again.
_JIT_CACHE: dict = {}


def cached(key, build: Callable[[], Any]):
    """``build()`` the first time ``key`` (hashable) is seen in this process, then the same
    object (a compiled function keeps its compilation)."""
    if key not in _JIT_CACHE:
        _JIT_CACHE[key] = build()
    return _JIT_CACHE[key]


class Stage2Env(NamedTuple):
    """The pure functions of the env a stage-2 rollout runs (the edge env's: ``envs.stage2.EDGE``).

    reset: ``(key, params) -> (obs [U, D], state)``; the params carry the env's scheduler
      inputs (``initial_users``, ``tau_s``, ``beta``, ``lambda_s``, ``mu``, ``scheduler``).
    draw_noise: ``(key, params) -> noise`` of one slot.
    step_with_noise: ``(state, action, params, noise) -> (obs, state, reward [U], done [U],
      info)``, ``info`` with the per-slot metrics :func:`make_rollout` reports.
    slot: ``(state, action, params, noise) -> (cs, batch)``: the slot's candidate set as the
      scheduler sees it (``cs.x`` SchedInputs [U]) and the learner's ``SlotBatch`` [U] of it.
    sched_params: ``params -> SchedParams`` (``prada_jax.sched``).
    load_features: K, the length of ``SlotBatch.load`` (the conditioned learner's input).
    """

    reset: Callable
    draw_noise: Callable
    step_with_noise: Callable
    slot: Callable
    sched_params: Callable
    load_features: int


class RolloutCarry(NamedTuple):
    """Scan carry of the env rollout: env_state [E, ...], obs [E, U, D], prices (what
    ``mult_fn`` reads: a learner state or a fixed pair), key (typed), slots (int32, slots
    simulated per env so far)."""

    env_state: Any
    obs: jax.Array
    prices: Any
    key: jax.Array
    slots: jax.Array


def fixed_prices(mult: Multipliers) -> jax.Array:
    """The carry's ``prices`` for a fixed pair: [2] float32 (λ_s, µ per MHz)."""
    return jnp.array([mult.lambda_s, mult.mu * FIXED_BW_SCALE_HZ], jnp.float32)


def fixed_mult_fn(prices: jax.Array, batch: SlotBatch) -> Multipliers:
    """``mult_fn`` of a fixed pair (:func:`fixed_prices`): the same λ_s, µ in every slot."""
    del batch
    return Multipliers(lambda_s=prices[..., 0], mu=prices[..., 1] / FIXED_BW_SCALE_HZ)


def init_rollout(env: Stage2Env, key, env_params, num_envs: int,
                 init_prices: Callable[[jax.Array], Any]) -> RolloutCarry:
    """Resets ``num_envs`` envs, empty (``initial_users = 0``, as ``evals`` starts every
    run); ``prices = init_prices(k)`` with its own key ``k``."""
    k_prices, k_reset, k_next = jax.random.split(key, 3)
    env_params = env_params.replace(initial_users=jnp.zeros_like(env_params.initial_users))
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(k_reset, num_envs), env_params)
    return RolloutCarry(env_state=env_state, obs=obs, prices=init_prices(k_prices),
                        key=k_next, slots=jnp.zeros((), jnp.int32))


def make_rollout(env: Stage2Env, policy_fn, rollout_len: int, mult_fn: Callable = fixed_mult_fn,
                 learn_fn: Callable | None = None,
                 timeout_slots: int = DEFAULT_TIMEOUT_SLOTS):
    """``rollout(carry, env_params) -> (carry, out)``: ``rollout_len`` slots of E envs.

    Every env runs its scheduler (``env_params.scheduler``, the threshold rule for stage 2)
    with ``mult_fn(carry.prices, batch)`` (``batch``: the env's SlotBatch [U] of the slot, so
    a conditioned map prices each env and slot from its load features). With ``learn_fn``,
    ``carry.prices = learn_fn(carry.prices, batch [E, U])`` after every slot.

    ``out``: ``batch`` SlotBatch [T, E, U], ``x`` SchedInputs [T, E, U], ``lambda_s``/``mu``
    [T, E] used, ``reward`` [T, E] (sum over users), and per-slot env metrics [T, E]
    (``server_in_use``, ``bandwidth_in_use_hz``, ``queue_len``, ``finished``, ``correct``,
    ``latency_s`` (sum over finished users, whatever their latency), ``blocked``), and the
    env's own ``decision`` / ``outage`` [T, E, U] (after its enforcement).

    Every arrival counted (``prada_jax.dual.measure.resolve``, timeout D = ``timeout_slots``):
    ``arrivals`` [T, E] (blocked included), ``ok`` / ``ok_correct`` / ``ok_latency_s`` [T, E]
    (users finished within D slots of their arrival: count, correct answers, latency sum),
    ``timed_out`` [T, E] (users still unfinished D slots after their arrival), and per user
    [T, E, U] ``user_ok``, ``user_correct``, ``user_latency_s`` and ``user_arrival_slot``
    (the arrival slot before the step: an arrival counted in slot s has s + 1) for a cohort
    measurement (``prada_jax.dual.gap.rollout_stats``).
    """
    if int(timeout_slots) < 1:
        raise ValueError(f"timeout_slots must be >= 1, got {timeout_slots}")
    timeout_slots = int(timeout_slots)

    def _one_env(key, env_state, obs, prices, env_params):
        k_noise, k_pol = jax.random.split(key)
        noise = env.draw_noise(k_noise, env_params)
        action = policy_fn(k_pol, obs, env_state, env_params)
        cs, batch = env.slot(env_state, action, env_params, noise)
        mult = mult_fn(prices, batch)
        p = env_params.replace(lambda_s=mult.lambda_s, mu=mult.mu)
        t, active, arrival_slot = env_state.t, env_state.active, env_state.arrival_slot
        obs, env_state, reward, done, info = env.step_with_noise(env_state, action, p, noise)
        ok, timed_out = resolve(t, active, arrival_slot, done, info["user_latency_s"],
                                env_params.tau_s, timeout_slots)
        n = lambda m: jnp.sum(m.astype(jnp.int32))  # noqa: E731
        stats = dict(reward=jnp.sum(reward), server_in_use=info["server_in_use"],
                     bandwidth_in_use_hz=info["bandwidth_in_use_hz"],
                     queue_len=info["queue_len"], blocked=info["blocked"],
                     finished=jnp.sum(done.astype(jnp.int32)),
                     correct=jnp.sum(info["user_correct"].astype(jnp.int32)),
                     latency_s=jnp.sum(info["user_latency_s"]),
                     decision=info["decision"], outage=info["outage"],
                     lambda_s=mult.lambda_s, mu=mult.mu,
                     arrivals=info["arrivals"], ok=n(ok),
                     ok_correct=n(ok & info["user_correct"]),
                     ok_latency_s=jnp.sum(jnp.where(ok, info["user_latency_s"], 0.0)),
                     timed_out=n(timed_out), user_ok=ok, user_correct=info["user_correct"],
                     user_latency_s=info["user_latency_s"], user_arrival_slot=arrival_slot)
        return env_state, obs, batch, cs.x, stats

    def _slot(carry: RolloutCarry, env_params):
        key, k_slot = jax.random.split(carry.key)
        keys = jax.random.split(k_slot, carry.obs.shape[0])
        env_state, obs, batch, x, stats = jax.vmap(_one_env, in_axes=(0, 0, 0, None, None))(
            keys, carry.env_state, carry.obs, carry.prices, env_params)
        prices = carry.prices if learn_fn is None else learn_fn(carry.prices, batch)
        carry = RolloutCarry(env_state=env_state, obs=obs, prices=prices, key=key,
                             slots=carry.slots + 1)
        return carry, dict(batch=batch, x=x, **stats)

    def rollout(carry: RolloutCarry, env_params):
        return jax.lax.scan(lambda c, _: _slot(c, env_params), carry, None,
                            length=rollout_len)

    return rollout
