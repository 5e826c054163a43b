"""Flax NNX actor-critic: an MLP torso, a policy head over A discrete actions and a critic head.

Two critic heads:

* ``critic="q"`` (default, what the scheduler needs): ``Q(s, a)`` for every action
  (for the edge env A = 2: 0 = keep the draft, 1 = nominate for the server);
* ``critic="v"``: a plain state value ``V(s)`` (output ``[..., 1]``), for envs whose
  actions carry no gain to a scheduler.

For the Q head, the state value used by GAE is ``V(s) = Σ_a π(a|s) Q(s, a)``, and the scalar a
nomination carries to the server (docs/design.md §4, §6) is the critic's advantage
``ΔQ(s) = Q(s, 1) − Q(s, 0)`` (in reward units, i.e. PRM units for the coarse reward).
The Q head is trained on the action taken, with the GAE λ-return as target — the λ-return
estimates ``Q(s_t, a_t)``, so no extra data is needed.

The action count A comes from the env's action spec (``num_values``; ``action_count``).
One network is shared by all users: it acts on ``[..., obs_dim]`` observations.
The learner carries ``nnx.split`` state (plain pytrees) and merges inside pure functions.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["ActorCritic", "init_network", "make_apply_fn", "make_advantage_fn",
           "value_from_q", "value_from_critic", "taken_critic", "gain_from_critic",
           "action_count", "count_params", "CRITICS"]

NUM_ACTIONS = 2   # the edge env's screening actions (default when an env has no action spec)
CRITICS = ("q", "v")


def action_count(env, env_params) -> int:
    """A, the number of discrete actions per user, from ``env.action_spec(params).num_values``
    (``NUM_ACTIONS`` = 2 when the env has no ``action_spec``)."""
    spec_fn = getattr(env, "action_spec", None)
    if spec_fn is None:
        return NUM_ACTIONS
    n = int(getattr(spec_fn(env_params), "num_values"))
    if n < 2:
        raise ValueError(f"env action spec: num_values must be >= 2, got {n}")
    return n


class ActorCritic(nnx.Module):
    """MLP actor-critic.

    Args:
      obs_dim: observation features per user (D).
      hidden: widths of the shared tanh torso, e.g. (64, 64).
      rngs: NNX rngs for initialisation.
      separate_critic: give the critic its own torso (no shared features).
      num_actions: A, policy logits per user.
      critic: "q" (``Q(s, ·)``, [..., A]) or "v" (``V(s)``, [..., 1]).
    """

    def __init__(self, obs_dim: int, hidden: Sequence[int], *, rngs: nnx.Rngs,
                 separate_critic: bool = True, num_actions: int = NUM_ACTIONS,
                 critic: str = "q"):
        if critic not in CRITICS:
            raise ValueError(f"ActorCritic: critic must be one of {CRITICS}, got {critic!r}")
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
        self.policy_head = nnx.Linear(last, int(num_actions),
                                      kernel_init=nnx.initializers.orthogonal(0.01),
                                      bias_init=nnx.initializers.zeros, rngs=rngs)
        self.q_head = nnx.Linear(last, int(num_actions) if critic == "q" else 1,
                                 kernel_init=nnx.initializers.orthogonal(1.0),
                                 bias_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs [..., D] -> (logits [..., A], critic [..., A] (Q) or [..., 1] (V))."""
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
                 separate_critic: bool = True, num_actions: int = NUM_ACTIONS,
                 critic: str = "q") -> tuple[nnx.GraphDef, nnx.State]:
    """Builds the network from a typed key; returns ``(graphdef, params)``.

    ``params`` is a plain pytree (``nnx.State``) that can be vmapped over seeds, e.g.
    ``jax.vmap(lambda k: init_network(k, ...)[1])(keys)``.
    """
    model = ActorCritic(obs_dim, tuple(hidden), rngs=nnx.Rngs(params=key),
                        separate_critic=separate_critic, num_actions=num_actions, critic=critic)
    graphdef, params = nnx.split(model)
    return graphdef, params


def make_apply_fn(graphdef: nnx.GraphDef) -> Callable:
    """``apply_fn(params, obs [..., D]) -> (logits [..., A], critic [..., A or 1])``, pure and
    jit-able."""
    def apply_fn(params, obs):
        return nnx.merge(graphdef, params)(obs)
    return apply_fn


def value_from_q(logits: jax.Array, q: jax.Array) -> jax.Array:
    """V(s) = Σ_a π(a|s) Q(s, a). logits, q: [..., A] -> [...]."""
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * q, axis=-1)


def value_from_critic(logits: jax.Array, critic: jax.Array) -> jax.Array:
    """State value [...] from either head: ``critic`` [..., 1] is V(s) itself, [..., A] is Q."""
    if critic.shape[-1] == 1:
        return critic[..., 0]
    return value_from_q(logits, critic)


def taken_critic(critic: jax.Array, action: jax.Array) -> jax.Array:
    """The trained critic prediction [...] for the action taken: Q(s, a) or V(s)."""
    if critic.shape[-1] == 1:
        return critic[..., 0]
    return jnp.take_along_axis(critic, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def gain_from_critic(critic: jax.Array) -> jax.Array:
    """ΔQ = Q(s, 1) − Q(s, 0) [...] (what a nomination carries); zeros for a V head."""
    if critic.shape[-1] == 1:
        return jnp.zeros(critic.shape[:-1], critic.dtype)
    return critic[..., 1] - critic[..., 0]


def make_advantage_fn(graphdef_or_apply: nnx.GraphDef | Callable) -> Callable:
    """``advantage_fn(params, obs [U, D]) -> [U]``: the critic's ΔQ = Q(s,1) − Q(s,0) (zeros for
    a V head, which has no action values).

    This is the quality-gain estimate a nomination carries to the stage-2 scheduler
    (reward units; PRM units under the coarse reward). Accepts a graphdef or an apply_fn.
    """
    apply_fn = graphdef_or_apply if callable(graphdef_or_apply) and not isinstance(
        graphdef_or_apply, nnx.GraphDef) else make_apply_fn(graphdef_or_apply)

    def advantage_fn(params, obs):
        _, q = apply_fn(params, obs)
        return gain_from_critic(q)
    return advantage_fn


def count_params(params) -> int:
    """Number of scalar parameters in a params pytree."""
    return int(sum(x.size for x in jax.tree.leaves(params)))
