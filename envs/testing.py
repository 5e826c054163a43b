"""Scanned, batched rollouts of the edge env for tests and benchmarks (one compile per shape).

``rollout(keys, params, screens, gains)`` runs ``S`` independent envs (one per key) for ``T``
slots with the given screening actions and gains, and returns every slot's outputs together with
the noise it drew, so a reference implementation can replay exactly the same randomness.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from envs import edge

#: Incremented each time ``rollout`` is traced (tests check that new params do not retrace).
TRACE_COUNT = [0]


def _one(key, params, screens, gains):
    TRACE_COUNT[0] += 1
    k0, key = jax.random.split(key)
    obs0, state = edge.reset(k0, params)
    noises = jax.vmap(edge.draw_noise, in_axes=(0, None))(
        jax.random.split(key, screens.shape[0]), params)

    def body(state, xs):
        noise, screen, gain = xs
        obs, state, r, d, info = edge.step_with_noise(state, edge.EdgeAction(screen, gain),
                                                      params, noise)
        return state, (obs, r, d, info)

    final, outs = jax.lax.scan(body, state, (noises, screens, gains))
    return obs0, edge.draw_noise(k0, params), noises, final, outs


#: keys [S], params (shared), screens [S, T, U] int32, gains [S, T, U] float32 ->
#: (obs0 [S,U,D], noise0, noises [S,T,...], final state [S,...], (obs, reward, done, info) [S,T,...])
rollout = jax.jit(jax.vmap(_one, in_axes=(0, None, 0, 0)))


#: Columns of ``llm_alone_window_sums``.
LLM_ALONE_SUMS = ("finished", "latency_s", "in_flight", "offered_job_s", "blocked",
                  "server_in_use")


def llm_alone_window_sums(traces, pair: str, num_servers: int, rate_hz: float, num_users: int,
                          slots: int, warm: int, seeds: int, seed: int = 0):
    """The server LLM alone (one resident sequence per user, serving server) started empty and
    run ``slots`` slots at ``rate_hz`` arrivals, ``seeds`` runs vmapped: [seeds, 6] sums over
    slots ≥ ``warm`` of ``LLM_ALONE_SUMS`` (users finished, their latencies [s], users in the
    system, offered load [s], blocked arrivals, held sequences). Tests and
    ``benchmarks.serving_capacity`` measure throughput, Little's law and ρ from it."""
    params = edge.make_params(traces, num_users=num_users, hardware=pair,
                              num_servers=num_servers, scheduler="offload_all", llm_only=True,
                              server_kv_cache=True, max_wait_slots=10 ** 6,
                              arrival_rate_hz=rate_hz, initial_users=0)

    def one(key):
        _, s = edge.reset(key, params)

        def body(s, t):
            _, s, _, d, info = edge.step(jax.random.fold_in(key, t), s,
                                         jnp.ones(num_users, jnp.int32), params)
            w = (t >= warm).astype(jnp.float32)
            return s, w * jnp.stack([jnp.sum(d.astype(jnp.float32)),
                                     jnp.sum(jnp.where(d, info["user_latency_s"], 0.0)),
                                     info["in_flight"].astype(jnp.float32),
                                     info["offered_job_s"], info["blocked"].astype(jnp.float32),
                                     info["server_in_use"].astype(jnp.float32)])
        _, ys = jax.lax.scan(body, s, jnp.arange(slots))
        return ys.sum(0)
    keys = jax.random.split(jax.random.key(seed), seeds)
    return jax.device_get(jax.jit(jax.vmap(one))(keys))
