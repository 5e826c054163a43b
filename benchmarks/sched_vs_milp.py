"""Speed: the jitted threshold scheduler vs the exact MILP oracle on the same slot, one run.

    python -m benchmarks.sched_vs_milp [--candidates 1024] [--free_units 64] [--repeats 50]

One random slot (synthetic numbers, not from traces): gains ΔQ ~ |N(0.05, 0.1)|-ish PRM units,
delays 0.1–1 s, bandwidth needs 0.2–3 MHz, β = 0.2, τ = 50 ms, queue length 8, M = 4; the
multipliers λ_s, µ are given (defaults 0.005 and 0.002 per MHz). Prints the median wall time of
``prada_jax.sched.threshold_decide`` (jitted, after warm-up, ``block_until_ready``) and of
``prada_jax.sched.oracle.milp_slot`` (scipy HiGHS), their ratio, and both slot values.
"""
from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from prada_jax.sched.base import SchedInputs, SchedParams
from prada_jax.sched.threshold import advantages, threshold_decide
from prada_jax.sched import oracle


def make_slot(n: int, seed: int = 0) -> SchedInputs:
    rng = np.random.default_rng(seed)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return SchedInputs(
        candidate=jnp.ones(n, bool), gain=f32(rng.normal(0.05, 0.1, n)),
        delay_s=f32(rng.uniform(0.1, 1.0, n)), bandwidth_hz=f32(rng.uniform(0.2e6, 3e6, n)),
        wait_slots=jnp.asarray(rng.integers(0, 5, n), jnp.int32),
        ctx_tokens=jnp.asarray(rng.integers(100, 2000, n), jnp.int32),
        snr=f32(rng.uniform(1, 100, n)), draft_prm=f32(rng.uniform(0, 1, n)),
        u_rand=f32(rng.uniform(0, 1, n)), queue_len=jnp.asarray(8, jnp.int32),
        comm_s=f32(rng.uniform(0.02, 0.1, n)))


def run(n: int = 1024, free_units: int = 64, free_bw_hz: float | None = None,
        lambda_s: float = 0.005, mu_per_mhz: float = 0.002, repeats: int = 50,
        milp_repeats: int = 3, seed: int = 0) -> dict:
    x = make_slot(n, seed)
    if free_bw_hz is None:  # room for about free_units average requests
        free_bw_hz = float(jnp.mean(x.bandwidth_hz)) * free_units
    sp = SchedParams(lambda_s=jnp.float32(lambda_s), mu=jnp.float32(mu_per_mhz * 1e-6))
    fu, fb = jnp.int32(free_units), jnp.float32(free_bw_hz)
    fn = jax.jit(threshold_decide)
    d = fn(x, fu, fb, sp).block_until_ready()  # compile + warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x, fu, fb, sp).block_until_ready()
        times.append(time.perf_counter() - t0)
    w, w_bar, _ = (np.asarray(a, np.float64) for a in advantages(x, sp))
    b = np.asarray(x.bandwidth_hz, np.float64)
    mtimes = []
    for _ in range(milp_repeats):
        t0 = time.perf_counter()
        sol = oracle.milp_slot(w, w_bar, b, free_units, free_bw_hz)
        mtimes.append(time.perf_counter() - t0)
    thr_value = oracle.slot_value(np.asarray(d), w, w_bar)
    t_thr, t_milp = statistics.median(times), statistics.median(mtimes)
    return {"candidates": n, "free_units": free_units, "free_bw_hz": free_bw_hz,
            "threshold_s": t_thr, "milp_s": t_milp, "ratio_milp_over_threshold": t_milp / t_thr,
            "threshold_value": thr_value, "oracle_value": sol.value,
            "value_ratio": thr_value / sol.value if sol.value > 0 else float("nan"),
            "threshold_feasible": oracle.is_feasible(np.asarray(d), b, free_units, free_bw_hz),
            "backend": jax.default_backend(), "synthetic": True}


def _define(fv) -> None:
    from absl import flags

    flags.DEFINE_integer("candidates", 1024, "candidates in the slot", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("free_units", 64, "free server units", lower_bound=0, flag_values=fv)
    flags.DEFINE_integer("repeats", 50, "timed threshold calls (median)", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("milp_repeats", 3, "timed MILP solves (median)", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("seed", 0, "seed of the synthetic slot", flag_values=fv)
    flags.DEFINE_string("json", "", "also write the result to this file", flag_values=fv)


def main(argv=None):
    """``argv``: absl flags (``--free_units=64``); None = the command line."""
    from prada_jax import cli

    a = cli.parse_local(_define, argv, "benchmarks.sched_vs_milp", __doc__)
    r = run(a.candidates, a.free_units, repeats=a.repeats, milp_repeats=a.milp_repeats,
            seed=a.seed)
    print(f"slot of {r['candidates']} candidates (synthetic), {r['free_units']} free units, "
          f"{r['free_bw_hz'] / 1e6:.1f} MHz free, backend {r['backend']}")
    print(f"threshold (jit) median {r['threshold_s'] * 1e3:.3f} ms | MILP median "
          f"{r['milp_s'] * 1e3:.1f} ms | MILP / threshold = {r['ratio_milp_over_threshold']:.0f}x")
    print(f"slot value: threshold {r['threshold_value']:.4f}, oracle {r['oracle_value']:.4f} "
          f"({100 * r['value_ratio']:.2f}%), threshold feasible: {r['threshold_feasible']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    from prada_jax import cli

    cli.run_local(main)
