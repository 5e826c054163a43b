"""Duality gap of the learned threshold rule, measured against the exact slot oracle.

    python -m benchmarks.duality_gap --workdir=DUAL_WORKDIR [--slots=1000] [--envs=16]
        [--seed=1] [--env_chunks=5] [--out=FILE.json]

Rebuilds the run's scenario from ``<workdir>/config.json`` (traces, env, policy), loads its
multipliers (``multipliers.json``), rolls the env out with them until ``--slots`` slots with at
least one candidate are collected, and compares per slot the value of the hard threshold
decision (after its feasibility repair) with the oracle's optimum (enumeration ≤ 10 candidates,
else scipy MILP). Prints mean, 5th percentile and min of the per-slot ratio, the pooled ratio,
and the same for λ_s = µ = 0 on the same slots; writes JSON (default ``<workdir>/gap.json``).
The rule is the admission-price threshold rule (``prada_jax.sched.threshold``). Because
the per-slot oracle is myopic, it also rolls the env out for ``--env_chunks`` × 100 slots per
env with the run's multipliers and with λ_s = µ = 0 (same seed) and prints the long-run env
reward per slot, accuracy, latency, accuracy − β·latency and queue length of both, and of the
same policy with the FIFO-greedy scheduler (0 = skip).
"""
from __future__ import annotations

import time
from pathlib import Path

from absl import flags

from envs import stage2
from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from prada_jax.dual import files, gap as gap_lib
from prada_jax.dual.trainer import policy_key, validate_config
from prada_jax.traces.loader import load_config_traces


def _define(fv) -> None:
    flags.DEFINE_string("workdir", None, "a train.dual run directory (required)",
                        flag_values=fv)
    flags.DEFINE_integer("slots", 1000, "slots compared", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("envs", 16, "envs of the rollouts", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("seed", 1, "rollout seed", flag_values=fv)
    flags.DEFINE_integer("env_chunks", 5, "100-slot chunks per env of the long-run env "
                         "rollouts (0 = skip)", lower_bound=0, flag_values=fv)
    flags.DEFINE_string("out", "", "JSON output (default <workdir>/gap.json)", flag_values=fv)


def main(argv=None) -> int:
    """``argv``: absl flags (``--workdir=DIR``); None = the command line. Bad input raises
    ``errors.BadInput`` (exit 2 from the command line)."""
    a = cli.parse_local(_define, argv, "benchmarks.duality_gap", __doc__)
    if not a.workdir:
        raise BadInput("--workdir is required (a train.dual run directory)")
    wd = Path(a.workdir)
    config_utils.check_run_dir(wd, "--workdir", files=("config.json", "multipliers.json"),
                               checkpoints=False, kind="train.dual run")
    config = config_utils.read_config_json(wd)
    try:
        mult = files.load_multipliers(wd)
    except (FileNotFoundError, ValueError) as e:
        raise BadInput(f"--workdir={wd}: {e}") from None
    validate_config(config)
    stage2.validate_env_config(config)
    traces, trace_info = load_config_traces(config)
    env_params = stage2.build_env_params(config, traces)
    policy_fn, policy_info = stage2.build_policy(config, traces)
    t0 = time.perf_counter()
    gap = gap_lib.measure_gap(stage2.EDGE, env_params, policy_fn, mult, a.slots, a.envs, seed=a.seed,
                              policy_key=policy_key(policy_info), env_chunks=a.env_chunks)
    gap["wall_s"] = time.perf_counter() - t0
    gap["scenario"] = {"traces": trace_info, "policy": policy_info,
                       "num_servers": int(config.env.num_servers),
                       "bandwidth_hz": float(config.env.bandwidth_hz),
                       "arrival_rate_hz": float(config.env.arrival_rate_hz),
                       "num_users": int(config.env.num_users)}
    tag = " (synthetic traces)" if trace_info.get("synthetic") else ""
    rule = "admission price"
    print(f"multipliers: lambda_s {mult.lambda_s:.5f}, mu {mult.mu * 1e6:.5f} per MHz{tag}; "
          f"rule: {rule}")
    print(f"{gap['positive_slots']} of {gap['slots']} slots with a positive optimum "
          f"({gap['candidates_per_slot']:.2f} candidates/slot, {gap['milp_slots']} by MILP)")
    for pre, name in (("", "learned"), ("zero_", "lambda=mu=0")):
        print(f"  {name:12s} threshold/oracle: mean {gap[pre + 'mean']:.4f}  p5 "
              f"{gap[pre + 'p5']:.4f}  min {gap[pre + 'min']:.4f}  pooled "
              f"{gap[pre + 'pooled']:.4f}  infeasible {gap[pre + 'infeasible']}")
    for pre, name in (("", "learned"), ("zero_", "lambda=mu=0"), ("fifo_", "fifo_greedy")):
        if pre + "env" in gap:
            e = gap[pre + "env"]
            print(f"  {name:12s} env ({e['env_slots']} env-slots): reward/slot "
                  f"{e['reward_per_slot']:.4f}  accuracy {e['accuracy']:.4f}  latency "
                  f"{e['latency_s']:.3f} s  acc-beta*lat {e['objective']:.4f}  queue "
                  f"{e['queue_len']:.2f}  server {e['server_in_use']:.2f}")
    out = files.save_gap(Path(a.out) if a.out else wd / files.GAP_FILE, gap)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    cli.run_local(main)
