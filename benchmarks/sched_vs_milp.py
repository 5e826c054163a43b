"""Speed: the jitted threshold scheduler vs the exact MILP oracle on the same slot, one run.

    python -m benchmarks.sched_vs_milp [--candidates 1024] [--free_units 64] [--repeats 50]
    python -m benchmarks.sched_vs_milp --slots=30     # medians over 30 slots + batched figure

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
from absl import flags

from benchmarks.common import median_time, save_json
from prada_jax import cli
from prada_jax.sched import base, fill, oracle
from prada_jax.sched.base import SchedInputs, SchedParams
from prada_jax.sched.threshold import admission_priority, advantages, threshold_decide


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
    t0 = time.perf_counter()
    d = fn(x, fu, fb, sp).block_until_ready()  # compile (or load from the cache) + warm-up
    t_first = time.perf_counter() - t0
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
            "threshold_s": t_thr, "threshold_first_call_s": t_first, "milp_s": t_milp, "ratio_milp_over_threshold": t_milp / t_thr,
            "threshold_value": thr_value, "oracle_value": sol.value,
            "value_ratio": thr_value / sol.value if sol.value > 0 else float("nan"),
            "threshold_feasible": oracle.is_feasible(np.asarray(d), b, free_units, free_bw_hz),
            "backend": jax.default_backend(), "synthetic": True}


def knapsack_milp(w, w_bar, b, free_units, free_bw_hz):
    """The slot as the 2-constraint 0/1 knapsack it is: queueing uses no resources, so the
    optimum is Σ max(w̄, 0) plus a knapsack over the candidates whose run-now profit
    p = w − max(w̄, 0) is positive (units ≤ free_units, Σ b ≤ free_bw). One binary per such
    candidate, scipy HiGHS. Returns the slot value (float)."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # lazy: scipy is a [dev] extra

    floor = np.maximum(w_bar, 0.0)
    p = w - floor
    idx = np.flatnonzero(p > 0)
    base = float(np.sum(floor))
    if idx.size == 0:
        return base
    a = np.vstack([np.ones(idx.size), b[idx]])
    res = milp(-p[idx], constraints=LinearConstraint(a, -np.inf, [free_units, free_bw_hz]),
               integrality=np.ones(idx.size), bounds=Bounds(0, 1), options={"disp": False})
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"knapsack_milp: {res.message}")
    return base + float(p[idx] @ np.round(res.x))


def _rule_fills(sp: SchedParams):
    """The threshold rule's want set and priority (one stable sort) under ``sp`` and the fills
    on it: (want_rank, fill_only, sequential_only, passes), not jitted."""
    def want_rank(x):
        want, rank, _, _ = admission_priority(x, sp)
        return want, rank

    def fill_only(x, fu, fb):
        want, rank = want_rank(x)
        return fill.greedy_fill_ranked(want, rank, x.bandwidth_hz, fu, fb)

    def sequential_only(x, fu, fb):
        want, rank = want_rank(x)
        return fill.greedy_fill_sequential(want, rank, x.bandwidth_hz, fu, fb)

    def passes(x, fu, fb):
        want, rank = want_rank(x)
        return fill.fill_passes(want, rank, x.bandwidth_hz, fu, fb)
    return want_rank, fill_only, sequential_only, passes


def _decide(sp: SchedParams, rank_fn):
    """``threshold_decide`` under ``sp`` with the repair ranked by ``rank_fn``."""
    return lambda x, fu, fb: threshold_decide(x, fu, fb, sp, rank_fn)


def _slot_row(x: SchedInputs, free_units: int, sp: SchedParams, jitted: dict, repeats: int,
              full_milp: bool) -> dict:
    """One slot's timings (medians of ``repeats``), MILP value and checks for ``run_slots``."""
    thr, thr_pw, fil, seq = jitted["thr"], jitted["thr_pw"], jitted["fil"], jitted["seq"]
    fb_v = float(jnp.mean(x.bandwidth_hz)) * free_units
    fu, fb = jnp.int32(free_units), jnp.float32(fb_v)
    t_thr, t_fill, t_seq, t_pw = (median_time(f, x, fu, fb, repeats=repeats)
                                  for f in (thr, fil, seq, thr_pw))
    want, rank = jax.jit(jitted["want_rank"])(x)
    t_fr = median_time(jitted["fill_ranked"], want, rank, x.bandwidth_hz, fu, fb, repeats=repeats)
    t_sr = median_time(jitted["seq_ranked"], want, rank, x.bandwidth_hz, fu, fb, repeats=repeats)
    w, w_bar, _ = (np.asarray(a, np.float64) for a in advantages(x, sp))
    b = np.asarray(x.bandwidth_hz, np.float64)
    t0 = time.perf_counter()
    v_knap = knapsack_milp(w, w_bar, b, free_units, fb_v)
    t_milp = time.perf_counter() - t0
    d = np.asarray(thr(x, fu, fb))
    row = dict(threshold_s=t_thr, threshold_pairwise_rank_s=t_pw, fill_s=t_fill,
               sequential_fill_s=t_seq, milp_s=t_milp,
               fill_given_rank_s=t_fr, sequential_given_rank_s=t_sr,
               passes=int(jitted["npass"](x, fu, fb)), oracle_value=v_knap,
               threshold_value=oracle.slot_value(d, w, w_bar),
               feasible=oracle.is_feasible(d, b, free_units, fb_v),
               pairwise_equals_sorted=bool(np.array_equal(d, np.asarray(thr_pw(x, fu, fb)))),
               fill_equals_sequential=bool(np.array_equal(np.asarray(fil(x, fu, fb)),
                                                          np.asarray(seq(x, fu, fb)))))
    if full_milp:
        row["full_milp_value"] = oracle.milp_slot(w, w_bar, b, free_units, fb_v).value
    return row


def _slot_medians(rows: list[dict]) -> dict:
    """``run_slots``' per-slot medians, ratios and all-slot checks."""
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {
        "threshold_s_median": med("threshold_s"),
        "threshold_pairwise_rank_s_median": med("threshold_pairwise_rank_s"),
        "ratio_pairwise_over_sorted_median": statistics.median(
            r["threshold_pairwise_rank_s"] / r["threshold_s"] for r in rows),
        "pairwise_equals_sorted_all": all(r["pairwise_equals_sorted"] for r in rows),
        "fill_s_median": med("fill_s"),
        "sequential_fill_s_median": med("sequential_fill_s"),
        "fill_given_rank_s_median": med("fill_given_rank_s"),
        "sequential_given_rank_s_median": med("sequential_given_rank_s"),
        "milp_knapsack_s_median":
        med("milp_s"),
        "ratio_milp_over_threshold_median": statistics.median(
            r["milp_s"] / r["threshold_s"] for r in rows),
        "ratio_milp_over_fill_median": statistics.median(r["milp_s"] / r["fill_s"]
                                                         for r in rows),
        "ratio_sequential_over_fill_median": statistics.median(
            r["sequential_fill_s"] / r["fill_s"] for r in rows),
        "passes_median": med("passes"), "passes_max": max(r["passes"] for r in rows),
        "value_ratio_median": statistics.median(
            r["threshold_value"] / r["oracle_value"] for r in rows if r["oracle_value"] > 0),
        "all_feasible": all(r["feasible"] for r in rows),
        "fill_equals_sequential_all": all(r["fill_equals_sequential"] for r in rows),
        "knapsack_equals_full_milp": all(abs(r["full_milp_value"] - r["oracle_value"])
                                         <= 1e-6 * max(1.0, abs(r["oracle_value"]))
                                         for r in rows if "full_milp_value" in r),
    }


def _batched_rates(xs: list, batch: int, free_units: int, sp: SchedParams, fills,
                   repeats: int) -> dict:
    """``batch`` slots (cycling ``xs``) vmapped: slots/s of the rule and the fills."""
    want_rank, fill_only, _, _ = fills
    xb = jax.tree.map(lambda *a: jnp.stack(a), *[xs[i % len(xs)] for i in range(batch)])
    fub = jnp.full((batch,), free_units, jnp.int32)
    fbb = jnp.asarray([float(jnp.mean(xs[i % len(xs)].bandwidth_hz)) * free_units
                       for i in range(batch)], jnp.float32)
    t_thr_b = median_time(jax.jit(jax.vmap(_decide(sp, fill.sorted_rank))),
                          xb, fub, fbb, repeats=repeats)
    t_pw_b = median_time(jax.jit(jax.vmap(_decide(sp, base.priority_rank))),
                         xb, fub, fbb, repeats=repeats)
    t_fill_b = median_time(jax.jit(jax.vmap(fill_only)), xb, fub, fbb, repeats=repeats)
    wb, rb = jax.jit(jax.vmap(want_rank))(xb)
    t_fr_b = median_time(jax.jit(jax.vmap(fill.greedy_fill_ranked)), wb, rb,
                         xb.bandwidth_hz, fub, fbb, repeats=repeats)
    t_sr_b = median_time(jax.jit(jax.vmap(fill.greedy_fill_sequential)), wb, rb,
                         xb.bandwidth_hz, fub, fbb, repeats=repeats)
    return {"batched_threshold_slots_per_s": batch / t_thr_b,
            "batched_threshold_pairwise_rank_slots_per_s": batch / t_pw_b,
            "batched_fill_slots_per_s": batch / t_fill_b,
            "batched_fill_given_rank_slots_per_s": batch / t_fr_b,
            "batched_sequential_given_rank_slots_per_s": batch / t_sr_b}


def run_slots(n: int = 1024, slots: int = 30, free_units: int = 64, lambda_s: float = 0.005,
              mu_per_mhz: float = 0.002, repeats: int = 20, batch: int = 256,
              check_full_milp: int = 3) -> dict:
    """Medians over ``slots`` random slots of ``n`` candidates (synthetic): the jitted
    threshold rule (``threshold_decide``, whose repair is the vectorised fill), the fill
    alone (``prada_jax.sched.fill`` on the rule's want set and priority, sort included), the
    one-by-one fill (``fill.greedy_fill_sequential``), and scipy ``milp`` on the 2-constraint
    knapsack formulation of the same slot (one solve each); the MILP / threshold ratio per
    slot (median). Batched: ``batch`` slots vmapped through ``threshold_decide`` and through
    the fill, slots/s. ``threshold_s`` ranks the repair by one stable sort and
    ``threshold_pairwise_rank_s`` by C² comparisons (the rule picks by C:
    ``threshold.SORT_ABOVE``); both decide the same (checked per slot). The first ``check_full_milp`` slots are also solved by the 3-choice
    MILP of ``oracle.milp_slot`` to check that the knapsack formulation has the same optimum.
    """
    sp = SchedParams(lambda_s=jnp.float32(lambda_s), mu=jnp.float32(mu_per_mhz * 1e-6))
    fills = _rule_fills(sp)
    want_rank, fill_only, sequential_only, passes = fills
    # the rule's repair ranked by one stable sort vs by C² pairwise comparisons (same decisions)
    jitted = dict(thr=jax.jit(_decide(sp, fill.sorted_rank)),
                  thr_pw=jax.jit(_decide(sp, base.priority_rank)),
                  fil=jax.jit(fill_only), seq=jax.jit(sequential_only), npass=jax.jit(passes),
                  fill_ranked=jax.jit(fill.greedy_fill_ranked),
                  seq_ranked=jax.jit(fill.greedy_fill_sequential), want_rank=want_rank)
    xs = [make_slot(n, seed=k) for k in range(slots)]
    rows = [_slot_row(x, free_units, sp, jitted, repeats, k < check_full_milp)
            for k, x in enumerate(xs)]
    return {"candidates": n, "slots": slots, "free_units": free_units, "repeats": repeats,
            **_slot_medians(rows),
            "batch": batch, **_batched_rates(xs, batch, free_units, sp, fills, repeats),
            "backend": jax.default_backend(), "synthetic": True, "rows": rows}


def _define(fv) -> None:
    flags.DEFINE_integer("candidates", 1024, "candidates in the slot", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("free_units", 64, "free server units", lower_bound=0, flag_values=fv)
    flags.DEFINE_integer("repeats", 50, "timed threshold calls (median)", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("milp_repeats", 3, "timed MILP solves (median)", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("seed", 0, "seed of the synthetic slot", flag_values=fv)
    flags.DEFINE_integer("slots", 0, "> 0: medians over this many random slots vs the knapsack "
                         "MILP, and the 256-slot vmapped figure (run_slots)", lower_bound=0,
                         flag_values=fv)
    flags.DEFINE_string("json", "", "also write the result to this file", flag_values=fv)


def main(argv=None):
    """``argv``: absl flags (``--free_units=64``); None = the command line."""
    a = cli.parse_local(_define, argv, "benchmarks.sched_vs_milp", __doc__)
    if a.slots > 0:
        r = run_slots(a.candidates, a.slots, a.free_units, repeats=a.repeats)
        print(json.dumps({k: v for k, v in r.items() if k != "rows"}, indent=2))
        save_json(a.json, r)
        return
    r = run(a.candidates, a.free_units, repeats=a.repeats, milp_repeats=a.milp_repeats,
            seed=a.seed)
    print(f"slot of {r['candidates']} candidates (synthetic), {r['free_units']} free units, "
          f"{r['free_bw_hz'] / 1e6:.1f} MHz free, backend {r['backend']}")
    print(f"threshold (jit) median {r['threshold_s'] * 1e3:.3f} ms | MILP median "
          f"{r['milp_s'] * 1e3:.1f} ms | MILP / threshold = {r['ratio_milp_over_threshold']:.0f}x")
    print(f"slot value: threshold {r['threshold_value']:.4f}, oracle {r['oracle_value']:.4f} "
          f"({100 * r['value_ratio']:.2f}%), threshold feasible: {r['threshold_feasible']}")
    save_json(a.json, r)


if __name__ == "__main__":
    cli.run_local(main)
