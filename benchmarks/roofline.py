"""Two rooflines: the latency clock's per hardware pair, and this machine's for the edge env.

    python -m benchmarks.roofline --clock_only            # the clock table (instant)
    python -m benchmarks.roofline [--num_envs=4096] [--num_users=16] [--slots=16]

The clock table (``clock_table``; docs/latency.md) prints, per hardware pair of
``prada_jax.latency.PAIRS``: the server LLM's (Qwen2.5-7B) per-token decode time at batch
1, 8, 32 and M (M = the most sequences the server's KV memory holds at ``CONTEXT`` tokens),
the edge SLM's (Qwen2.5-1.5B) per-token decode at batch 1, the prefill time of ``CONTEXT``
tokens on each side, and the server/edge per-token ratio at batch 1. Every sequence holds
``CONTEXT`` tokens of context. ``paper`` is the FLOP-only clock (no batching: its per-token
time is the same at every batch). Computed from the profiles, not measured.

The machine part:

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

import jax
import jax.numpy as jnp
from absl import flags

from benchmarks.common import median_time, save_json, time_repeats
from envs import edge
from prada_jax import cli
from prada_jax import latency as lat


CONTEXT = 512          # tokens of context of every sequence in the clock table
BATCHES = (1, 8, 32)   # server batch sizes of the table (and M)


def clock_table(context: int = CONTEXT) -> list[dict]:
    """One row per hardware pair: per-token decode times [ms] of the server LLM at batch 1, 8,
    32 and M, of the edge SLM at batch 1, prefill times [ms] of ``context`` tokens, and the
    server/edge per-token ratio at batch 1 (< 1: the server decodes a token faster)."""
    rows = []
    for pair in lat.PAIRS:
        p = lat.pair_latency_params(pair)
        c = float(context)
        if p.roofline:
            m = lat.max_sequences(p, context)
            srv = {b: float(lat.decode_step_s(p.llm, p.server_hw, b, b * c))
                   for b in BATCHES + (m,)}
            edge_tok = float(lat.decode_step_s(p.slm, p.edge_hw, 1, c))
            pre_srv = float(lat.prefill_s(p.llm, p.server_hw, c, 0.0))
            pre_edge = float(lat.prefill_s(p.slm, p.edge_hw, c, 0.0))
        else:
            m = None
            one = float(lat.compute_delay_s(lat.decode_token_flops(p.llm, c),
                                            p.server_peak_flops, p.server_eta))
            srv = {b: one for b in BATCHES}
            edge_tok = float(lat.compute_delay_s(lat.decode_token_flops(p.slm, c),
                                                 p.edge_peak_flops, p.edge_eta))
            pre_srv = float(lat.compute_delay_s(lat.prefill_flops(p.llm, c), p.server_peak_flops,
                                                p.server_eta))
            pre_edge = float(lat.compute_delay_s(lat.prefill_flops(p.slm, c), p.edge_peak_flops,
                                                 p.edge_eta))
        names = lat.PAIRS[pair] or ("paper edge (4 TFLOP/s, η 0.3)",
                                    "paper server (312 TFLOP/s, η 0.3)")
        rows.append({"pair": pair, "edge": names[0], "server": names[1], "context": context,
                     "M": m, "server_ms": {str(b): 1e3 * t for b, t in srv.items()},
                     "edge_ms": 1e3 * edge_tok, "server_prefill_ms": 1e3 * pre_srv,
                     "edge_prefill_ms": 1e3 * pre_edge,
                     "server_over_edge_b1": srv[1] / edge_tok})
    return rows


def clock_markdown(rows: list[dict]) -> str:
    """The clock table as markdown (docs/latency.md)."""
    head = ("| pair | edge / server | M | server ms/token b=1 | b=8 | b=32 | b=M | "
            f"edge ms/token | server / edge (b=1) | prefill {rows[0]['context']} tok server / "
            "edge ms |")
    out = [head, "|" + "---|" * 10]
    for r in rows:
        s = r["server_ms"]
        m = "—" if r["M"] is None else str(r["M"])
        bm = "—" if r["M"] is None else f"{s[str(r['M'])]:.3g}"
        out.append(f"| {r['pair']} | {r['edge']} / {r['server']} | {m} | {s['1']:.3g} | "
                   f"{s['8']:.3g} | {s['32']:.3g} | {bm} | {r['edge_ms']:.3g} | "
                   f"{r['server_over_edge_b1']:.3g} | {r['server_prefill_ms']:.3g} / "
                   f"{r['edge_prefill_ms']:.3g} |")
    return "\n".join(out)


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
    t = median_time(stream, x, repeats=repeats)
    bw = 2 * 4 * n * k / t
    m = 8192 if gpu else 1024
    a = jnp.ones((m, m), jnp.float32) / m
    mm = jax.jit(lambda p: p @ p)
    tf = median_time(mm, a, repeats=repeats)
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
    states, _, _, med = time_repeats(fn, states, repeats)
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
    flags.DEFINE_bool("clock_only", False, "print the latency clock's table per hardware pair "
                      "and stop (no machine measurement)", flag_values=fv)


def main(argv=None):
    """``argv``: absl flags (``--num_envs=4096``); None = the command line."""
    a = cli.parse_local(_define, argv, "benchmarks.roofline", __doc__)
    rows = clock_table()
    print(f"latency clock per hardware pair (context {CONTEXT} tokens; per-token decode, "
          "prefill of the context; computed from the profiles, not measured):")
    print(clock_markdown(rows))
    if a.clock_only:
        save_json(a.json, {"clock": rows})
        return
    r = run(a.num_envs, a.num_users, a.slots, a.repeats)
    r["clock"] = rows
    print(json.dumps(r, indent=2))
    print(f"edge env E={r['num_envs']} U={r['num_users']}: {r['user_slot_steps_per_s']:.3g} "
          f"user-slot steps/s = {100 * r['fraction_of_roofline']:.1f}% of the roofline "
          f"{r['roofline_user_slot_steps_per_s']:.3g}/s ({r['bound']}-bound: "
          f"{r['flops_per_user_slot']:.3g} FLOP, {r['bytes_per_user_slot']:.3g} B per "
          f"user-slot; {r['measured_bw_gb_s']:.3g} GB/s, {r['measured_gflop_s']:.3g} GFLOP/s)")
    save_json(a.json, r)


if __name__ == "__main__":
    cli.run_local(main)
