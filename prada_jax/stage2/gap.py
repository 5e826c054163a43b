"""Measures how far the hard threshold rule at fixed prices falls short of the exact per-slot oracle.

The duality gap (:func:`measure_gap`) is the per-slot value of the hard threshold decision at
the learned multipliers (after its feasibility repair) as a fraction of the exact oracle's
(``prada_jax.sched.oracle``), with λ_s = µ = 0 on the same slots as a reference; the slots come
from stage-2 rollouts at fixed prices (``prada_jax.stage2.rollout``). :func:`rollout_stats`
adds the long-run env outcome the myopic per-slot oracle cannot see. Numbers: docs/dual.md.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs import edge
from prada_jax.sched import oracle
from prada_jax.sched.registry import scheduler_index
from prada_jax.sched.threshold import threshold_decide
from prada_jax.stage2.problem import Multipliers
from prada_jax.stage2.rollout import cached, fixed_prices, init_rollout, make_rollout

ZERO = Multipliers(0.0, 0.0)


def _fixed_rollout(env_params, policy_fn, mult: Multipliers, num_envs: int, seed: int,
                   rollout_len: int, policy_key):
    """(jitted rollout at fixed prices, its initial carry holding ``mult``)."""
    key = ("collect", rollout_len, object() if policy_key is None else policy_key)
    rollout = cached(key, lambda: jax.jit(make_rollout(policy_fn, rollout_len)))
    carry = init_rollout(jax.random.key(seed), env_params, num_envs,
                         lambda _: fixed_prices(mult))
    return rollout, carry


def collect_slots(env_params, policy_fn, mult: Multipliers, num_slots: int, num_envs: int,
                  seed: int, rollout_len: int = 100, policy_key=None):
    """Rolls out ``num_envs`` envs with fixed multipliers (hard threshold rule) until at least
    ``num_slots`` slots with ≥ 1 valid candidate are collected.

    Returns (SchedInputs [S, U], SlotBatch [S, U]) as NumPy trees (slots with candidates only,
    first ``num_slots`` of them in rollout order).
    """
    rollout, carry = _fixed_rollout(env_params, policy_fn, mult, num_envs, seed, rollout_len,
                                    policy_key)
    xs, bs, have = [], [], 0
    for _ in range(10_000):
        carry, out = rollout(carry, env_params)
        x, b = jax.device_get((out["x"], out["batch"]))
        flat = lambda a: np.asarray(a).reshape((-1,) + np.shape(a)[2:])  # noqa: E731
        x, b = jax.tree.map(flat, x), jax.tree.map(flat, b)
        keep = np.asarray(b.valid).any(-1)
        xs.append(jax.tree.map(lambda a: a[keep], x))
        bs.append(jax.tree.map(lambda a: a[keep], b))
        have += int(keep.sum())
        if have >= num_slots:
            break
    cat = lambda *a: np.concatenate(a)[:num_slots]  # noqa: E731
    return jax.tree.map(cat, *xs), jax.tree.map(cat, *bs)


def rollout_stats(env_params, policy_fn, mult: Multipliers, num_chunks: int, num_envs: int,
                  seed: int, rollout_len: int = 100, policy_key=None) -> dict:
    """Long-run env outcome of the hard threshold rule with fixed multipliers.

    Rolls ``num_envs`` envs from reset for ``num_chunks × rollout_len`` slots (the same slots
    and noise for every ``mult`` given the same seed, until decisions differ) and returns
    means over all env-slots: ``reward_per_slot`` (env reward summed over users, PRM units),
    ``accuracy`` and ``latency_s`` (over users that finished), ``objective`` (accuracy −
    β·latency, β in PRM units per second), ``queue_len``, ``server_in_use``, ``finished``
    (users finished per env-slot), ``env_slots``.
    """
    rollout, carry = _fixed_rollout(env_params, policy_fn, mult, num_envs, seed, rollout_len,
                                    policy_key)
    sums = {k: 0.0 for k in ("reward", "queue_len", "server_in_use", "finished", "correct",
                             "latency_s")}
    for _ in range(num_chunks):
        carry, out = rollout(carry, env_params)
        out = jax.device_get({k: out[k] for k in sums})
        for k in sums:
            sums[k] += float(np.sum(np.asarray(out[k], np.float64)))
    n = num_chunks * rollout_len * num_envs
    fin = max(sums["finished"], 1.0)
    acc, lat = sums["correct"] / fin, sums["latency_s"] / fin
    return {"reward_per_slot": sums["reward"] / n, "accuracy": acc, "latency_s": lat,
            "objective": acc - float(env_params.beta) * lat, "queue_len": sums["queue_len"] / n,
            "server_in_use": sums["server_in_use"] / n, "finished": sums["finished"] / n,
            "env_slots": n}


def threshold_decisions(x, batch, env_params, mult: Multipliers) -> np.ndarray:
    """Hard threshold rule (with its feasibility repair) on collected slots: [S, U] int8."""
    sp = edge.sched_params(env_params).replace(lambda_s=jnp.float32(mult.lambda_s),
                                               mu=jnp.float32(mult.mu))
    fn = cached(("threshold",),
                lambda: jax.jit(jax.vmap(threshold_decide, in_axes=(0, 0, 0, None))))
    free_units = jnp.asarray(batch.free_units).astype(jnp.int32)
    return np.asarray(fn(x, free_units, jnp.asarray(batch.free_bw), sp))


def measure_gap(env_params, policy_fn, mult: Multipliers, num_slots: int, num_envs: int,
                seed: int, policy_key=None, env_chunks: int = 5) -> dict:
    """Duality gap of the hard threshold rule with ``mult`` on ≥ num_slots env slots.

    Value of the rule's decision (after its feasibility repair) as a fraction of the exact
    oracle's per slot; also the same rule with λ_s = µ = 0 on the same slots as a reference.
    Slots are drawn from rollouts running ``mult``. ``env_chunks`` > 0 adds ``env`` /
    ``zero_env`` / ``fifo_env``: :func:`rollout_stats` of the same rule with ``mult``, with
    λ_s = µ = 0, and of the same policy with the FIFO-greedy scheduler (``env_chunks`` × 100
    slots × ``num_envs`` envs each, same seed).
    """
    x, batch = collect_slots(env_params, policy_fn, mult, num_slots, num_envs, seed,
                             policy_key=policy_key)
    out: dict = {"lambda_s": float(mult.lambda_s), "mu": float(mult.mu)}
    for pre, m in (("", mult), ("zero_", ZERO)):
        d = threshold_decisions(x, batch, env_params, m)
        rep = oracle.threshold_vs_oracle(batch.w, batch.w_bar, batch.b, batch.valid,
                                         batch.free_units, batch.free_bw, d)
        out.update({f"{pre}slots": rep.slots, f"{pre}positive_slots": rep.positive,
                    f"{pre}mean": rep.mean, f"{pre}p5": rep.p5, f"{pre}min": rep.min,
                    f"{pre}pooled": rep.pooled, f"{pre}infeasible": rep.infeasible,
                    f"{pre}milp_slots": rep.milp_slots})
    out["candidates_per_slot"] = float(np.mean(np.sum(batch.valid, -1)))
    if env_chunks > 0:
        fifo = env_params.replace(scheduler=jnp.asarray(scheduler_index("fifo_greedy"),
                                                        jnp.int32))
        for pre, m, p in (("", mult, env_params), ("zero_", ZERO, env_params),
                          ("fifo_", ZERO, fifo)):
            out[f"{pre}env"] = rollout_stats(p, policy_fn, m, env_chunks, num_envs, seed + 1,
                                             policy_key=policy_key)
    return out
