"""Benchmark table of one scenario: ``python -m evals.run --policy=PPO_WORKDIR [--dual=DUAL_WORKDIR]
--traces=DIR_OR_PRESET --out=DIR [--seeds=5]``.

Evaluates All-SLM, All-LLM, random screening (matched offload rate), RSD (online PRM), the
screening policy without resource limits, PRADA with λ_s = µ = 0 and PRADA with the learned
multipliers (with ``--dual``), plus any ``--checkpoints``, on the multi-user edge env; prints
the table (mean ± 95% CI over seeds) and writes ``results.json``, ``results.csv``,
``table.txt``, bar charts and TensorBoard (``<out>/tb``). The table reports the test split
of the trace set by default and names it (``--split``; evaluation seeds from the test range,
``prada_jax.traces.splits``). See docs/evals.md.

``--dual`` multipliers learned for another scenario (U, M, B, λ, β, τ, schedule, benchmark or
policy, as recorded in ``multipliers.json``) are refused (exit 2, one line naming both
scenarios; ``evals.suite.check_scenario``) unless ``--allow_scenario_mismatch`` is given (then a
one-line warning). Exit codes as every command (``prada_jax.cli``): 2 bad input, 1 a bug.
"""
from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags, logging

from prada_jax import cli, config_utils, host_info

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program (``import evals.run`` defines none)."""
    from evals import command_flags  # lazy: pulls in orbax, which defines absl flags

    command_flags.define_input_flags()
    flags.DEFINE_string("out", None, "output folder (default: <policy>/eval, else "
                        "checkpoints/eval).")
    flags.DEFINE_integer("seeds", 5, "independent seeds (arrivals, problems, fading).",
                         lower_bound=1)
    flags.DEFINE_integer("seed0", 0, "first seed, an offset inside the split's seed range "
                         "(prada_jax.traces.splits).", lower_bound=0)
    flags.DEFINE_integer("slots", 2000, "slots simulated per seed.", lower_bound=2,
                         upper_bound=command_flags.MAX_SLOTS)
    flags.DEFINE_integer("warmup_slots", 200, "the measured window starts here: the users "
                         "arriving in [warmup_slots, slots) are measured.", lower_bound=0,
                         upper_bound=command_flags.MAX_SLOTS)
    flags.DEFINE_integer("drain_slots", 400, "slots run after the window; a measured user "
                         "unfinished drain_slots·τ after arriving counts as a failure.",
                         lower_bound=1, upper_bound=command_flags.MAX_SLOTS)
    flags.DEFINE_list("checkpoints", [], "extra train.ppo run directories to evaluate as PRADA "
                      "rows (same multipliers).")


def main(argv):
    from evals import command_flags, suite  # lazy: pulls in orbax, which defines absl flags

    config_utils.reject_extra_argv(argv)
    out = Path(FLAGS.out) if FLAGS.out else (Path(FLAGS.policy) / "eval" if FLAGS.policy
                                            else Path("checkpoints/eval"))
    config_utils.check_output_dir(out, "--out")   # before the evaluation, not after it
    if FLAGS.warmup_slots >= FLAGS.slots:
        raise app.UsageError(f"--warmup_slots ({FLAGS.warmup_slots}) must be < --slots "
                             f"({FLAGS.slots})")
    policy, mult, dual_info, traces, env_kw = command_flags.inputs_from_flags(FLAGS)
    # one row at a time, seeds vmapped; each seed keeps a [drain + 1] latency histogram
    suite.check_fits(FLAGS.seeds, env_kw["num_users"], drain_slots=FLAGS.drain_slots)
    extras = [suite.load_policy(p, flag="--checkpoints") for p in FLAGS.checkpoints]
    logging.info(host_info.runtime_info())
    for p in ([policy] if policy else []) + extras:
        logging.info("evaluating policy %s at update %s", p.workdir, p.meta.get("step"))
    per_seed, info = suite.evaluate_rows(
        traces, env_kw, policy=policy, multipliers=mult, seeds=FLAGS.seeds,
        slots=FLAGS.slots, warmup_slots=FLAGS.warmup_slots, extra_policies=extras,
        seed0=FLAGS.seed0, progress=lambda m: print(m, file=sys.stderr, flush=True),
        drain_slots=FLAGS.drain_slots)
    synthetic = traces.info.get("synthetic", False)
    title = (f"{traces.info['benchmark']}{' (SYNTHETIC traces)' if synthetic else ''}: "
             f"U={env_kw['num_users']} M={env_kw['num_servers']} "
             f"B={env_kw['bandwidth_hz'] / 1e6:g} MHz λ={env_kw['arrival_rate_hz']:g}/s, "
             f"{FLAGS.seeds} seeds, mean ± 95% CI, timeout {info['timeout_s']:g} s; "
             f"{info['split_label']}")
    meta = {"traces": traces.info, "policy": FLAGS.policy, "dual": FLAGS.dual,
            "policy_step": policy.meta.get("step") if policy else None,   # checkpoint evaluated
            "checkpoint_steps": {p.workdir: p.meta.get("step") for p in extras},
            "multipliers": {"lambda_s": mult[0], "mu_per_hz": mult[1]} if mult else None,
            "dual_info": dual_info, **info}
    res = suite.write_outputs(per_seed, out, title=title, meta=meta)
    print(res["table"])
    if res["headline_text"]:
        print(res["headline_text"])
    print(f"results: {res['json']}  {res['csv']}")
    print(f"figures: {', '.join(str(p) for p in res['figures'].values())}")
    print(f"tensorboard --logdir {res['tb']}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
