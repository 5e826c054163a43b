"""Edge-env throughput vs the number of environments E (1 → 4096): where vmap saturates.

    python -m benchmarks.env_scaling [--envs 1,4,16,64,256,1024,4096] [--num_users 16]
                                     [--slots 32] [--repeats 3] [--json FILE]

For each E the jitted ``vmap(scan(edge.step))`` runner of ``benchmarks.env_throughput`` runs
E envs × U users × ``slots`` slots per call (random screening actions and gains drawn inside
the scan); the median wall time of ``repeats`` calls after a warm-up (compile) call gives
user-slot steps per second. With several devices the env states are split over the mesh axis
``batch`` (``prada_jax.parallel``) whenever E divides the device count — the same placement the
PPO trainer uses. Traces: the calibrated *synthetic* gsm8k preset.

"Saturation" is the smallest E whose rate reaches 90% of the best rate measured.
"""
from __future__ import annotations

import os

import jax
from absl import flags

from benchmarks.common import save_json, time_repeats
from envs import edge
from prada_jax import cli, parallel
from prada_jax.errors import BadInput

DEFAULT_ENVS = (1, 4, 16, 64, 256, 1024, 4096)


def saturation_point(envs: list[int], rates: list[float], frac: float = 0.9) -> int:
    """Smallest E with rate ≥ ``frac`` × the best rate (``envs`` ascending)."""
    best = max(rates)
    return next(e for e, r in zip(envs, rates) if r >= frac * best)


def run(envs=DEFAULT_ENVS, num_users: int = 16, slots: int = 32, repeats: int = 3,
        problems: int = 256) -> dict:
    """Returns ``{"rows": [{"num_envs", "steps_per_s", "call_s", "compile_s", "sharded"}],
    "saturation_envs", "best_steps_per_s", ...}``; rates are user-slot steps per second."""
    from benchmarks.env_throughput import _traces, make_jax_runner  # lazy: defines absl flags

    envs = sorted(int(e) for e in envs)
    if not envs or envs[0] < 1:
        raise ValueError(f"--envs must be positive integers, got {envs}")
    traces, label = _traces(problems)
    params = edge.make_params(traces, num_users=num_users, scheduler="threshold")
    ndev = len(jax.devices())
    mesh = parallel.make_mesh(0) if ndev > 1 else None
    reset = jax.jit(jax.vmap(edge.reset, in_axes=(0, None)))
    rows = []
    for e in envs:
        states = reset(jax.random.split(jax.random.key(0), e), params)[1]
        sharded = mesh is not None and e % ndev == 0
        if sharded:
            states = parallel.shard_batch(states, mesh)
        fn = make_jax_runner(params, e, slots)
        states, _, compile_s, med = time_repeats(fn, states, repeats)
        rows.append(dict(num_envs=e, steps_per_s=e * num_users * slots / med, call_s=med,
                         compile_s=compile_s, sharded=sharded))
        print(f"  env_scaling E={e:5d}: {rows[-1]['steps_per_s']:12.0f} user-slot steps/s "
              f"(call {1e3 * med:8.1f} ms, compile {compile_s:.1f} s"
              f"{', sharded over %d devices' % ndev if sharded else ''})", flush=True)
    rates = [r["steps_per_s"] for r in rows]
    return dict(traces=label, synthetic=True, backend=jax.default_backend(), devices=ndev,
                num_users=num_users, slots=slots, repeats=repeats, rows=rows,
                best_steps_per_s=max(rates),
                saturation_envs=saturation_point([r["num_envs"] for r in rows], rates),
                load_avg_1min=os.getloadavg()[0])


def main(argv=None) -> dict:
    """``argv``: absl flags (``--envs=64,256``); None = the command line."""
    def define(fv):
        flags.DEFINE_list("envs", [str(e) for e in DEFAULT_ENVS], "comma-separated env counts",
                          flag_values=fv)
        flags.DEFINE_integer("num_users", 16, "user slots U per env", lower_bound=1,
                             flag_values=fv)
        flags.DEFINE_integer("slots", 32, "slots per timed call", lower_bound=1, flag_values=fv)
        flags.DEFINE_integer("repeats", 3, "timed calls (median)", lower_bound=1,
                             flag_values=fv)
        flags.DEFINE_string("json", "", "also write the result to this file", flag_values=fv)

    args = cli.parse_local(define, argv, "benchmarks.env_scaling", __doc__)
    try:
        envs = [int(x) for x in args.envs if x.strip()]
    except ValueError:
        raise BadInput(f"--envs must be comma-separated integers, got {args.envs!r}") from None
    if not envs or min(envs) < 1:
        raise BadInput(f"--envs must be integers >= 1, got {args.envs!r}")
    res = run(envs, args.num_users, args.slots, args.repeats)
    print(f"saturates at E={res['saturation_envs']} (≥ 90% of the best "
          f"{res['best_steps_per_s']:.0f} steps/s)")
    save_json(args.json, res)
    return res


if __name__ == "__main__":
    cli.run_local(main)
