"""``python -m studies.stage2_verdict``: the stage-2 verdict command (absl flags, input checks,
printing). The library (sizes, rows, pipeline; its docstring describes the outputs) is
:mod:`studies.stage2_verdict`; bad input raises ``BadInput`` and ``prada_jax.cli.run`` maps it to one
stderr line and exit 2.
"""
from __future__ import annotations

from pathlib import Path

from absl import flags

from envs import scenarios
from evals import suite
from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from prada_jax.traces import splits
from studies.stage2_verdict import check_budget, parse_dual_overrides, run, to_markdown
from studies.stage2_verdict import verdict


def _define_flags():
    flags.DEFINE_string("out", None, "Output folder (stage2.json, stage2.md, stage2.png).")
    flags.DEFINE_string("scenarios", "nominal,heavy,burst,diurnal,degraded",
                        "Comma-separated presets of envs.scenarios: "
                        f"{', '.join(scenarios.PRESETS)}.")
    flags.DEFINE_integer("seeds", None, "Evaluation seeds (default 8; --quick 2).")
    flags.DEFINE_integer("seed0", 0, "First evaluation seed, as an offset into the evaluated "
                         "split's seed range (e.g. 16 after a 16-seed run: fresh seeds for a "
                         "confirmation); the validation seeds the choices use do not move.")
    flags.DEFINE_bool("quick", False,
                      "Small sizes (a few minutes on 2 cores; numbers mean nothing).")
    flags.DEFINE_string("policy", None, "train.ppo run to use (default: train one under --out).")
    flags.DEFINE_enum("nominate_by", "actor", ["actor", "critic"],
                      "The policy nominates by its actor's greedy action or iff its critic's "
                      "ΔQ > 0 (prada_jax.rl.screen.screen_and_gain).")
    flags.DEFINE_string("dual_overrides", "", "config.dual fields for the learner, e.g. "
                        "'utilisation=0.5,mode=subgradient' (mode: constant pair only; use a "
                        "fresh --out: learned runs under it are reused).")
    flags.DEFINE_string("split", "test", "Part of the policy's trace set every row is "
                        "evaluated on (test, the default; the multipliers and the grid's "
                        "reference pair are chosen on validation).")
    flags.DEFINE_float("budget", None, "An operator's cap on the long-run average server "
                       "occupancy (busy units / M, in (0, 1]): the learners enforce it, the grid "
                       "reference is the best budget-feasible constant pair.")
    flags.DEFINE_integer("num_users", None, "User slots U of the evaluated env (default 32; "
                         "--quick 16).")
    flags.DEFINE_string("hardware", None, "(edge, server) hardware pair of the clock "
                        "(prada_jax.latency.PAIRS or a .json file; docs/latency.md). Default: "
                        "the --policy run's env.hardware (another pair than the policy's is "
                        "refused), else the configs' a100_orin_int4 (also for the policy "
                        "trained here).")
    flags.DEFINE_bool("report_only", False, "Train and evaluate nothing: rewrite --out's "
                      f"{verdict.TABLES_FILE} from its registered runs' JSON "
                      "(stage2_verdict_<run>.json, e.g. studies/stage2_verdict/results) and "
                      "print each scenario's verdict by the registered rules.")


def report_only(results: Path) -> None:
    """``--report_only``: the tables and the verdicts from the committed records."""
    if not results.is_dir():
        raise BadInput(f"--out={results}: no such folder (--report_only reads its records)")
    runs = verdict.read_runs(results)
    (results / verdict.TABLES_FILE).write_text(verdict.tables_markdown(runs))
    for run, scs in verdict.judge_runs(runs).items():
        for name, j in scs.items():
            print(f"{run}/{name}: {j['gate']}; " + ", ".join(
                f"{k} {v}" for k, v in j["targets"].items()))
    print(f"wrote {results / verdict.TABLES_FILE}")


def main(argv):
    """The command (``prada_jax.cli.run``): flags and a given ``--policy`` are checked before
    ``--out`` is created; bad input raises ``BadInput`` (one stderr line, exit 2)."""
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    config_utils.require_flag(F.out, "--out", "a folder for stage2.json")
    if F.report_only:
        report_only(Path(F.out))
        return
    names = scenarios.parse_names(F.scenarios)
    if F.seeds is not None and F.seeds < 2:
        raise BadInput(f"--seeds must be >= 2 (a CI needs two seeds), got {F.seeds}")
    if F.seed0 < 0:
        raise BadInput(f"--seed0 must be >= 0, got {F.seed0}")
    if F.num_users is not None and not 1 <= F.num_users <= suite.MAX_ENV_COUNT:
        raise BadInput(f"--num_users must lie in [1, {suite.MAX_ENV_COUNT}], "
                       f"got {F.num_users}")
    if F.policy and not Path(F.policy).is_dir():
        raise BadInput(f"--policy={F.policy}: no such run directory")
    out = config_utils.check_output_dir(F.out, "--out")   # a file, or under one: refused
    splits.check_split_name(F.split, "--split")
    if F.split == "validation":
        raise BadInput("--split=validation: the multipliers and the grid reference are chosen "
                       "on validation; report test (or train / all)")
    if F.budget is not None:
        check_budget(F.budget)
    if F.hardware is not None:
        suite.check_hardware(F.hardware, "--hardware")
    overrides = parse_dual_overrides(F.dual_overrides)
    result = run(out, names, seeds=F.seeds, quick=F.quick, policy_dir=F.policy,
                 num_users=F.num_users, nominate_by=F.nominate_by, dual_overrides=overrides, split=F.split,
                 budget=F.budget, seed0=F.seed0, hardware=F.hardware)
    print(to_markdown(result))
    print(f"wrote {Path(F.out) / 'stage2.json'}, stage2.md, stage2.png")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
