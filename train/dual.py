"""Stage-2 multiplier launcher: learns λ_s and µ for one scenario over edge-env rollouts.

    python -m train.dual --config=train/configs/dual.py[:variant] --workdir=DIR \
        [--policy=PPO_WORKDIR] [--config.env.num_servers=2 ...] [--max_chunks=N]

Without ``--policy`` (and an empty ``config.policy_dir``) nominations come from the privileged
trace rule of ``prada_jax.dual_rollout.make_trace_rule_policy`` (tests / smoke runs only). Rerunning on
an existing workdir resumes from its latest checkpoint. The training loop, checkpoints, curves,
``multipliers.json`` and ``gap.json`` live in the library ``prada_jax.dual_train``; this file
only parses flags. Workdir layout and measured numbers: docs/dual.md.

Flags are defined only when run as a program (``_define_flags``), so ``from train import dual``
defines none. The library names are re-exported here for older callers; new code imports
``prada_jax.dual_train``. ``load_multipliers(workdir) -> Multipliers(lambda_s, mu)`` is the
export for evaluation.

Exit codes (``prada_jax.cli``): 2 for a bad config field / flag / input file (one line naming
it), or a resume whose config changes a computational field (the message names it); 3 when a
logged value goes non-finite (the last good checkpoint is kept); 128 + N when stopped by signal
N (SIGINT/SIGTERM; a checkpoint is saved at the current chunk and a rerun continues); 1 a bug.
``--helpconfig`` prints the resolved config.
"""
from __future__ import annotations

import sys

from absl import app, flags

from prada_jax import cli, config_utils
from prada_jax.dual_train import (  # noqa: F401  (re-exports for older callers)
    GAP_FILE, NonFiniteError, build_env_params, build_policy, collect_slots, load_multipliers,
    load_traces, measure_gap, threshold_decisions, train_and_evaluate, validate_config)

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so importing this module (tests, other
    launchers) never clashes with another launcher's ``--config`` / ``--workdir``."""
    from ml_collections import config_flags

    config_flags.DEFINE_config_file(
        "config", None, "Config file, e.g. train/configs/dual.py:smoke", lock_config=True)
    flags.DEFINE_string("workdir", None, "Run directory (checkpoints, tb, config.json).")
    flags.DEFINE_string("policy", None, "train.ppo workdir of the screening policy "
                        "(overrides config.policy_dir; omit for the trace rule).")
    flags.DEFINE_integer(
        "max_chunks", None, "Stop after this many chunks in this invocation (resume later).")


def _check_inputs(config) -> None:
    """Validates the config, the trace folder and the policy run before anything is written
    (the library writes ``config.json`` first); each failure is one BadInput line."""
    validate_config(config)
    if config.env.get("trace_dir"):
        load_traces(config)
    if config.policy_dir:
        flag = "--policy" if FLAGS.policy is not None else "config.policy_dir"
        config_utils.check_run_dir(config.policy_dir, flag,
                                   files=("config.json", "policy_meta.json"),
                                   kind="train.ppo run")


def main(argv):
    config_utils.reject_extra_argv(argv)
    if FLAGS.config is None:
        raise app.UsageError("--config is required, e.g. --config=train/configs/dual.py:smoke")
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    config = FLAGS.config
    if FLAGS.policy is not None:
        with config.unlocked():
            config.policy_dir = FLAGS.policy
    _check_inputs(config)
    # (the runtime line is logged by prada_jax.runloop once the run starts, after the resume
    # checks: a refused resume prints only its error line)
    from prada_jax import runloop
    result = train_and_evaluate(config, FLAGS.workdir, max_chunks=FLAGS.max_chunks)
    m = result["multipliers"]
    stopped = result.get("stopped_by")
    head = runloop.status_head(stopped, bool(result.get("finished")),
                               result.get("start_chunk") == result["chunk"])
    print(f"{head}: chunk {result['chunk']}, lambda_s {m.lambda_s:.5f} PRM units/server unit, "
          f"mu {m.mu * 1e6:.5f} PRM units/MHz")
    if stopped in ("SIGINT", "SIGTERM"):
        sys.exit(runloop.exit_code_for(stopped))
    if "gap" in result:
        g = result["gap"]
        print(f"duality gap (threshold/oracle value, {g['positive_slots']} slots): mean "
              f"{g['mean']:.4f}, p5 {g['p5']:.4f}; with lambda=mu=0: mean {g['zero_mean']:.4f}, "
              f"p5 {g['zero_p5']:.4f}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
