"""Scanned, batched rollouts of the edge env for tests and benchmarks (one compile per shape).

``rollout(keys, params, screens, gains)`` runs ``S`` independent envs (one per key) for ``T``
slots with the given screening actions and gains, and returns every slot's outputs together with
the noise it drew, so a reference implementation can replay exactly the same randomness.
"""
from __future__ import annotations

import jax

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
