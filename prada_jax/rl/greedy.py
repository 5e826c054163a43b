"""The one place a screening network's output becomes a nomination and its gain.

A screening network maps observations to ``(logits [..., 2], q [..., 2])`` (action 1 =
nominate the draft for server recompute). ``screen_and_gain`` is the action every runner of a
trained policy uses (evaluation rollouts, the edge-env evaluator, the stage-2 policy wrapper,
``policy.make_act_fn``): the argmax of the logits (greedy) or a categorical sample, and the
critic's ΔQ = Q(s, 1) − Q(s, 0) [PRM units] as the gain the threshold scheduler ranks by.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["screen_and_gain", "greedy_screen"]


def greedy_screen(logits: jax.Array) -> jax.Array:
    """int32 [...]: 1 where the nominate logit is the larger (ties → keep local, index 0)."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def screen_and_gain(apply_fn, params, obs: jax.Array, key: jax.Array | None = None,
                    greedy: bool = True) -> tuple[jax.Array, jax.Array]:
    """``(screen int32 [...], gain float32 [...])`` of ``apply_fn(params, obs [..., D])``.

    ``greedy``: argmax of the logits; else a sample from them with ``key``.
    """
    logits, q = apply_fn(params, obs)
    if greedy:
        screen = greedy_screen(logits)
    else:
        screen = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    return screen, (q[..., 1] - q[..., 0]).astype(jnp.float32)
