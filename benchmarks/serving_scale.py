"""Edge env under the serving server at population sizes U = 32 … 4096: is the cost linear in U?

    python -m benchmarks.serving_scale [--users 32,128,512,2048,4096] [--slots 200]
                                       [--repeats 3] [--numpy_users 32,128] [--json FILE]

One env (no vmap) of U user slots, pair ``a100_orin_int4``, the serving server with
max_num_seqs 256 (at most the KV bound), the threshold rule with random screening actions,
arrivals at λ = U / 20 s (the population a 20 s latency bound needs, so the cell is busy but
not full), run for ``slots`` slots after a warm-up of the same length (the env starts empty).
For each U: the median wall time of ``repeats`` jitted calls gives slots/s and user-slot
steps/s; ``per_user_ratio`` is the time per slot per user relative to the smallest U (1 =
linear in U; above 1, superlinear). The NumPy reference (``envs.edge_numpy``, same rules,
plain Python) runs the same configuration at the small Us in the same process: the JAX/NumPy
ratio. Traces: the calibrated *synthetic* gsm8k preset (SYNTHETIC: speed only).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.common import save_json, time_repeats
from envs import edge
from evals import suite
from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from prada_jax.traces import synthetic

DEFAULT_USERS = (32, 128, 512, 2048, 4096)


def _params(traces, u: int):
    m = min(edge.DEFAULT_MAX_NUM_SEQS, edge.max_num_servers(
        edge.make_params(traces, num_users=1, hardware="a100_orin_int4",
                         num_servers=1).latency, traces, "serving"))
    return edge.make_params(traces, num_users=u, hardware="a100_orin_int4", num_servers=m,
                            scheduler="threshold", arrival_rate_hz=u / 20.0, initial_users=0,
                            beta=0.02)


def _runner(params, slots: int):
    u = params.num_users

    def body(state, k):
        k_a, k_s = jax.random.split(k)
        act = jax.random.bernoulli(k_a, 0.3, (u,)).astype(jnp.int32)
        _, state, _, d, info = edge.step(k_s, state, act, params)
        return state, (jnp.sum(d), info["server_batch"], info["blocked"])

    @jax.jit
    def run(key, state):
        state, ys = jax.lax.scan(body, state, jax.random.split(key, slots))
        return state, jax.tree.map(jnp.sum, ys)

    return run


def _numpy_slots_per_s(traces, params, slots: int) -> float:
    from envs.edge_numpy import EdgeEnvNumPy, consts_from_jax  # lazy: the reference is slow
    u = params.num_users
    cfg = dict(num_users=u, scheduler="threshold", num_servers=int(params.num_servers),
               tau_s=0.05, beta=0.02, lambda_s=0.0, mu=0.0, bandwidth_hz=20e6,
               arrival_rate_hz=float(params.arrival_rate_hz), initial_users=0,
               default_gain=0.05, max_wait_slots=20, rsd_threshold=0.7)
    ref = EdgeEnvNumPy(traces, cfg, consts_from_jax(params.latency))
    key = jax.random.key(0)
    noises = [jax.device_get(edge.draw_noise(k, params))
              for k in jax.random.split(key, 2 * slots + 1)]
    ref.reset(vars(noises[0]))
    rng = np.random.default_rng(0)
    for t in range(slots):   # warm-up: fill the cell
        ref.step(rng.random(u) < 0.3, np.full(u, 0.05), vars(noises[1 + t]))
    t0 = time.perf_counter()
    for t in range(slots):
        ref.step(rng.random(u) < 0.3, np.full(u, 0.05), vars(noises[1 + slots + t]))
    return slots / (time.perf_counter() - t0)


def run(users=DEFAULT_USERS, slots: int = 200, repeats: int = 3, numpy_users=(32, 128),
        problems: int = 256) -> dict:
    traces, _ = synthetic.generate("gsm8k", seed=0, problems=problems)
    rows = []
    for u in sorted(int(x) for x in users):
        params = _params(traces, u)
        fn = _runner(params, slots)
        _, state = edge.reset(jax.random.key(0), params)
        # the first call compiles and warms up (fills the cell); every timed call starts there
        _, ys, compile_s, med = time_repeats(fn, state, repeats, carry=False)
        done, batch, blocked = (float(v) for v in jax.device_get(ys))
        row = dict(num_users=u, num_servers=int(params.num_servers), slots_per_s=slots / med,
                   user_slots_per_s=u * slots / med, first_call_s=compile_s,
                   mean_batch=batch / slots, finished=done, blocked=blocked)
        if u in set(int(x) for x in numpy_users):
            row["numpy_slots_per_s"] = _numpy_slots_per_s(traces, params, slots)
            row["jax_over_numpy"] = row["slots_per_s"] / row["numpy_slots_per_s"]
        rows.append(row)
    base = rows[0]["user_slots_per_s"]
    for r in rows:
        r["per_user_ratio"] = base / r["user_slots_per_s"]
    return dict(rows=rows, slots=slots, repeats=repeats, pair="a100_orin_int4",
                traces=f"synthetic gsm8k ({problems} problems)", backend=jax.default_backend())


def table(res: dict) -> str:
    lines = ["| U | M | slots/s | user-slot steps/s | time/slot/user vs U=%d | JAX / NumPy | "
             "mean batch | blocked |" % res["rows"][0]["num_users"],
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        ratio = f"{r['jax_over_numpy']:.1f}×" if "jax_over_numpy" in r else "—"
        lines.append(f"| {r['num_users']} | {r['num_servers']} | {r['slots_per_s']:.0f} | "
                     f"{r['user_slots_per_s']:.3g} | {r['per_user_ratio']:.2f} | {ratio} | "
                     f"{r['mean_batch']:.0f} | {r['blocked']:.0f} |")
    return "\n".join(lines)


def _define_flags():
    flags.DEFINE_list("users", [str(u) for u in DEFAULT_USERS], "user slots U to measure.")
    flags.DEFINE_integer("slots", 200, "slots per timed call.", lower_bound=1)
    flags.DEFINE_integer("repeats", 3, "timed calls per U (median).", lower_bound=1)
    flags.DEFINE_list("numpy_users", ["32", "128"], "Us at which the NumPy reference runs too.")
    flags.DEFINE_string("json", None, "write the results here as JSON.")


def main(argv):
    """Checks every flag (``--json`` writable, U and the NumPy Us in range, the largest U's
    memory) before the run: bad input is one stderr line, exit 2, nothing written."""
    del argv
    F = flags.FLAGS
    if F.json:   # before the run, not after it (a folder or a bad parent lost the results)
        config_utils.check_output_file(F.json, "--json")
    try:
        users = [int(u) for u in F.users]
        numpy_users = [int(u) for u in F.numpy_users]
    except ValueError:
        raise BadInput(f"--users / --numpy_users: integers, got {F.users} / "
                       f"{F.numpy_users}") from None
    if not users or min(users) < 1 or max(users) > 1 << 20:
        raise BadInput(f"--users: integers in [1, 2^20], got {F.users}")
    stray = [u for u in numpy_users if u not in users]
    if stray:   # a U not measured would be silently skipped
        raise BadInput(f"--numpy_users: {stray[0]} is not one of --users ({F.users})")
    suite.check_fits(1, max(users), "--users")   # one env of the largest U at a time
    res = run(users, F.slots, F.repeats, numpy_users)
    print(table(res))
    save_json(F.json, res, indent=1)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
