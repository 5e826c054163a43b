"""Measures how far the hard threshold rule at fixed prices falls short of the exact per-slot oracle.

The duality gap (:func:`measure_gap`) is the per-slot value of the hard threshold decision at
the learned multipliers (after its feasibility repair) as a fraction of the exact oracle's
(``prada_jax.sched.oracle``), with λ_s = µ = 0 on the same slots as a reference; the slots come
from stage-2 rollouts at fixed prices (``prada_jax.dual.rollout``). :func:`rollout_stats`
adds the long-run env outcome the myopic per-slot oracle cannot see, measured as ``evals``
measures (empty start, a warm-up, the window's cohort of arrivals, blocked and timed-out users
at accuracy 0 and latency = the timeout; ``prada_jax.dual.measure``). The env is the first
argument (a ``prada_jax.dual.rollout.Stage2Env``; the edge env's is ``envs.stage2.EDGE``).
Numbers: docs/dual.md.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from prada_jax.sched import oracle
from prada_jax.sched.registry import scheduler_index
from prada_jax.sched.threshold import threshold_decide
from prada_jax.dual.measure import DEFAULT_TIMEOUT_SLOTS, censored_means
from prada_jax.dual.problem import Multipliers
from prada_jax.dual.rollout import Stage2Env, cached, fixed_prices, init_rollout, make_rollout

ZERO = Multipliers(0.0, 0.0)


def _fixed_rollout(env: Stage2Env, env_params, policy_fn, mult: Multipliers, num_envs: int,
                   seed: int, rollout_len: int, policy_key,
                   timeout_slots: int = DEFAULT_TIMEOUT_SLOTS):
    """(jitted rollout at fixed prices, its initial carry holding ``mult``; envs start
    empty)."""
    key = ("collect", env, rollout_len, int(timeout_slots),
           object() if policy_key is None else policy_key)
    rollout = cached(key, lambda: jax.jit(make_rollout(env, policy_fn, rollout_len,
                                                       timeout_slots=int(timeout_slots))))
    carry = init_rollout(env, jax.random.key(seed), env_params, num_envs,
                         lambda _: fixed_prices(mult))
    return rollout, carry


def collect_slots(env: Stage2Env, env_params, policy_fn, mult: Multipliers,
                  num_slots: int, num_envs: int,
                  seed: int, rollout_len: int = 100, policy_key=None, warmup_chunks: int = 2):
    """Rolls out ``num_envs`` envs with fixed multipliers (hard threshold rule) from an empty
    start and, after ``warmup_chunks × rollout_len`` slots of warm-up (as :func:`rollout_stats`
    and ``evals`` measure), until at least ``num_slots`` slots with ≥ 1 valid candidate are
    collected.

    Returns (SchedInputs [S, U], SlotBatch [S, U]) as NumPy trees (slots with candidates only,
    first ``num_slots`` of them in rollout order).
    """
    rollout, carry = _fixed_rollout(env, env_params, policy_fn, mult, num_envs, seed,
                                    rollout_len, policy_key)
    for _ in range(int(warmup_chunks)):
        carry, _ = rollout(carry, env_params)
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


def rollout_stats(env: Stage2Env, env_params, policy_fn, mult: Multipliers,
                  num_chunks: int, num_envs: int,
                  seed: int, rollout_len: int = 100, policy_key=None, warmup_chunks: int = 2,
                  timeout_slots: int = DEFAULT_TIMEOUT_SLOTS) -> dict:
    """Long-run env outcome of the hard threshold rule with fixed multipliers, measured by the
    rule of ``evals`` (``evals.evaluate``; ``prada_jax.dual.measure``).

    Rolls ``num_envs`` envs from an empty start (the same slots and noise for every ``mult``
    given the same seed, until decisions differ): ``warmup_chunks × rollout_len`` slots of
    warm-up W, a window of ``num_chunks × rollout_len`` slots, then whole chunks until the
    cohort's timeout D = ``timeout_slots`` has passed for every window arrival. The cohort is
    the users that arrive in the window, blocked ones included; a cohort user counts with its
    answer and latency if it finished within D slots of its arrival, else (blocked or
    unfinished) at accuracy 0 and latency D·τ. Returns ``accuracy`` and ``latency_s`` (per
    cohort arrival), ``objective`` (accuracy − β·latency, β in PRM units per second),
    ``arrivals``, ``blocked_rate``, ``timeout_rate`` (admitted cohort users unfinished at the
    timeout / arrivals), ``timeout_s``; over the window's env-slots: ``reward_per_slot`` (env
    reward summed over users, PRM units), ``queue_len``, ``server_in_use``, ``finished``
    (cohort users finished within D per env-slot), ``env_slots``.
    """
    if int(warmup_chunks) < 0:
        raise ValueError(f"warmup_chunks must be >= 0, got {warmup_chunks}")
    d = int(timeout_slots)
    rollout, carry = _fixed_rollout(env, env_params, policy_fn, mult, num_envs, seed,
                                    rollout_len, policy_key, d)
    lo, hi = int(warmup_chunks) * rollout_len, (int(warmup_chunks) + num_chunks) * rollout_len
    drain_chunks = -(-(d + 1) // rollout_len)   # the last cohort arrival resolves at hi + D
    keys = ("reward", "queue_len", "server_in_use", "arrivals", "blocked")
    sums = {k: 0.0 for k in keys + ("finished", "correct", "latency_s")}
    for c in range(int(warmup_chunks) + num_chunks + drain_chunks):
        carry, out = rollout(carry, env_params)
        out = jax.device_get({k: out[k] for k in keys + (
            "user_ok", "user_correct", "user_latency_s", "user_arrival_slot")})
        t = c * rollout_len + np.arange(rollout_len)
        win = (t >= lo) & (t < hi)
        for k in keys:
            sums[k] += float(np.sum(np.asarray(out[k], np.float64)[win]))
        a_slot = np.asarray(out["user_arrival_slot"]) - 1   # the slot its arrival was counted
        m = np.asarray(out["user_ok"]) & (a_slot >= lo) & (a_slot < hi)
        sums["finished"] += float(m.sum())
        sums["correct"] += float((m & np.asarray(out["user_correct"])).sum())
        sums["latency_s"] += float(np.sum(np.where(m, np.asarray(out["user_latency_s"],
                                                                   np.float64), 0.0)))
    n = num_chunks * rollout_len * num_envs
    timeout_s = d * float(env_params.tau_s)
    acc, lat = (float(v) for v in censored_means(sums["arrivals"], sums["finished"],
                                                  sums["correct"], sums["latency_s"],
                                                  timeout_s))
    arr = sums["arrivals"]
    rate = lambda x: x / arr if arr > 0 else float("nan")  # noqa: E731
    return {"reward_per_slot": sums["reward"] / n, "accuracy": acc, "latency_s": lat,
            "objective": acc - float(env_params.beta) * lat, "queue_len": sums["queue_len"] / n,
            "server_in_use": sums["server_in_use"] / n, "finished": sums["finished"] / n,
            "arrivals": arr, "blocked_rate": rate(sums["blocked"]),
            "timeout_rate": rate(arr - sums["blocked"] - sums["finished"]),
            "timeout_s": timeout_s, "env_slots": n}


def threshold_decisions(env: Stage2Env, x, batch, env_params, mult: Multipliers) -> np.ndarray:
    """Hard threshold rule (with its feasibility repair) on collected slots: [S, U] int8."""
    sp = env.sched_params(env_params).replace(lambda_s=jnp.float32(mult.lambda_s),
                                               mu=jnp.float32(mult.mu))
    fn = cached(("threshold",),
                lambda: jax.jit(jax.vmap(threshold_decide, in_axes=(0, 0, 0, None))))
    free_units = jnp.asarray(batch.free_units).astype(jnp.int32)
    return np.asarray(fn(x, free_units, jnp.asarray(batch.free_bw), sp))


def measure_gap(env: Stage2Env, env_params, policy_fn, mult: Multipliers,
                num_slots: int, num_envs: int,
                seed: int, policy_key=None, env_chunks: int = 5) -> dict:
    """Duality gap of the hard threshold rule with ``mult`` on ≥ num_slots env slots.

    Value of the rule's decision (after its feasibility repair) as a fraction of the exact
    oracle's per slot; also the same rule with λ_s = µ = 0 on the same slots as a reference.
    Slots are drawn from rollouts running ``mult`` after a 200-slot warm-up from an empty start
    (:func:`collect_slots`). ``env_chunks`` > 0 adds ``env`` /
    ``zero_env`` / ``fifo_env``: :func:`rollout_stats` of the same rule with ``mult``, with
    λ_s = µ = 0, and of the same policy with the FIFO-greedy scheduler (a window of
    ``env_chunks`` × 100 slots × ``num_envs`` envs each after a 200-slot warm-up, same seed).
    """
    x, batch = collect_slots(env, env_params, policy_fn, mult, num_slots, num_envs, seed,
                             policy_key=policy_key)
    out: dict = {"lambda_s": float(mult.lambda_s), "mu": float(mult.mu)}
    for pre, m in (("", mult), ("zero_", ZERO)):
        d = threshold_decisions(env, x, batch, env_params, m)
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
            out[f"{pre}env"] = rollout_stats(env, p, policy_fn, m, env_chunks, num_envs,
                                             seed + 1, policy_key=policy_key)
    return out
