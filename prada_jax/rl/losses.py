"""PPO loss on network outputs: clipped surrogate + clipped Q-value regression − entropy bonus.

All terms are masked means over samples where the user made a decision (``mask``); samples
from non-decision slots contribute nothing. The loss is a pure function of the network outputs so it can be checked against a
NumPy transcription.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["PPOLossConfig", "ppo_loss", "masked_mean"]


class PPOLossConfig(NamedTuple):
    """Coefficients of the PPO loss.

    clip_eps: surrogate clip ε (ratio kept in [1−ε, 1+ε]).
    vf_coef: weight of the value (Q) loss.
    ent_coef: weight of the entropy bonus (subtracted).
    clip_value: clip the Q prediction to old ± ``value_clip_eps`` (PPO2-style max of losses).
    value_clip_eps: value clip range, reward units.
    normalize_adv: standardise advantages over the masked minibatch.
    """

    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    clip_value: bool = True
    value_clip_eps: float = 0.2
    normalize_adv: bool = True


def masked_mean(x: jax.Array, mask: jax.Array, count: jax.Array | None = None) -> jax.Array:
    """Σ x·m / max(Σ m, 1) (``count``: max(Σ m, 1) computed once by the caller)."""
    m = mask.astype(x.dtype)
    if count is None:
        count = jnp.maximum(jnp.sum(m), 1.0)
    return jnp.sum(x * m) / count


def ppo_loss(logits: jax.Array, q: jax.Array, actions: jax.Array, old_logp: jax.Array,
             old_q_taken: jax.Array, advantages: jax.Array, returns: jax.Array,
             mask: jax.Array, cfg: PPOLossConfig,
             diagnostics: bool = True) -> tuple[jax.Array, dict]:
    """PPO loss for one minibatch.

    Args:
      logits: [B, A] current policy logits.
      q: [B, A] current Q(s, ·), or [B, 1] the current V(s) of a plain value head (then the
        regressed prediction is V(s) instead of Q(s, a)).
      actions: [B] int actions taken.
      old_logp: [B] log π_old(a|s) at rollout time.
      old_q_taken: [B] Q_old(s, a) at rollout time (for value clipping).
      advantages: [B] GAE advantages.
      returns: [B] λ-return targets for Q(s, a).
      mask: [B] bool/float, 1 where the sample is a real decision.
      cfg: coefficients.
      diagnostics: also return ``approx_kl`` and ``clip_frac`` (they do not enter the loss;
        False leaves them out and computes the same loss and gradient).

    Returns:
      (total_loss, metrics) with metrics ``policy_loss``, ``value_loss``, ``entropy``,
      ``total_loss`` and, with ``diagnostics``, ``approx_kl`` (mean of (r−1) − log r) and
      ``clip_frac``.
    """
    actions = actions.astype(jnp.int32)
    mask = mask.astype(jnp.float32)
    count = jnp.maximum(jnp.sum(mask), 1.0)

    def mmean(x):
        return masked_mean(x, mask, count)

    # One log-softmax serves the log-probability and the entropy (a distrax Categorical
    # computes it once for each).
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, actions[:, None], axis=-1)[:, 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)   # finite logits
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)

    adv = advantages
    if cfg.normalize_adv:
        mu = mmean(adv)
        var = mmean(jnp.square(adv - mu))
        adv = (adv - mu) / (jnp.sqrt(var) + 1e-8)
    surr1 = ratio * adv
    surr2 = jnp.clip(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * adv
    policy_loss = -mmean(jnp.minimum(surr1, surr2))

    if q.shape[-1] == 1:
        q_taken = q[:, 0]
    else:
        q_taken = jnp.take_along_axis(q, actions[:, None], axis=-1)[:, 0]
    v_err = jnp.square(q_taken - returns)
    if cfg.clip_value:
        q_clipped = old_q_taken + jnp.clip(q_taken - old_q_taken, -cfg.value_clip_eps,
                                           cfg.value_clip_eps)
        v_err = jnp.maximum(v_err, jnp.square(q_clipped - returns))
    value_loss = 0.5 * mmean(v_err)
    ent = mmean(entropy)
    total = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * ent
    metrics = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": ent,
               "total_loss": total}
    if diagnostics:
        metrics["approx_kl"] = mmean((ratio - 1.0) - log_ratio)
        metrics["clip_frac"] = mmean((jnp.abs(ratio - 1.0) > cfg.clip_eps).astype(jnp.float32))
    return total, metrics
