"""The critic refit's regression: the critic torso and Q head of a screening policy (never the
actor) fitted to given action-value targets for both actions, with early stopping on a held-out
set. Env-free: the targets come from the caller (``train.critic``: Monte-Carlo action values of
the frozen actor, ``evals.policy_eval``)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["critic_mask", "refit_critic"]


def critic_mask(net_params):
    """Pytree of bools: True on the critic's parameters (``critic_torso``, ``q_head``), False
    on the actor's (``actor_torso``, ``policy_head``), so a refit leaves the actor unchanged."""
    def is_critic(path, _):
        names = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
        return any(n in ("critic_torso", "q_head") for n in names)
    return jax.tree_util.tree_map_with_path(is_critic, net_params)


def refit_critic(apply_fn, net_params, obs, targets, key, *, steps: int = 3000,
                 batch_size: int = 512, lr: float = 1e-3, dq_weight: float = 1.0,
                 final_lr_frac: float = 0.1, val_obs=None, val_targets=None,
                 eval_every: int = 250) -> tuple[Any, dict]:
    """Regresses the critic (torso + Q head; the actor is untouched) on MC action values.

    Loss per state: (Q(s,0) − y0)² + (Q(s,1) − y1)² + ``dq_weight``·(ΔQ(s) − (y1 − y0))²,
    Adam with a linear decay to ``final_lr_frac``·lr over ``steps`` minibatches of
    ``batch_size`` states drawn uniformly with replacement. The network starts from
    ``net_params`` (the PPO critic), so the refit is a correction, not a new critic.

    Args:
      obs: [N, D] observations; targets: [N, 2] (``fit_targets``) in reward units.

      val_obs, val_targets: a held-out set; when given, the loss on it is measured every
        ``eval_every`` steps and the parameters with the lowest one are returned (early
        stopping against fitting the idiosyncratic part of the MC targets).

    Returns:
      ``(params, info)``: new parameters (actor leaves bit-identical) and ``{"loss_first",
      "loss_last"}`` (mean training loss of the first and last 100 steps), plus ``"val"``
      ([(step, loss)]) and ``"best_step"`` with a held-out set (step 0 = the start).
    """
    obs = jnp.asarray(obs, jnp.float32)
    y = jnp.asarray(targets, jnp.float32)
    mask = critic_mask(net_params)
    sched = optax.linear_schedule(lr, lr * final_lr_frac, steps)
    tx = optax.masked(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(sched)), mask)

    def loss_fn(p, o, t):
        _, q = apply_fn(p, o)
        e = jnp.square(q - t)
        dq = jnp.square((q[:, 1] - q[:, 0]) - (t[:, 1] - t[:, 0]))
        return jnp.mean(e[:, 0] + e[:, 1] + dq_weight * dq)

    def step(carry, k):
        p, opt = carry
        i = jax.random.randint(k, (batch_size,), 0, obs.shape[0])
        loss, g = jax.value_and_grad(loss_fn)(p, obs[i], y[i])
        g = jax.tree.map(lambda gi, m: jnp.where(m, gi, 0.0), g, mask)
        upd, opt = tx.update(g, opt, p)
        p = optax.apply_updates(p, upd)
        return (p, opt), loss

    @jax.jit
    def run(p, opt, keys):
        (p, opt), losses = jax.lax.scan(step, (p, opt), keys)
        return p, opt, losses

    val_loss = None
    if val_obs is not None:
        vo = jnp.asarray(val_obs, jnp.float32)
        vy = jnp.asarray(val_targets, jnp.float32)
        val_loss = jax.jit(lambda p: loss_fn(p, vo, vy))
    keys = jax.random.split(key, steps)
    p, opt = net_params, tx.init(net_params)
    every = int(eval_every) if val_loss is not None else steps
    all_losses, val, best = [], [], None
    if val_loss is not None:
        val.append((0, float(val_loss(p))))
        best = (val[0][1], 0, p)
    for s0 in range(0, steps, every):
        p, opt, losses = run(p, opt, keys[s0:s0 + every])
        all_losses.append(np.asarray(losses))
        if val_loss is not None:
            v = float(val_loss(p))
            val.append((min(s0 + every, steps), v))
            if v < best[0]:
                best = (v, min(s0 + every, steps), p)
    losses = np.concatenate(all_losses)
    info = {"loss_first": float(losses[:100].mean()), "loss_last": float(losses[-100:].mean())}
    if best is not None:
        p = best[2]
        info.update(val=val, best_step=best[1])
    # Only critic leaves moved: restore the actor's exactly (masked updates are zero anyway).
    new = jax.tree.map(lambda old, nw, m: nw if m else old, net_params, p, mask)
    return new, info
