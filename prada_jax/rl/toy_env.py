"""A tiny multi-user screening environment with a known optimal policy (for tests and demos).

Not the edge env and not trace data: it exists to show that the PPO learner only relies on
the pure ``reset``/``step`` shape (DESIGN §4, STYLE "Environments"), and to exercise the
per-user masking of GAE with interleaved, delayed and terminated decision sequences.

Rules (U user slots, D features, episodes of ``episode_len`` decisions):

* user slot u decides every ``1 + u % 2`` slots (even slots every slot, odd slots every
  other slot); the observation is the current node's features ``feat [D] ~ N(0, 1)``;
* action 1 (nominate) earns ``feat[0] − threshold``, action 0 (keep) earns 0; even users get
  the reward in the decision slot, odd users one slot later (a non-decision slot);
* after ``episode_len`` decisions the user's episode terminates (for odd users in the slot
  the last reward arrives); the slot then stays empty for one slot and a new user arrives;
* ``info`` has ``decision_mask``, ``terminated``, ``truncated`` (always False) and the
  per-slot metric ``offload_rate`` (nominations / decisions in the slot, 0 if none).

Optimal policy: nominate iff ``feat[0] > threshold``; its expected episode return is
``episode_len · E[max(Z − threshold, 0)]`` for Z ~ N(0, 1).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["ToyParams", "ToyState", "reset", "step", "make"]


@struct.dataclass
class ToyParams:
    threshold: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.3))
    num_users: int = struct.field(pytree_node=False, default=4)
    obs_dim: int = struct.field(pytree_node=False, default=3)
    episode_len: int = struct.field(pytree_node=False, default=4)


@struct.dataclass
class ToyState:
    feat: jax.Array        # [U, D] current node features
    countdown: jax.Array   # [U] int32 slots until the next decision (0 = decides now)
    count: jax.Array       # [U] int32 decisions made in the current episode
    pending: jax.Array     # [U] float32 reward to deliver next slot (odd users)
    pending_term: jax.Array  # [U] bool the episode ends next slot (odd users)


def _period(params: ToyParams) -> jax.Array:
    return 1 + jnp.arange(params.num_users, dtype=jnp.int32) % 2


def reset(key: jax.Array, params: ToyParams) -> tuple[jax.Array, ToyState]:
    """-> (obs [U, D], state)."""
    u, d = params.num_users, params.obs_dim
    feat = jax.random.normal(key, (u, d), jnp.float32)
    state = ToyState(feat=feat, countdown=jnp.zeros(u, jnp.int32), count=jnp.zeros(u, jnp.int32),
                     pending=jnp.zeros(u, jnp.float32), pending_term=jnp.zeros(u, bool))
    return feat, state


def step(key: jax.Array, state: ToyState, action: Any, params: ToyParams):
    """-> (obs [U, D], state, reward [U], done [U], info). ``action`` [U] int32 (or any object
    with a ``screen`` field, like the edge env's action struct)."""
    action = getattr(action, "screen", action)
    u = params.num_users
    delayed = (jnp.arange(u) % 2) == 1
    decide = state.countdown == 0
    nominate = decide & (action.astype(jnp.int32) == 1)
    r_now = jnp.where(nominate, state.feat[:, 0] - params.threshold, 0.0)
    last = decide & (state.count + 1 >= params.episode_len)
    reward = state.pending + jnp.where(delayed, 0.0, r_now)
    terminated = state.pending_term | (last & ~delayed)
    pending = jnp.where(delayed, r_now, 0.0)
    pending_term = last & delayed
    count = jnp.where(decide, state.count + 1, state.count)
    count = jnp.where(terminated, 0, count)
    new_feat = jax.random.normal(key, state.feat.shape, jnp.float32)
    feat = jnp.where(decide[:, None], new_feat, state.feat)
    countdown = jnp.where(decide, _period(params) - 1, state.countdown - 1)
    # A finished user leaves; the slot stays empty one slot, then a new user decides.
    countdown = jnp.where(terminated, 1, countdown)
    countdown = jnp.where(pending_term, jnp.maximum(countdown, 1), countdown)
    n_dec = jnp.sum(decide)
    info = {
        "decision_mask": decide,
        "terminated": terminated,
        "truncated": jnp.zeros(u, bool),
        "offload_rate": jnp.sum(nominate) / jnp.maximum(n_dec, 1),
    }
    new_state = ToyState(feat=feat, countdown=countdown, count=count, pending=pending,
                         pending_term=pending_term)
    return feat, new_state, reward, terminated, info


class ToyEnv(NamedTuple):
    reset: Any
    step: Any


def make(**overrides) -> tuple[ToyEnv, ToyParams]:
    """``(env, default_params)`` like ``envs.registry.make``; overrides set ToyParams fields."""
    params = ToyParams()
    if "threshold" in overrides:
        overrides["threshold"] = jnp.float32(overrides["threshold"])
    params = params.replace(**overrides)
    return ToyEnv(reset=reset, step=step), params
