"""``python -m evals.calibration``: the PRM-calibration command (absl flags, input checks,
printing). The library (reliability, stress test) is :mod:`evals.calibration`; bad input
raises ``BadInput`` and ``prada_jax.cli.run`` maps it to one stderr line and exit 2.
"""
from __future__ import annotations

import sys
from pathlib import Path

from absl import flags
from ml_collections import config_flags

from evals.calibration import calibration_for, stress_test, stress_text, write_calibration
from prada_jax import cli, config_utils
from prada_jax.presets import BENCHMARKS


def _define_flags():
    flags.DEFINE_list("traces", list(BENCHMARKS),
                      "trace folders or synthetic presets (comma-separated).")
    flags.DEFINE_integer("problems", None, "problems per synthetic preset (default: full).")
    flags.DEFINE_integer("trace_seed", 0, "generator seed of the synthetic presets.")
    flags.DEFINE_string("out", "checkpoints/calibration", "output folder.")
    flags.DEFINE_enum("follow", "slm", ["slm", "llm"], "policy that continues a solution after "
                      "the labelled step.")
    flags.DEFINE_integer("bins", 10, "reliability bins.", lower_bound=1)
    flags.DEFINE_float("prm_miscalibration", 0.0, "m != 0 runs the stress test on the first "
                       "--traces preset (m > 0 over-confident, -1 < m < 0 under-confident).")
    flags.DEFINE_string("policy", None, "policy trained on the calibrated preset (reused by the "
                        "stress test instead of training one).")
    flags.DEFINE_integer("seeds", 5, "stress test: evaluation seeds.", lower_bound=2)
    flags.DEFINE_integer("slots", 1500, "stress test: slots per seed.", lower_bound=2)
    flags.DEFINE_integer("warmup_slots", 150, "stress test: warm-up slots.", lower_bound=0)
    config_flags.DEFINE_config_file("ppo_config",
                                    str(Path(__file__).resolve().parents[2] / "prada_jax" /
                                        "configs" / "ppo.py"),
                                    "stress test: PPO config for both trainings.",
                                    lock_config=True)


def main(argv):
    from evals import suite  # lazy: pulls in orbax, which defines absl flags

    FLAGS = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    out = config_utils.check_output_dir(FLAGS.out, "--out")   # before the work, not after
    if FLAGS.problems is not None and FLAGS.problems < 1:
        raise suite.EvalError(f"--problems={FLAGS.problems}: must be >= 1")
    if FLAGS.prm_miscalibration <= -1:
        raise suite.EvalError(f"--prm_miscalibration={FLAGS.prm_miscalibration}: must be > -1")
    if FLAGS.warmup_slots >= FLAGS.slots:
        raise suite.EvalError(f"--warmup_slots ({FLAGS.warmup_slots}) must be < --slots "
                              f"({FLAGS.slots})")
    if FLAGS.policy is not None:
        suite.load_policy(FLAGS.policy)      # checked before anything is written
    reports = calibration_for(FLAGS.traces, FLAGS.problems, FLAGS.trace_seed,
                              0 if FLAGS.follow == "slm" else 1, FLAGS.bins)
    res = write_calibration(reports, out)
    print(res["text"])
    print(f"reliability diagram: {res['figure']}")
    print(f"results: {res['json']}")
    if FLAGS.prm_miscalibration != 0.0:
        r = stress_test(FLAGS.traces[0], FLAGS.prm_miscalibration, FLAGS.ppo_config,
                        out / "stress", problems=FLAGS.problems,
                        trace_seed=FLAGS.trace_seed, seeds=FLAGS.seeds, slots=FLAGS.slots,
                        warmup_slots=FLAGS.warmup_slots, policy_dir=FLAGS.policy,
                        progress=lambda m: print(m, file=sys.stderr, flush=True))
        print(stress_text(r))
        print(f"stress test: {out / 'stress' / 'stress_test.json'}")
    print(f"tensorboard --logdir {out / 'tb'}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
