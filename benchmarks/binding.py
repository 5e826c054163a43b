"""Where a resource binds under a trained policy's own nominations, per scenario preset.

    python -m benchmarks.binding --policy=PPO_DIR [--scenarios=nominal,bandwidth_bound,...]
        [--seeds=3] [--slots=600] [--warmup=100] [--num_users=32] [--split=test]
        [--out=FILE.json]

For each ``envs.scenarios`` preset (with its own env scalars, ``scenarios.preset_env``, on top
of the stage-2 verdict's env: M = 1, 12 users/s, U = 32 unless overridden) it evaluates, on the
test split of the policy's trace set and test-range seeds (``--split=validation``: the
validation split and validation-range seeds, where presets and caps are chosen before a
verdict), the policy's greedy nominations
under the threshold rule at λ = µ = 0, FIFO-greedy and with no resource limits, and prints the
share of slots in which capacity binds (a request waits with all M_t units busy), in which
bandwidth binds (a request waits with a unit free), server utilisation and the headroom (no
limits − λ = µ = 0 objective) with its minimum detectable effect (paired t, 80% power) at the
seed count. All traces are SYNTHETIC. Exit 2 on bad input (one line naming the flag).
"""
from __future__ import annotations

import numpy as np
from absl import flags

from envs import edge, scenarios
from evals import evaluate as ev
from evals import suite
from prada_jax import cli, config_utils, stats
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json

_ROWS = (("PRADA (λ=µ=0)", "threshold", False), ("FIFO-greedy", "fifo_greedy", False),
         ("Policy (no limits)", "offload_all", True))
#: The stage-2 verdict's env (``studies.stage2_verdict.runner.SIZES``) the presets' overrides act on.
BASE_ENV = {"num_servers": 1, "arrival_rate_hz": 12.0}


def _define_flags():
    flags.DEFINE_string("policy", None, "train.ppo run directory (required).")
    flags.DEFINE_string("scenarios", "nominal,burst,degraded,bandwidth_bound,outage_burst,"
                        "slow_server", "comma-separated envs.scenarios presets.")
    flags.DEFINE_integer("seeds", 3, "test-range seeds.", lower_bound=2)
    flags.DEFINE_integer("slots", 600, "slots per seed.", lower_bound=2)
    flags.DEFINE_integer("warmup", 100, "slots discarded first.", lower_bound=0)
    flags.DEFINE_integer("num_users", 32, "user slots U.", lower_bound=1)
    flags.DEFINE_integer("scenario_length", 1200, "schedule length in slots.", lower_bound=1)
    flags.DEFINE_string("out", "", "JSON output (optional).")
    flags.DEFINE_string("split", "test", "test (default) or validation: the part of the "
                        "policy's trace set and the seed range measured.")


#: Splits a binding measurement may run on (``train`` would measure on training problems).
SPLITS = ("test", "validation")


def check_split(split: str, flag: str = "--split") -> str:
    """``split`` if it is one of :data:`SPLITS`, else ``BadInput`` naming ``flag``."""
    if split not in SPLITS:
        raise BadInput(f"{flag}={split!r}: must be one of {', '.join(SPLITS)}")
    return split


def measure(policy_dir: str, names, seeds: int, slots: int, warmup: int, num_users: int,
            scenario_length: int, log=print, split: str = "test") -> dict:
    """``{scenario: {"env": ..., "rows": {row: {metric: mean}}, "headroom", "mde"}}`` on the
    ``split`` part of the policy's trace set with that split's seed range."""
    policy = suite.load_policy(policy_dir)
    traces = suite.load_traces(policy.config.env.get("preset", "gsm8k"),
                               int(policy.config.env.get("problems", 0)) or None,
                               int(policy.config.env.trace_seed), split=check_split(split))
    suite.check_policy_traces(policy, traces)
    seed0 = suite.evaluation_seed0(traces.info, policy, seeds, flag="--seeds")
    base = suite.env_kwargs_from(policy.config, dict(BASE_ENV, num_users=num_users))
    out = {"meta": {"synthetic": True, "policy": policy_dir, "split": traces.info["split"],
                    "problems": traces.info["problems"], "seeds": [seed0, seed0 + seeds],
                    "slots": slots, "warmup": warmup}, "scenarios": {}}
    for name in names:
        env = dict(base, **scenarios.preset_env(name))
        args = {k: env[k] for k in ("num_users", "num_servers", "bandwidth_hz",
                                    "arrival_rate_hz", "beta", "tau_s")}
        params = edge.make_params(traces.traces, **args, **scenarios.latency_overrides(env),
                                  scenario=scenarios.preset(name, scenario_length))
        e = ev.Evaluator(params, seeds, slots, warmup, policy.apply_fn, policy.params,
                         seed0=seed0)
        per = {row: e.run(ev.PolicySpec(row, "policy", sched, unlimited=unl))
               for row, sched, unl in _ROWS}
        rows = {row: {k: float(np.nanmean(m[k])) for k in (
            "objective", "accuracy", "latency_mean_s", "server_util", "capacity_bound_share",
            "bandwidth_bound_share", "nomination_rate")} for row, m in per.items()}
        zero, nolim = per["PRADA (λ=µ=0)"]["objective"], per["Policy (no limits)"]["objective"]
        rec = {"env": env, "rows": rows,
               "headroom": float(np.nanmean(np.asarray(nolim) - np.asarray(zero))),
               "mde_headroom": stats.paired_mde(nolim, zero)}
        out["scenarios"][name] = rec
        z = rows["PRADA (λ=µ=0)"]
        log(f"{name:16s} M={env['num_servers']} B={env['bandwidth_hz'] / 1e6:g} MHz "
            f"speed={env.get('server_speed', 1.0):g}: λ=µ=0 util {z['server_util']:.3f}, "
            f"capacity binds {z['capacity_bound_share']:.3f}, bandwidth binds "
            f"{z['bandwidth_bound_share']:.3f} of slots; headroom {rec['headroom']:+.4f} "
            f"(MDE {rec['mde_headroom']:.4f}) [synthetic]")
    return out


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    if not F.policy:
        raise BadInput("--policy is required (a train.ppo run directory)")
    names = scenarios.parse_names(F.scenarios)
    if F.warmup >= F.slots:
        raise BadInput(f"--warmup={F.warmup} must be < --slots={F.slots}")
    check_split(F.split)
    res = measure(F.policy, names, F.seeds, F.slots, F.warmup, F.num_users, F.scenario_length,
                  split=F.split)
    if F.out:
        write_json(F.out, res, allow_nan=True)
        print(f"wrote {F.out}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
