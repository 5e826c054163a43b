"""Flax NNX actor-critic for the screening policy: an MLP torso, a policy head and a Q head.

The critic outputs ``Q(s, a)`` for both screening actions (0 = keep the draft, 1 = nominate
for the server). The state value used by GAE is ``V(s) = Σ_a π(a|s) Q(s, a)``, and the scalar a
nomination carries to the server (DESIGN §4, §6) is the critic's advantage
``ΔQ(s) = Q(s, 1) − Q(s, 0)`` (in reward units, i.e. PRM units for the coarse reward).
The Q head is trained on the action taken, with the GAE λ-return as target — the λ-return
estimates ``Q(s_t, a_t)``, so no extra data is needed.

One network is shared by all users: it acts on ``[..., obs_dim]`` observations.
The learner carries ``nnx.split`` state (plain pytrees) and merges inside pure functions.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["ActorCritic", "init_network", "make_apply_fn", "make_advantage_fn",
           "value_from_q", "count_params"]

NUM_ACTIONS = 2


class ActorCritic(nnx.Module):
    """MLP actor-critic.

    Args:
      obs_dim: observation features per user (D).
      hidden: widths of the shared tanh torso, e.g. (64, 64).
      rngs: NNX rngs for initialisation.
      separate_critic: give the critic its own torso (no shared features).
    """

    def __init__(self, obs_dim: int, hidden: Sequence[int], *, rngs: nnx.Rngs,
                 separate_critic: bool = True):
        def _torso(prefix_dims):
            layers = []
            for d_in, d_out in zip(prefix_dims[:-1], prefix_dims[1:]):
                layers.append(nnx.Linear(d_in, d_out, kernel_init=nnx.initializers.orthogonal(
                    jnp.sqrt(2.0)), bias_init=nnx.initializers.zeros, rngs=rngs))
            return nnx.List(layers)

        dims = [int(obs_dim), *[int(h) for h in hidden]]
        self.actor_torso = _torso(dims)
        self.separate_critic = bool(separate_critic)
        self.critic_torso = _torso(dims) if separate_critic else None
        last = dims[-1]
        self.policy_head = nnx.Linear(last, NUM_ACTIONS,
                                      kernel_init=nnx.initializers.orthogonal(0.01),
                                      bias_init=nnx.initializers.zeros, rngs=rngs)
        self.q_head = nnx.Linear(last, NUM_ACTIONS, kernel_init=nnx.initializers.orthogonal(1.0),
                                 bias_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs [..., D] -> (logits [..., 2], q [..., 2])."""
        h = obs
        for layer in self.actor_torso:
            h = jnp.tanh(layer(h))
        logits = self.policy_head(h)
        if self.critic_torso is not None:
            h = obs
            for layer in self.critic_torso:
                h = jnp.tanh(layer(h))
        q = self.q_head(h)
        return logits, q


def init_network(key: jax.Array, obs_dim: int, hidden: Sequence[int],
                 separate_critic: bool = True) -> tuple[nnx.GraphDef, nnx.State]:
    """Builds the network from a typed key; returns ``(graphdef, params)``.

    ``params`` is a plain pytree (``nnx.State``) that can be vmapped over seeds, e.g.
    ``jax.vmap(lambda k: init_network(k, ...)[1])(keys)``.
    """
    model = ActorCritic(obs_dim, tuple(hidden), rngs=nnx.Rngs(params=key),
                        separate_critic=separate_critic)
    graphdef, params = nnx.split(model)
    return graphdef, params


def make_apply_fn(graphdef: nnx.GraphDef) -> Callable:
    """``apply_fn(params, obs [..., D]) -> (logits [..., 2], q [..., 2])``, pure and jit-able."""
    def apply_fn(params, obs):
        return nnx.merge(graphdef, params)(obs)
    return apply_fn


def value_from_q(logits: jax.Array, q: jax.Array) -> jax.Array:
    """V(s) = Σ_a π(a|s) Q(s, a). logits, q: [..., 2] -> [...]."""
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * q, axis=-1)


def make_advantage_fn(graphdef_or_apply: nnx.GraphDef | Callable) -> Callable:
    """``advantage_fn(params, obs [U, D]) -> [U]``: the critic's ΔQ = Q(s,1) − Q(s,0).

    This is the quality-gain estimate a nomination carries to the stage-2 scheduler
    (reward units; PRM units under the coarse reward). Accepts a graphdef or an apply_fn.
    """
    apply_fn = graphdef_or_apply if callable(graphdef_or_apply) and not isinstance(
        graphdef_or_apply, nnx.GraphDef) else make_apply_fn(graphdef_or_apply)

    def advantage_fn(params, obs):
        _, q = apply_fn(params, obs)
        return q[..., 1] - q[..., 0]
    return advantage_fn


def count_params(params) -> int:
    """Number of scalar parameters in a params pytree."""
    return int(sum(x.size for x in jax.tree.leaves(params)))
