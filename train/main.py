"""The README's main job: ``python -m train.main --workdir=checkpoints/demo [--full | --smoke]``.

Runs the whole PRADA pipeline on the embedded **synthetic** traces and writes everything under
``--workdir`` (the parts are ``train.parts``; their sizes ``prada_jax/configs/main.py``):

1. ``traces/``      the three synthetic presets (gsm8k, gaokao2023en, mmlu_stem) and their
                    summary table (problems, nodes, steps, tokens, all-SLM / all-LLM accuracy,
                    PRM calibration AUC) — ``traces/summary.txt``;
2. ``ppo/``         the stage-1 screening policy (``prada_jax.rl.trainer``, orbax checkpoints,
                    TB); ``critic/`` the same actor with its critic refit on Monte-Carlo action
                    values of the final actor (``train.critic``;
                    ``critic_check.json``): the policy every later part uses (docs/ppo.md);
3. ``capacity/``    (``--smoke``, or ``--config.capacity_size``) capacity per server GPU under
                    issue 42's SLO (``studies.capacity`` at a small size, this policy as the
                    one sample); ``make demo``'s headline is PRADA's frontier, which it runs
                    next (``studies.frontier --size=demo``);
4. (``--full`` and ``--smoke``: the old scenario, docs/history.md) ``dual/`` the learned
                    multipliers λ_s, µ (what ``python -m train.dual`` runs, in this process);
                    ``curve/`` the load curve (``evals.curve``) against load λ/M on the test
                    split, which picks the two table points (``train.parts.tables.
                    table_points``); ``eval/`` the benchmark table at those points
                    (``uncontended/``, ``contended/``; mean ± 95% CI over seeds, with the
                    paper's All-LLM row); ``sweep/`` accuracy / latency / delay components
                    against M, B and λ, with the knees;
5. ``calibration/`` PRM calibration per benchmark (AUC, reliability diagram).

Stage 2's verdict (learned multipliers against λ_s = µ = 0, FIFO-greedy and the grid's best
pair on five scenarios) is no part here: it is its own study,
``python -m studies.stage2_verdict``.

Protocol (docs/evals.md): one generated trace set per benchmark, split by problem
(``prada_jax.traces.splits``): PPO trains on ``train``; the critic refit and the dual learner
(choices) use ``validation`` problems and validation seeds; every table reports ``test`` with
test seeds and prints which split it is.

Settings: ``prada_jax/configs/main.py``, its ``demo`` variant by default (gsm8k only, about 5 CPU
minutes); ``--full`` / ``--smoke`` are short for ``--config=prada_jax/configs/main.py:full`` /
``:smoke``; with ``--config`` given, ``--config.x=y`` sets one field (``--helpconfig`` prints
them all). ``--seeds`` sets every
evaluation's seeds (the load curve keeps at least ``curve.min_seeds``), ``--hardware`` the
clock's pair (``config.hardware``). Rerunning on the same workdir reuses every finished part
(a part is redone only if its settings changed; PPO and dual runs resume from their
checkpoints). Every number printed comes from synthetic traces and says so. Exit codes
(``prada_jax.cli``): 2 bad input, 3 non-finite training, 1 a bug.
"""
from __future__ import annotations

from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from evals import suite
from train.parts import cache, tables, training
from prada_jax import cli, config_utils, host_info
from prada_jax.configs import main as main_config

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so importing this module (tests, other
    launchers) never clashes with another launcher's ``--workdir``."""
    config_flags.DEFINE_config_file(
        "config", None, "Config file, e.g. prada_jax/configs/main.py:full (default: its demo "
        "variant; --full / --smoke name the others)", lock_config=True)
    flags.DEFINE_string("workdir", None, "Run directory for every part's outputs.")
    flags.DEFINE_bool("full", False, "The config's full variant: the three-benchmark study.")
    flags.DEFINE_bool("smoke", False, "The config's smoke variant: tiny sizes (tests).")
    flags.DEFINE_integer("seeds", None, "Evaluation seeds (default: the config's; demo 5).",
                         lower_bound=2)
    flags.DEFINE_bool("redo", False, "Redo every part even if it finished before.")
    flags.DEFINE_string("hardware", None, "(edge, server) hardware pair of the clock for every "
                        "part (prada_jax.latency.PAIRS or a .json file; docs/latency.md); "
                        "paper = the FLOP-only clock (default: config.hardware).")


def apply_seeds(config, seeds: int) -> None:
    """``--seeds``: every evaluation's seeds, the load curve's at least ``curve.min_seeds``."""
    config.eval.seeds = config.sweep.seeds = int(seeds)
    config.curve.seeds = max(int(seeds), config.curve.min_seeds)


def load_config():
    """``(config, hardware_flag)``: the config the flags name, with ``--seeds`` and
    ``--hardware`` applied; ``hardware_flag`` is what error messages about the pair name."""
    config = FLAGS.config
    mode = "full" if FLAGS.full else ("smoke" if FLAGS.smoke else "demo")
    if config is None:
        config = main_config.get_config(mode)
    elif mode != "demo":
        raise app.UsageError(f"--{mode} and --config exclude each other; name the variant "
                             f"in --config (prada_jax/configs/main.py:{mode})")
    if FLAGS.seeds is not None:
        apply_seeds(config, FLAGS.seeds)
    config_utils.check_int(config, "eval.seeds", "curve.seeds", "sweep.seeds", minimum=2)
    flag = "--config.hardware"
    if FLAGS.hardware is not None:
        config.hardware, flag = FLAGS.hardware, "--hardware"
    return config, flag


def run_pipeline(workdir: str | Path, config, redo: bool = False,
                 hardware_flag: str = "--config.hardware") -> dict:
    """Runs (or resumes) every part; returns a dict of where things are."""
    suite.check_hardware(config.hardware, hardware_flag)   # before anything is written
    training.check_envs(config, hardware_flag)
    workdir = config_utils.prepare_workdir(workdir)
    (workdir / "main_settings.json").write_text(config_utils.config_to_json(config) + "\n")
    log = cache.Log()
    log(f"train.main ({config.mode}) in {workdir}; all data below is SYNTHETIC")
    training.part_traces(workdir, config, log, redo)
    out = {"workdir": str(workdir), "benchmarks": {}}
    policy_dirs = {}
    for preset in config.benchmarks:
        ppo_dir = training.part_ppo(workdir, config, preset, log, redo)
        pol = training.part_critic(workdir, config, preset, ppo_dir, log, redo)
        policy_dirs[preset] = pol
        b = {"ppo": str(ppo_dir), "policy": str(pol), "dual": None, "curve": None,
             "eval": None, "sweep": None,
             "capacity": tables.part_capacity(workdir, config, preset, pol, log, redo)}
        if config.legacy_parts:   # the old scenario (docs/history.md)
            dual = training.part_dual(workdir, config, preset, pol, log, redo)
            cv = tables.part_curve(workdir, config, preset, pol, dual, log, redo)
            b.update(dual=str(dual), curve=cv,
                     eval=tables.part_eval(workdir, config, preset, pol, dual, log, redo,
                                            cv["points"]),
                     sweep=tables.part_sweep(workdir, config, preset, pol, dual, log, redo))
        out["benchmarks"][preset] = b
    out["calibration"] = tables.part_calibration(workdir, config, policy_dirs, log, redo)
    log("done")
    print_where(workdir, out)
    return out


def print_where(workdir: Path, out: dict) -> None:
    """The closing list: where each part's outputs are, and the headline lines again."""
    print()
    print("Where things are (all numbers from SYNTHETIC traces):")
    print(f"  trace summary:     {workdir / 'traces' / 'summary.txt'}")
    for preset, b in out["benchmarks"].items():
        print(f"  [{preset}] policy checkpoints: {Path(b['ppo']) / 'checkpoints'}")
        if b["policy"] != b["ppo"]:
            print(f"  [{preset}] refit critic:       {Path(b['policy'])} (critic_check.json; "
                  "the policy the later parts use)")
        if b["capacity"]:
            print(f"  [{preset}] capacity (headline): {b['capacity']['report']} "
                  f"(+ capacity_slo_*.png, curve_*.png, study.json)")
        if b["dual"]:
            print(f"  [{preset}] multipliers:        {b['dual']}")
        if b["curve"]:
            print(f"  [{preset}] load curve (old scenario): {workdir / 'curve' / preset}/"
                  "curve_*.png (+ curve.json per seed, curve.txt)")
        for name in (b["eval"] or {}).get("points", {}):
            print(f"  [{preset}] results table:      "
                  f"{workdir / 'eval' / preset / name / 'table.txt'} (+ results.json, "
                  f"results.csv, *.png; {b['eval'].get('split', '?')} split)")
        if b["sweep"]:
            print(f"  [{preset}] sweep figures:      {workdir / 'sweep' / preset}/*.png "
                  f"(knees in knees.txt)")
        for line in (b["curve"] or {}).get("lines", [])[-2:]:
            print(f"  [{preset}] {line}")
        for name, r in (b["eval"] or {}).get("points", {}).items():
            print(f"  [{preset}] {name}: {r['headline_text']}")
        if b["capacity"]:
            print(f"  [{preset}] " + b["capacity"]["text"].replace("\n", f"\n  [{preset}] "))
    print(f"  calibration:       {workdir / 'calibration'}")
    print(f"tensorboard --logdir {workdir}")


def main(argv):
    config_utils.reject_extra_argv(argv)
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required, e.g. --workdir=checkpoints/demo")
    if FLAGS.full and FLAGS.smoke:
        raise app.UsageError("--full and --smoke exclude each other")
    config, hardware_flag = load_config()
    # Library INFO logs (orbax's checkpoint manager in particular) are hidden by prada_jax.cli
    # unless --verbosity is given (--verbosity=0 brings them back).
    print(host_info.runtime_info(), flush=True)
    run_pipeline(FLAGS.workdir, config, FLAGS.redo, hardware_flag)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
