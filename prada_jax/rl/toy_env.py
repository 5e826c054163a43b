"""A tiny multi-user screening environment with a known optimal policy (for tests and demos).

Not the edge env and not trace data: it exists to show that the PPO learner only relies on
the pure ``reset``/``step`` shape (docs/design.md §4 and §9 "Environments"), and to exercise the
per-user masking of GAE with interleaved, delayed and terminated decision sequences.

Rules (U user slots, D features, episodes of ``episode_len`` decisions):

* user slot u decides every ``1 + u % 2`` slots (even slots every slot, odd slots every
  other slot); the observation is the current node's features ``feat [D] ~ N(0, 1)``;
* action 1 (nominate) earns ``feat[0] − threshold``, action 0 (keep) earns 0; even users get
  the reward in the decision slot, odd users one slot later (a non-decision slot);
* after ``episode_len`` decisions the user's episode terminates (for odd users in the slot
  the last reward arrives); the slot then stays empty for one slot and a new user arrives;
* ``info`` has ``decision_mask``, ``terminated``, ``truncated`` (always False without a time
  limit) and the per-slot metric ``offload_rate`` (nominations / decisions in the slot, 0 if
  none).

Optimal policy: nominate iff ``feat[0] > threshold``; its expected episode return is
``episode_len · E[max(Z − threshold, 0)]`` for Z ~ N(0, 1).

Options (static fields of ``ToyParams``):

* ``num_actions`` A ≥ 2: action k ≥ 1 earns ``feat[(k − 1) % D] − threshold`` (A = 2 is the
  rule above); the optimal action is the argmax over {0, feat[0..A−2] − threshold};
  ``action_spec(params).num_values`` = A.
* ``time_limit`` L > 0: a user is cut (``truncated``) at its L-th decision if that decision
  does not end its episode (L < ``episode_len``); a delayed user gets that decision's reward
  in the same slot. The slot is refilled at once (auto-reset: the new user decides in the
  next slot) and ``info["final_observation"]`` [U, D] holds the features the cut user would
  have decided on next (read where ``truncated``).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["ToyParams", "ToyState", "reset", "step", "make", "action_spec", "ToySpec"]


@struct.dataclass
class ToyParams:
    threshold: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.3))
    num_users: int = struct.field(pytree_node=False, default=4)
    obs_dim: int = struct.field(pytree_node=False, default=3)
    episode_len: int = struct.field(pytree_node=False, default=4)
    num_actions: int = struct.field(pytree_node=False, default=2)
    time_limit: int = struct.field(pytree_node=False, default=0)


class ToySpec(NamedTuple):
    shape: tuple
    dtype: Any
    num_values: int


def action_spec(params: ToyParams) -> ToySpec:
    """[U] int32 in {0, ..., num_actions − 1}."""
    return ToySpec(shape=(params.num_users,), dtype=jnp.int32, num_values=int(params.num_actions))


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
    act = action.astype(jnp.int32)
    nominate = decide & (act >= 1)
    col = jnp.clip(act - 1, 0, None) % params.obs_dim
    r_now = jnp.where(nominate, jnp.take_along_axis(state.feat, col[:, None], axis=1)[:, 0]
                      - params.threshold, 0.0)
    last = decide & (state.count + 1 >= params.episode_len)
    if params.time_limit > 0:
        truncated = decide & ~last & (state.count + 1 >= params.time_limit)
    else:
        truncated = jnp.zeros(u, bool)
    reward = state.pending + jnp.where(delayed & ~truncated, 0.0, r_now)
    terminated = state.pending_term | (last & ~delayed)
    pending = jnp.where(delayed & ~truncated, r_now, 0.0)
    pending_term = last & delayed
    count = jnp.where(decide, state.count + 1, state.count)
    count = jnp.where(terminated | truncated, 0, count)
    if params.time_limit > 0:
        feat_key, fresh_key = jax.random.split(key)
    else:
        feat_key = key
    new_feat = jax.random.normal(feat_key, state.feat.shape, jnp.float32)
    feat = jnp.where(decide[:, None], new_feat, state.feat)
    final_obs = feat
    countdown = jnp.where(decide, _period(params) - 1, state.countdown - 1)
    # A finished user leaves; the slot stays empty one slot, then a new user decides.
    countdown = jnp.where(terminated, 1, countdown)
    countdown = jnp.where(pending_term, jnp.maximum(countdown, 1), countdown)
    if params.time_limit > 0:
        # A cut user is replaced at once by a new one (fresh features, decides next slot).
        fresh = jax.random.normal(fresh_key, state.feat.shape, jnp.float32)
        feat = jnp.where(truncated[:, None], fresh, feat)
        countdown = jnp.where(truncated, 0, countdown)
    n_dec = jnp.sum(decide)
    info = {
        "decision_mask": decide,
        "terminated": terminated,
        "truncated": truncated,
        "offload_rate": jnp.sum(nominate) / jnp.maximum(n_dec, 1),
    }
    if params.time_limit > 0:
        info["final_observation"] = final_obs
    new_state = ToyState(feat=feat, countdown=countdown, count=count, pending=pending,
                         pending_term=pending_term)
    return feat, new_state, reward, terminated | truncated, info


class ToyEnv(NamedTuple):
    reset: Any
    step: Any
    action_spec: Any = action_spec


def make(**overrides) -> tuple[ToyEnv, ToyParams]:
    """``(env, default_params)`` like ``envs.registry.make``; overrides set ToyParams fields."""
    params = ToyParams()
    if "threshold" in overrides:
        overrides["threshold"] = jnp.float32(overrides["threshold"])
    params = params.replace(**overrides)
    return ToyEnv(reset=reset, step=step, action_spec=action_spec), params
