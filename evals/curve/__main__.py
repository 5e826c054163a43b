"""``python -m evals.curve``: the load curve command (absl flags, input checks, printing).

    python -m evals.curve --policy=PPO_WORKDIR [--dual=DUAL_WORKDIR] [--pairs=paper]
        [--loads=0.25,0.5,1,2,4,8] [--seeds=8] [--out=DIR]

For each hardware pair of ``--pairs`` runs every (row, load) point of :mod:`evals.curve` in
one vmapped evaluation and writes ``curve.json`` (per seed), ``curve_<pair>.png`` (a pair
file by its stem, ``curve.pair_tags``), ``curve.txt`` and TensorBoard under ``--out``; prints
each point (ρ and flags per row) and the crossover. Load = λ/M, arrivals per second per
server sequence slot. Bad input (a flag, a folder, a pair): one stderr line naming it, exit 2,
nothing written.
"""
from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from envs import edge
from evals import command_flags, curve
from evals import evaluate as ev
from evals import suite
from evals.sweep import parse_grid
from prada_jax import cli, config_utils
from prada_jax import latency as lat
from prada_jax.errors import BadInput

DEFAULT_LOADS = [0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0]


def _define_flags():
    command_flags.define_input_flags(env_note=" (the curve varies λ = load · M)")
    flags.DEFINE_string("out", None, "output folder (default: <policy>/curve, else "
                        "checkpoints/curve).")
    flags.DEFINE_list("pairs", [lat.CONFIG_PAIR], "hardware pairs (edge, server) to draw a "
                      "curve for (prada_jax.latency.PAIRS or .json files; docs/latency.md).")
    flags.DEFINE_list("loads", [f"{x:g}" for x in DEFAULT_LOADS],
                      "loads λ/M in arrivals/s per server sequence slot.")
    command_flags.define_window_flags(8, "seeds per point (a crossover needs >= 8).", slots=2000,
                              warmup_slots=200)


def _pair_params(traces, env_kw: dict, pair: str):
    """Env params of one hardware pair (``env_kw['hardware']`` set to it)."""
    return edge.make_params(traces, **dict(env_kw, hardware=pair))


def main(argv):
    FLAGS = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    loads = parse_grid(FLAGS.loads, "loads")
    if FLAGS.warmup_slots >= FLAGS.slots:
        raise BadInput(f"--warmup_slots ({FLAGS.warmup_slots}) must be < --slots "
                       f"({FLAGS.slots})")
    pairs = list(dict.fromkeys(FLAGS.pairs))
    if not pairs:
        raise BadInput("--pairs: empty list")
    for pair in pairs:
        suite.check_hardware(pair, "--pairs")
    curve.pair_tags(pairs)   # two pair files drawn under one name: refused now, not at the end
    suite.check_server_model_applies(FLAGS.server_model, pairs, "--pairs")
    policy, mult, _, traces, env_kw = command_flags.inputs_from_flags(FLAGS)
    if FLAGS.num_users is None and env_kw.get("server_model") == "serving" and all(
            p != lat.PAPER for p in pairs):
        # Size the population from the largest arrival rate and the timeout (the worst
        # latency a measured user has), not by hand; a point that still blocks is flagged.
        worst = FLAGS.drain_slots * float(env_kw.get("tau_s", 0.05))
        env_kw["num_users"] = suite.users_for(max(loads) * env_kw["num_servers"], worst)
        print(f"note: U = {env_kw['num_users']} user slots, sized for λ = "
              f"{max(loads) * env_kw['num_servers']:g}/s and a {worst:g} s timeout "
              "(--num_users overrides)", file=sys.stderr, flush=True)
        if env_kw["num_users"] > suite.MAX_ENV_COUNT:
            raise BadInput(f"--loads: the largest load needs U = {env_kw['num_users']} user "
                           f"slots (more than {suite.MAX_ENV_COUNT}); pass --num_users")
    if policy is None:
        raise BadInput("--policy: the curve's PRADA row needs a train.ppo run directory")
    # rows × loads × seeds in one vmapped evaluation
    suite.check_fits(len(curve.curve_rows(mult)) * len(loads) * FLAGS.seeds,
                     env_kw["num_users"], drain_slots=FLAGS.drain_slots)
    out = config_utils.check_output_dir(   # before the evaluation, not after it
        Path(FLAGS.out) if FLAGS.out else Path(FLAGS.policy) / "curve", "--out")
    seed0 = suite.evaluation_seed0(traces.info, policy, FLAGS.seeds, 0, flag="--seeds")
    # every pair's env (M against its server's KV memory included) before any evaluation
    params_of = {}
    for pair in pairs:
        try:
            params_of[pair] = _pair_params(traces.traces, env_kw, pair)
        except BadInput as e:
            raise BadInput(f"--pairs={pair}: {e}") from None
    rows = curve.curve_rows(mult)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    results = {}
    for pair in pairs:
        params = params_of[pair]
        e = ev.Evaluator(params, FLAGS.seeds, FLAGS.slots, FLAGS.warmup_slots, policy.apply_fn,
                         policy.params, seed0=seed0, drain_slots=FLAGS.drain_slots)
        say(f"curve [{pair}]: {len(rows)} rows x {len(loads)} loads x {FLAGS.seeds} seeds, "
            "one evaluation")
        results[pair] = curve.run_curve(e, rows, loads)
    synthetic = traces.info.get("synthetic", False)
    label = suite.split_label(traces.info, policy)
    timeout = FLAGS.drain_slots * float(env_kw.get("tau_s", 0.05))
    title = (f"{traces.info['benchmark']}{' (SYNTHETIC traces)' if synthetic else ''}, U="
             f"{env_kw['num_users']} M={env_kw['num_servers']} B="
             f"{env_kw['bandwidth_hz'] / 1e6:g} MHz β={env_kw['beta']:g}, {FLAGS.seeds} seeds, "
             f"mean ± 95% CI, timeout {timeout:g} s; {label}")
    meta = {"traces": traces.info, "env": env_kw, "policy": FLAGS.policy, "dual": FLAGS.dual,
            "multipliers": mult, "seeds": FLAGS.seeds, "slots": FLAGS.slots,
            "warmup_slots": FLAGS.warmup_slots, "drain_slots": FLAGS.drain_slots,
            "timeout_s": timeout, "pairs": pairs, "loads": loads,
            "split": traces.info.get("split"), "split_label": label,
            "eval_seed_range": [seed0, seed0 + FLAGS.seeds], "synthetic": synthetic}
    res = curve.write_curve_outputs(results, out, title=title, meta=meta)
    tag = " [synthetic traces]" if synthetic else ""
    for line in res["lines"]:
        print(line + tag)
    print(f"figures: {', '.join(str(p) for p in res['figures'].values())}")
    print(f"results: {res['json']}")
    print(f"tensorboard --logdir {res['tb']}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
