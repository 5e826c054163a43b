"""Edge-env throughput: user-slot steps per second, JAX (jit + vmap + scan) vs the NumPy reference.

    python -m benchmarks.env_throughput [--num_envs=1024] [--num_users=16] [--slots=64]
        [--numpy_slots=2000] [--scheduler=threshold] [--repeats=3] [--json=out.json]

One user-slot step = one user slot advanced by one slot τ. The JAX env runs ``num_envs`` envs
(vmap) for ``slots`` slots (lax.scan) in one jitted call with random screening actions and gains
drawn inside the scan; the median over ``repeats`` calls after a warm-up call is reported
(compile time excluded and printed separately). The NumPy reference (``envs.edge_numpy``, plain
loops over users) runs one env of the same size for ``numpy_slots`` slots with NumPy-drawn
randomness. Traces: the calibrated *synthetic* gsm8k preset (``prada_jax.traces.synthetic``).
"""
from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks.common import save_json
from envs import edge
from envs.edge_numpy import EdgeEnvNumPy, consts_from_jax
from prada_jax import cli
from prada_jax.traces import synthetic

_NUM_ENVS = flags.DEFINE_integer("num_envs", 1024, "JAX envs run in parallel (vmap)")
_NUM_USERS = flags.DEFINE_integer("num_users", 16, "user slots U per env")
_SLOTS = flags.DEFINE_integer("slots", 64, "slots per timed JAX call (scan length)")
_NP_SLOTS = flags.DEFINE_integer("numpy_slots", 2000, "slots the NumPy reference runs")
_SCHED = flags.DEFINE_string("scheduler", "threshold", "stage-2 scheduler name")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed JAX calls (median reported)")
_PROBLEMS = flags.DEFINE_integer("problems", 256, "synthetic gsm8k problems in the trace set")
_JSON = flags.DEFINE_string("json", "", "also write the result to this JSON file")


def _traces(problems: int):
    traces, meta = synthetic.generate("gsm8k", seed=0, problems=problems)
    return traces, f"synthetic gsm8k ({problems} problems, {traces.num_nodes} nodes)"


def make_jax_runner(params, num_envs: int, slots: int):
    """Returns a jitted ``run(key, states) -> (states, reward_sum)`` over [E] envs × slots."""
    u = params.num_users

    def one(key, state):
        def body(state, k):
            k_a, k_g, k_s = jax.random.split(k, 3)
            act = edge.EdgeAction(jax.random.bernoulli(k_a, 0.5, (u,)).astype(jnp.int32),
                                  0.1 * jax.random.normal(k_g, (u,)) + 0.05)
            _, state, r, _, _ = edge.step(k_s, state, act, params)
            return state, jnp.sum(r)

        state, r = jax.lax.scan(body, state, jax.random.split(key, slots))
        return state, jnp.sum(r)

    batched = jax.vmap(one)

    @jax.jit
    def run(key, states):
        return batched(jax.random.split(key, num_envs), states)

    return run


def bench_jax(params, num_envs, slots, repeats):
    states = jax.jit(jax.vmap(edge.reset, in_axes=(0, None)))(
        jax.random.split(jax.random.key(0), num_envs), params)[1]
    run = make_jax_runner(params, num_envs, slots)
    t0 = time.perf_counter()
    states, r = run(jax.random.key(1), states)
    jax.block_until_ready(r)
    compile_s = time.perf_counter() - t0
    times, cpu = [], []
    for i in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        states, r = run(jax.random.key(2 + i), states)
        jax.block_until_ready(r)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med, med_cpu = statistics.median(times), statistics.median(cpu)
    n = num_envs * params.num_users * slots
    return dict(steps_per_s=n / med, steps_per_cpu_s=n / med_cpu, call_s=med, cpu_s=med_cpu,
                first_call_s=compile_s, finished=int(jax.device_get(states.finished).sum()))


def bench_numpy(traces, cfg, lat, slots, seed=0):
    rng = np.random.default_rng(seed)
    u = cfg["num_users"]
    n_prob = traces.num_problems

    def noise():
        return dict(u_arrival=rng.uniform(), problem=rng.integers(0, n_prob, u),
                    fading=rng.exponential(size=u), u_sched=rng.uniform(size=u))

    env = EdgeEnvNumPy(traces, cfg, lat)
    env.reset(noise())
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(slots):
        env.step(rng.integers(0, 2, u), rng.normal(0.05, 0.1, u), noise())
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    return dict(steps_per_s=u * slots / dt, steps_per_cpu_s=u * slots / dc, total_s=dt,
                finished=env.finished)


def run(num_envs=1024, num_users=16, slots=64, numpy_slots=2000, scheduler="threshold",
        repeats=3, problems=256) -> dict:
    traces, label = _traces(problems)
    cfg = dict(num_users=num_users, scheduler=scheduler)
    params = edge.make_params(traces, **cfg)
    full = dict(num_users=num_users, scheduler=scheduler, tau_s=0.05, beta=0.2, lambda_s=0.0,
                mu=0.0, num_servers=4, bandwidth_hz=20e6, arrival_rate_hz=4.0,
                initial_users=num_users, default_gain=0.05, max_wait_slots=20,
                rsd_threshold=0.7, reward_mode="coarse", server_kv_cache=False, downlink=True,
                ctx_scale=1e-3)
    res_np = bench_numpy(traces, full, consts_from_jax(params.latency), numpy_slots)
    res_jax = bench_jax(params, num_envs, slots, repeats)
    return dict(traces=label, backend=jax.default_backend(), devices=len(jax.devices()),
                load_avg_1min=os.getloadavg()[0], cpus=os.cpu_count(),
                num_envs=num_envs, num_users=num_users, slots=slots, scheduler=scheduler,
                jax=res_jax, numpy=res_np,
                ratio=res_jax["steps_per_s"] / res_np["steps_per_s"],
                ratio_cpu=res_jax["steps_per_cpu_s"] / res_np["steps_per_cpu_s"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    res = run(_NUM_ENVS.value, _NUM_USERS.value, _SLOTS.value, _NP_SLOTS.value, _SCHED.value,
              _REPEATS.value, _PROBLEMS.value)
    print(f"traces: {res['traces']} | backend {res['backend']} x{res['devices']} | "
          f"scheduler {res['scheduler']} | {res['cpus']} CPUs, load avg {res['load_avg_1min']:.1f}")
    print(f"JAX   ({res['num_envs']} envs x {res['num_users']} users, jit+vmap+scan): "
          f"{res['jax']['steps_per_s']:.3e} user-slot steps/s "
          f"(median call {res['jax']['call_s']:.3f} s for {res['slots']} slots; "
          f"first call incl. compile {res['jax']['first_call_s']:.1f} s); "
          f"{res['jax']['steps_per_cpu_s']:.3e} per CPU-second")
    print(f"NumPy (1 env x {res['num_users']} users, reference loops): "
          f"{res['numpy']['steps_per_s']:.3e} user-slot steps/s; "
          f"{res['numpy']['steps_per_cpu_s']:.3e} per CPU-second")
    print(f"ratio JAX / NumPy: {res['ratio']:.1f}x wall-clock, {res['ratio_cpu']:.1f}x per CPU-second")
    save_json(_JSON.value, res)


if __name__ == "__main__":
    cli.run(main)
