"""The one place a screening network's output becomes a nomination and its gain.

A screening network maps observations to ``(logits [..., 2], q [..., 2])`` (action 1 =
nominate the draft for server recompute). :func:`screen_and_gain` is the action every runner
of a trained policy uses (evaluation rollouts, the edge-env evaluator, the stage-2 policy
wrapper, ``policy.make_act_fn``): by the actor, the argmax of the logits (greedy) or a
categorical sample; by the critic, nominate iff ΔQ > θ (θ = 0 unless a caller sweeps it:
PRADA's knob, ``evals.knobs``; the actor's logit margin > θ is the other knob, θ = 0 greedy). Either way the gain the threshold scheduler ranks by is the
critic's ΔQ = Q(s, 1) − Q(s, 0) [PRM units].
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from prada_jax.errors import BadInput

__all__ = ["NOMINATE_BY", "check_nominate_by", "critic_screen", "greedy_screen",
           "margin_screen", "screen_and_gain", "screen_scores"]

#: Who decides a nomination: the actor's logits, or the critic's ΔQ > 0 (greedy with respect
#: to the policy's own critic, so a nomination always carries a positive value).
NOMINATE_BY = ("actor", "critic")


def check_nominate_by(nominate_by: str, field: str = "config.policy.nominate_by") -> str:
    """``nominate_by`` if it is in :data:`NOMINATE_BY`, else ``BadInput`` naming ``field``."""
    if nominate_by not in NOMINATE_BY:
        raise BadInput(f"{field} must be one of {NOMINATE_BY}, got {nominate_by!r}")
    return nominate_by


def greedy_screen(logits: jax.Array) -> jax.Array:
    """int32 [...]: 1 where the nominate logit is the larger (ties → keep local, index 0)."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def critic_screen(gain: jax.Array, theta=0.0) -> jax.Array:
    """int32 [...]: 1 where the critic's ΔQ ``gain`` is > ``theta`` [PRM units] (default 0:
    greedy in the critic; a larger θ nominates a subset of the same states: PRADA's knob)."""
    return (gain > theta).astype(jnp.int32)


def margin_screen(logits: jax.Array, theta=0.0) -> jax.Array:
    """int32 [...]: 1 where the actor's logit margin ``logits[..., 1] − logits[..., 0]`` (the
    log-odds of nominating) is > ``theta``. At θ = 0 it is :func:`greedy_screen` (ties keep);
    a larger θ nominates a subset of the same states."""
    return ((logits[..., 1] - logits[..., 0]) > theta).astype(jnp.int32)


def screen_scores(apply_fn, params, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(logits [..., 2], gain float32 [...])``: the actor's logits and the critic's
    ΔQ = Q(s, 1) − Q(s, 0) of ``apply_fn(params, obs [..., D])``."""
    logits, q = apply_fn(params, obs)
    return logits, (q[..., 1] - q[..., 0]).astype(jnp.float32)


def screen_and_gain(apply_fn, params, obs: jax.Array, key: jax.Array | None = None,
                    greedy: bool = True, nominate_by: str = "actor"
                    ) -> tuple[jax.Array, jax.Array]:
    """``(screen int32 [...], gain float32 [...])`` of ``apply_fn(params, obs [..., D])``.

    ``nominate_by="actor"``: argmax of the logits (``greedy``) or a sample from them with
    ``key``; ``"critic"``: :func:`critic_screen` of the gain (``greedy`` unused).
    """
    logits, gain = screen_scores(apply_fn, params, obs)
    if nominate_by == "critic":
        screen = critic_screen(gain)
    elif greedy:
        screen = greedy_screen(logits)
    else:
        screen = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    return screen, gain
