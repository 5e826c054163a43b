"""``python -m evals.sweep``: the resource-sweep command (absl flags, input checks, printing).

The library (rows, sweeps, figures, the module docstring with the flags' meaning) is
:mod:`evals.sweep`; bad input raises ``BadInput`` and ``prada_jax.cli.run`` maps it to one
stderr line and exit 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from envs import edge
from evals import command_flags
from evals import evaluate as ev
from evals import suite
from evals.sweep import (AXES, DEFAULT_GRIDS, parse_grid, run_sweep, sweep_rows,
                         write_sweep_outputs)
from prada_jax import cli, config_utils
from prada_jax.errors import BadInput


def _define_flags():
    command_flags.define_input_flags(env_note=" when not swept")
    flags.DEFINE_string("out", None, "output folder (default: <policy>/sweep, else "
                        "checkpoints/sweep).")
    command_flags.define_window_flags(3, "seeds per grid point.", slots=1500, warmup_slots=150)
    flags.DEFINE_list("axes", ["M", "B", "lam"], "axes to sweep (M, B, lam).")
    flags.DEFINE_list("m_grid", [str(x) for x in DEFAULT_GRIDS["M"]], "M values (integers).")
    flags.DEFINE_list("b_grid_mhz", [f"{x / 1e6:g}" for x in DEFAULT_GRIDS["B"]],
                      "B values in MHz.")
    flags.DEFINE_list("lam_grid", [f"{x:g}" for x in DEFAULT_GRIDS["lam"]],
                      "λ values in users/s.")


def main(argv):
    FLAGS = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    out = Path(FLAGS.out) if FLAGS.out else (Path(FLAGS.policy) / "sweep" if FLAGS.policy
                                            else Path("checkpoints/sweep"))
    config_utils.check_output_dir(out, "--out")   # before the sweep, not after it
    grids = {"M": parse_grid(FLAGS.m_grid, "m_grid", integer=True),
             "B": parse_grid(FLAGS.b_grid_mhz, "b_grid_mhz", 1e6),
             "lam": parse_grid(FLAGS.lam_grid, "lam_grid")}
    if not FLAGS.axes:
        raise BadInput("--axes: empty; choose from M, B, lam")
    bad = [a for a in FLAGS.axes if a not in AXES]
    if bad:
        raise BadInput(f"--axes: unknown axis {bad[0]!r} (choose from M, B, lam)")
    if FLAGS.warmup_slots >= FLAGS.slots:
        raise BadInput(f"--warmup_slots ({FLAGS.warmup_slots}) must be < --slots "
                       f"({FLAGS.slots})")
    policy, mult, _, traces, env_kw = command_flags.inputs_from_flags(FLAGS)
    # one row at a time, seeds vmapped; each seed keeps a [drain + 1] latency histogram
    suite.check_fits(FLAGS.seeds, env_kw["num_users"], drain_slots=FLAGS.drain_slots)
    if "M" in FLAGS.axes:   # every M of the grid against the server's KV memory, up front
        probe = edge.make_params(traces.traces, **env_kw)
        try:
            edge.check_num_servers(probe.latency, traces.traces, int(max(grids["M"])),
                                   env_kw.get("hardware", ""),
                                   server_model=probe.server_model, path=probe.llm_path)
        except BadInput as e:
            raise BadInput(f"--m_grid: {e}") from None
    if "M" in FLAGS.axes and max(grids["M"]) > env_kw["num_users"]:
        print(f"note: M values above U={env_kw['num_users']} cannot be used at once",
              file=sys.stderr)
    seed0 = suite.evaluation_seed0(traces.info, policy, FLAGS.seeds, 0, flag="--seeds")
    params = edge.make_params(traces.traces, **env_kw)
    evaluator = ev.Evaluator(params, FLAGS.seeds, FLAGS.slots, FLAGS.warmup_slots,
                             policy.apply_fn if policy else None,
                             policy.params if policy else None, seed0=seed0,
                             drain_slots=FLAGS.drain_slots)
    rows = sweep_rows(policy is not None, mult)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    results = {a: run_sweep(evaluator, rows, a, grids[a], say) for a in FLAGS.axes}
    synthetic = traces.info.get("synthetic", False)
    label = suite.split_label(traces.info, policy)
    title = (f"{traces.info['benchmark']}{' (SYNTHETIC)' if synthetic else ''}, U="
             f"{env_kw['num_users']}, {FLAGS.seeds} seeds, mean ± 95% CI; {label}")
    meta = {"traces": traces.info, "env": env_kw, "policy": FLAGS.policy, "dual": FLAGS.dual,
            "multipliers": mult, "seeds": FLAGS.seeds, "slots": FLAGS.slots,
            "warmup_slots": FLAGS.warmup_slots, "drain_slots": FLAGS.drain_slots,
            "split": traces.info.get("split"),
            "split_label": label, "eval_seed_range": [seed0, seed0 + FLAGS.seeds]}
    res = write_sweep_outputs(results, out, title=title, meta=meta)
    for line in res["knee_lines"]:
        print(line + (" [synthetic traces]" if synthetic else ""))
    print(f"figures: {out}/*.png ({len(res['figures'])} files)")
    print(f"results: {res['json']}  {res['csv']}")
    print(f"tensorboard --logdir {res['tb']}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
