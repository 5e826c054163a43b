"""``python -m evals.open_loop_bound``: the clairvoyant open-loop bound on one replayed stream.

One env (synthetic gsm8k traces, the privileged trace-rule nominations of
``envs.stage2.make_trace_rule_policy(0)``, M = 1 server unit, the chosen
scenario preset) runs the threshold rule with constant (λ_s, µ = 0) for ``--slots`` slots; its
new nominations become a stream (``prada_jax.dual.stream.stream_from_rollout``), valued
in ``prada_jax.sched.clairvoyant``'s open-loop model with wait cost β·τ per slot. Prints one line per schedule: the
rule that ran (``rollout_plan``), the causal greedy reference, and the clairvoyant MILP bound
[PRM units, synthetic]. Bad flags: one stderr line, exit 2 (``prada_jax.cli.run``).
"""
from __future__ import annotations

import time

import jax
from absl import flags

from envs import edge, scenarios, stage2
from evals import suite
from prada_jax import cli, config_utils
from prada_jax.dual.problem import Multipliers
from prada_jax.dual.rollout import fixed_prices, init_rollout, make_rollout
from prada_jax.dual.stream import rollout_plan, stream_from_rollout
from prada_jax.errors import BadInput
from prada_jax.sched import clairvoyant as cv


def measure(slots: int = 300, num_users: int = 16, scenario: str = "burst",
            lambda_s: float = 0.0, seed: int = 0, log=print) -> dict:
    """Runs the rollout and the three schedules; returns their values [PRM units] and sizes."""
    traces = suite.load_traces("gsm8k", 60, 1000).traces
    params = edge.make_params(traces, num_users=num_users, num_servers=1, bandwidth_hz=20e6,
                              arrival_rate_hz=12.0, beta=0.05, tau_s=0.05,
                              scenario=scenarios.preset(scenario, slots))
    roll = jax.jit(make_rollout(stage2.EDGE, stage2.make_trace_rule_policy(0.0), slots))
    carry = init_rollout(stage2.EDGE, jax.random.key(seed), params, 1,
                         lambda _: fixed_prices(Multipliers(lambda_s, 0.0)))
    _, out = roll(carry, params)
    s = stream_from_rollout(out)
    wc = float(params.beta * params.tau_s)
    res = {"requests": int(len(s.arrival)), "wait_cost": wc,
           "window": cv.default_window(s, wc), "service_mean_slots": float(s.service.mean())}
    t0 = time.perf_counter()
    for name, plan in (("rule", rollout_plan(s, out, wc)), ("greedy", cv.greedy_online(s, wc)),
                       ("bound", cv.clairvoyant_bound(s, wc, time_limit_s=300))):
        res[name] = {"value": plan.value, "served": int((plan.start >= 0).sum()),
                     "feasible": cv.is_feasible(s, plan.start)}
        log(f"{name:6s} value={plan.value:.3f} PRM units (synthetic) served={res[name]['served']}"
            f"/{res['requests']} feasible={res[name]['feasible']}")
    res["solve_s"] = time.perf_counter() - t0
    return res


def _define_flags():
    flags.DEFINE_integer("slots", 300, "Horizon T [slots].")
    flags.DEFINE_integer("num_users", 16, "User slots U.")
    flags.DEFINE_string("scenario", "burst", "A preset of envs.scenarios.")
    flags.DEFINE_float("lambda_s", 0.0, "Constant admission price λ_s [PRM units] (µ = 0).")
    flags.DEFINE_integer("seed", 0, "Rollout seed.")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    if F.slots < 1 or F.num_users < 1:
        raise BadInput("--slots and --num_users must be >= 1")
    if not F.lambda_s >= 0:
        raise BadInput(f"--lambda_s must be >= 0, got {F.lambda_s}")
    scenarios.parse_names(F.scenario, flag="--scenario")
    r = measure(F.slots, F.num_users, F.scenario, F.lambda_s, F.seed)
    print(f"T={F.slots} U={F.num_users} scenario={F.scenario} lambda_s={F.lambda_s} "
          f"requests={r['requests']} wait_cost={r['wait_cost']:.4g} W={r['window']} "
          f"mean k={r['service_mean_slots']:.2f} slots")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
