"""``python -m studies.stage2_pooled``: the pooled stage-2 verdict command (absl flags, input
checks, printing). The study's library, its outputs and rules are :mod:`studies.stage2_pooled`;
bad input raises ``BadInput`` and ``prada_jax.cli.run`` maps it to one stderr line and exit 2.
"""
from __future__ import annotations

from pathlib import Path

from absl import flags

from envs import scenarios
from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from studies.stage2_pooled import report_only, run_pooled, to_markdown


def _parse_indices(text: str) -> list[int]:
    try:
        return [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BadInput(f"--only_policies={text}: not a comma-separated list of integers") \
            from None


def _define_flags():
    flags.DEFINE_string("out", None, "Output folder (pooled.json, pooled.md, cells/).")
    flags.DEFINE_string("policies", None, "Comma-separated policy folders, >= 2 independently "
                        "trained samples (python -m train.policy_samples).")
    flags.DEFINE_integer("learner_seeds", 2, "Learner seeds per policy.")
    flags.DEFINE_string("scenarios", "slow_server", "Comma-separated presets of envs.scenarios: "
                        f"{', '.join(scenarios.PRESETS)}.")
    flags.DEFINE_integer("seeds", None, "Test seeds per (policy, learner seed) cell (default: "
                         "the size's).")
    flags.DEFINE_integer("seed0", 0, "Offset of the first cell's test seeds in the test range.")
    flags.DEFINE_bool("quick", False, "Small sizes (numbers mean nothing).")
    flags.DEFINE_float("budget", None, "Occupancy cap (busy units / M, in (0, 1]).")
    flags.DEFINE_float("budget_confidence", 0.9, "Share of validation seeds on which the "
                       "learned constant must keep the cap (within 2 %) for a margin to be "
                       "chosen.")
    flags.DEFINE_string("budget_margins", "0,0.05,0.1,0.2", "Margins δ tried (cap·(1 − δ)).")
    flags.DEFINE_integer("trace_seed", 0, "Generator seed of the verdict's gsm8k synthetic set.")
    flags.DEFINE_integer("problems", 0, "Problems of that set (0: the benchmark's count).")
    flags.DEFINE_integer("resamples", 10000, "Bootstrap resamples.")
    flags.DEFINE_string("only_policies", None, "Comma-separated indices into --policies: "
                        "run only their cells (no pooled.json; a later full run reuses every "
                        "finished cell whose cell.json matches).")
    flags.DEFINE_bool("report_only", False, "Train and evaluate nothing: recompute --out's "
                      "pooled.json verdict and pooled.md from its cells' stage2.json.")
    flags.DEFINE_string("hardware", None, "(edge, server) hardware pair of the clock in every "
                        "step (prada_jax.latency.PAIRS; default: the configs' a100_orin_int4); "
                        "every policy must have been trained under it.")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    config_utils.require_flag(F.out, "--out", "a folder for pooled.json")
    if F.report_only:
        print(to_markdown(report_only(F.out)))
        print(f"wrote {Path(F.out) / 'pooled.json'}, pooled.md")
        return
    if not F.policies:
        raise BadInput("--policies is required (>= 2 policy folders, comma-separated)")
    names = scenarios.parse_names(F.scenarios)
    dirs = [p.strip() for p in F.policies.split(",") if p.strip()]
    if F.seeds is not None and F.seeds < 2:
        raise BadInput(f"--seeds must be >= 2 (a CI needs two seeds), got {F.seeds}")
    if F.seed0 < 0:
        raise BadInput(f"--seed0 must be >= 0, got {F.seed0}")
    if F.resamples < 100:
        raise BadInput(f"--resamples must be >= 100, got {F.resamples}")
    tighten = None
    if F.budget is not None:
        try:
            margins = tuple(float(t) for t in F.budget_margins.split(",") if t.strip())
        except ValueError:
            raise BadInput(f"--budget_margins={F.budget_margins}: not numbers") from None
        if (not margins or min(margins) < 0 or max(margins) >= 1
                or not 0 < F.budget_confidence <= 1):
            raise BadInput(f"--budget_margins={F.budget_margins} / --budget_confidence="
                           f"{F.budget_confidence}: margins in [0, 1), confidence in (0, 1]")
        tighten = {"confidence": float(F.budget_confidence), "margins": margins}
    result = run_pooled(F.out, dirs, names, learner_seeds=F.learner_seeds, seeds=F.seeds,
                        size="quick" if F.quick else "full", budget=F.budget,
                        tighten=tighten, seed0=F.seed0, trace_seed=F.trace_seed,
                        problems=F.problems, resamples=F.resamples, hardware=F.hardware,
                        only_policies=None if F.only_policies is None else
                        _parse_indices(F.only_policies))
    if result is None:
        print(f"wrote the cells of --only_policies={F.only_policies} under "
              f"{Path(F.out) / 'cells'}")
        return
    print(to_markdown(result))
    print(f"wrote {Path(F.out) / 'pooled.json'}, pooled.md")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
