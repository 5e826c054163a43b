"""How far the edge env is from this machine's limit: user-slot steps/s vs a simple roofline.

    python -m benchmarks.roofline [--num_envs=4096] [--num_users=16] [--slots=16]

Measures in one process (medians over ``--repeats`` after a warm-up):

* memory bandwidth: a jitted streaming kernel ``x ← a·x + b`` (10 passes in one call, in
  place) over a float32 array far larger than the caches (bytes read + written / time);
* FLOP/s: a jitted float32 matmul (2·n³ FLOP / time);
* the edge env (threshold scheduler, random screening, synthetic gsm8k traces): E envs × U
  users × ``slots`` slots, user-slot steps/s;
* XLA's cost analysis of ONE vmapped env step over E envs (no loop, so nothing is counted
  once for a whole loop): FLOP and bytes accessed per user-slot.

Roofline per user-slot = max(FLOP / measured FLOP/s, bytes / measured bandwidth); the printed
fraction is measured steps/s over the roofline steps/s. XLA's bytes count every operand of
every fused kernel once (an upper bound on DRAM traffic when data stays in cache, a lower one
when kernels re-read), so the roofline is a yardstick, not a bound. Synthetic data.
"""
from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags

from envs import edge
from prada_jax import cli


def _median_time(fn, *args, repeats=5):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _cost(compiled) -> dict:
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return dict(ca or {})


def measure_machine(repeats: int = 5) -> dict:
    """Streaming bandwidth (GB/s) and matmul FLOP/s of the default device, measured now."""
    gpu = jax.default_backend() != "cpu"
    n = (256 if gpu else 32) * 2 ** 20             # float32 elements (1 GiB / 128 MiB)
    k = 10                                          # passes inside one call (no allocation)
    x = jnp.ones((n,), jnp.float32)
    stream = jax.jit(lambda v: jax.lax.fori_loop(0, k, lambda i, u: u * 1.0001 + 0.5, v))
    t = _median_time(stream, x, repeats=repeats)
    bw = 2 * 4 * n * k / t
    m = 8192 if gpu else 1024
    a = jnp.ones((m, m), jnp.float32) / m
    mm = jax.jit(lambda p: p @ p)
    tf = _median_time(mm, a, repeats=repeats)
    return dict(stream_bytes=2 * 4 * n * k, stream_s=t, bandwidth_bytes_per_s=bw,
                matmul_n=m, matmul_s=tf, flop_per_s=2.0 * m ** 3 / tf)


def run(num_envs: int = 4096, num_users: int = 16, slots: int = 16, repeats: int = 5,
        problems: int = 256) -> dict:
    from benchmarks.env_throughput import _traces, make_jax_runner  # lazy: defines absl flags

    machine = measure_machine(repeats)
    traces, label = _traces(problems)
    params = edge.make_params(traces, num_users=num_users, scheduler="threshold")
    reset = jax.jit(jax.vmap(edge.reset, in_axes=(0, None)))
    states = reset(jax.random.split(jax.random.key(0), num_envs), params)[1]
    fn = make_jax_runner(params, num_envs, slots)
    states, r = fn(jax.random.key(1), states)
    jax.block_until_ready(r)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        states, r = fn(jax.random.key(2 + i), states)
        jax.block_until_ready(r)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    steps = num_envs * num_users * slots / med
    # One vmapped step (random screening, as in the runner), costed by XLA.

    def one_step(keys, st):
        def f(k, s):
            k_a, k_s = jax.random.split(k)
            act = edge.EdgeAction(jax.random.bernoulli(k_a, 0.5, (num_users,)).astype(jnp.int32),
                                  jnp.full((num_users,), 0.05, jnp.float32))
            return edge.step(k_s, s, act, params)[1]
        return jax.vmap(f)(keys, st)
    keys = jax.random.split(jax.random.key(3), num_envs)
    cost = _cost(jax.jit(one_step).lower(keys, states).compile())
    us = num_envs * num_users
    flops = float(cost.get("flops", 0.0)) / us
    bytes_ = float(cost.get("bytes accessed", 0.0)) / us
    t_roof = max(flops / machine["flop_per_s"], bytes_ / machine["bandwidth_bytes_per_s"])
    roof = 1.0 / t_roof if t_roof > 0 else float("nan")
    return dict(num_envs=num_envs, num_users=num_users, slots=slots, repeats=repeats,
                traces=label, synthetic=True, backend=jax.default_backend(),
                user_slot_steps_per_s=steps, call_s=med,
                flops_per_user_slot=flops, bytes_per_user_slot=bytes_,
                arithmetic_intensity=flops / bytes_ if bytes_ else None,
                measured_bw_gb_s=machine["bandwidth_bytes_per_s"] / 1e9,
                measured_gflop_s=machine["flop_per_s"] / 1e9,
                bound="memory" if bytes_ / machine["bandwidth_bytes_per_s"]
                >= flops / machine["flop_per_s"] else "compute",
                roofline_user_slot_steps_per_s=roof,
                fraction_of_roofline=steps / roof if roof == roof else None, machine=machine)


def _define(fv) -> None:
    flags.DEFINE_integer("num_envs", 4096, "envs E", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("num_users", 16, "user slots U per env", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("slots", 16, "slots per timed call", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("repeats", 5, "timed calls (median)", lower_bound=1, flag_values=fv)
    flags.DEFINE_string("json", "", "also write the result to this file", flag_values=fv)


def main(argv=None):
    """``argv``: absl flags (``--num_envs=4096``); None = the command line."""
    a = cli.parse_local(_define, argv, "benchmarks.roofline", __doc__)
    r = run(a.num_envs, a.num_users, a.slots, a.repeats)
    print(json.dumps(r, indent=2))
    print(f"edge env E={r['num_envs']} U={r['num_users']}: {r['user_slot_steps_per_s']:.3g} "
          f"user-slot steps/s = {100 * r['fraction_of_roofline']:.1f}% of the roofline "
          f"{r['roofline_user_slot_steps_per_s']:.3g}/s ({r['bound']}-bound: "
          f"{r['flops_per_user_slot']:.3g} FLOP, {r['bytes_per_user_slot']:.3g} B per "
          f"user-slot; {r['measured_bw_gb_s']:.3g} GB/s, {r['measured_gflop_s']:.3g} GFLOP/s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    cli.run_local(main)
