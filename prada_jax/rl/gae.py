"""GAE(γ, λ) over each user's own decision sequence, from slot-major rollouts with masks.

A multi-user env advances in slots; user slot u makes a decision only in some slots
(``decision[t, u]``); in the others it is drafting, waiting, or the slot is empty. Rewards may
arrive in any slot, and a user's solution may end (``terminated``) in any slot, after which a
new user can take the slot. GAE is computed on the *decision* sub-sequence of each user slot:

* the reward of decision d is the (undiscounted) sum of the rewards of the slots from d's slot
  up to, but excluding, the slot of the next decision of the same user slot — discounting is
  per decision, as in the per-user screening MDP (stage 1 of PRADA);
* the bootstrap value of decision d is the value at the same user's NEXT decision;
* a termination in slot t (after the decision at or before t) cuts the sequence: no
  bootstrap, and anything after t belongs to the next user of that slot;
* a truncation in slot t cuts the sequence but bootstraps with ``next_values[t]`` (the value
  of the observation after slot t in that user slot);
* the end of the rollout is a truncation: ``last_value`` is the bootstrap for decisions whose
  next decision lies beyond the rollout.

Rewards of slots that follow a termination and precede the new user's first decision belong
to no decision and are dropped. Non-decision slots get advantage and return 0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["masked_gae"]


def masked_gae(rewards: jax.Array, values: jax.Array, decision: jax.Array,
               terminated: jax.Array, truncated: jax.Array, next_values: jax.Array,
               last_value: jax.Array, gamma: float, lam: float,
               unroll: int = 1) -> tuple[jax.Array, jax.Array]:
    """Per-user GAE over decision slots.

    Args:
      rewards: [T, ...] float, reward received in each slot (leading axis time, any batch
        axes after it, e.g. [T, E, U]).
      values: [T, ...] value estimate V(s_t) of the observation at slot t (used only where
        ``decision``).
      decision: [T, ...] bool, the user made a decision (its action was consumed) in slot t.
      terminated: [T, ...] bool, the user's episode ended naturally during slot t (no
        bootstrap).
      truncated: [T, ...] bool, the episode was cut during slot t (bootstrap with
        ``next_values[t]``). Ignored where ``terminated``.
      next_values: [T, ...] value of the observation after slot t (only read where truncated).
      last_value: [...] value of the observation after the last slot (rollout-end bootstrap).
      gamma: discount per decision.
      lam: GAE λ.
      unroll: unroll factor of the reverse scan (same result; fewer loop iterations).

    Returns:
      (advantages, returns): each [T, ...] float32; returns = advantages + values at decision
      slots; both 0 elsewhere.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    decision = jnp.asarray(decision, bool)
    terminated = jnp.asarray(terminated, bool)
    truncated = jnp.asarray(truncated, bool) & ~terminated
    next_values = jnp.asarray(next_values, jnp.float32)
    zeros = jnp.zeros_like(jnp.asarray(last_value, jnp.float32))

    def _backward(carry, xs):
        v_next, a_next, r_acc = carry
        r, v, m, term, trunc, nv = xs
        # An episode end in this slot disconnects the decision(s) before it from everything
        # after it; truncation keeps a bootstrap value, termination does not.
        ended = term | trunc
        v_next = jnp.where(term, 0.0, jnp.where(trunc, nv, v_next))
        a_next = jnp.where(ended, 0.0, a_next)
        r_acc = jnp.where(ended, 0.0, r_acc) + r
        delta = r_acc + gamma * v_next - v
        adv = delta + gamma * lam * a_next
        new_carry = (jnp.where(m, v, v_next), jnp.where(m, adv, a_next),
                     jnp.where(m, 0.0, r_acc))
        return new_carry, jnp.where(m, adv, 0.0)

    init = (jnp.asarray(last_value, jnp.float32), zeros, zeros)
    _, adv = jax.lax.scan(_backward, init,
                          (rewards, values, decision, terminated, truncated, next_values),
                          reverse=True, unroll=max(1, int(unroll)))
    returns = jnp.where(decision, adv + values, 0.0)
    return adv, returns
