"""Stage-2 multiplier launcher: learns λ_s and µ for one scenario over edge-env rollouts.

    python -m train.dual --config=prada_jax/configs/dual.py[:variant] --workdir=DIR \
        [--policy=PPO_WORKDIR] [--config.env.num_servers=2 ...] [--max_chunks=N]

Without ``--policy`` (and an empty ``config.policy_dir``) nominations come from the privileged
trace rule of ``envs.stage2.make_trace_rule_policy`` (tests / smoke runs only).
Rerunning on an existing workdir resumes from its latest checkpoint. The training loop,
checkpoints, curves, ``multipliers.json`` and ``gap.json`` live in the library
``prada_jax.dual`` (``trainer.train_and_evaluate``), the env and nominations the config names
in ``envs.stage2``; this file only parses flags. Workdir
layout and measured numbers: docs/dual.md.

Flags are defined only when run as a program (``_define_flags``), so ``from train import dual``
defines none.

Exit codes (``prada_jax.cli``): 2 for a bad config field / flag / input file (one line naming
it), or a resume whose config changes a computational field (the message names it); 3 when a
logged value goes non-finite (the last good checkpoint is kept); 128 + N when stopped by signal
N (SIGINT/SIGTERM; a checkpoint is saved at the current chunk and a rerun continues); 1 a bug.
``--helpconfig`` prints the resolved config.
"""
from __future__ import annotations

import sys

from absl import flags

from prada_jax import cli, config_utils, runloop
from train import launcher

FLAGS = flags.FLAGS
CONFIG_FILE = "prada_jax/configs/dual.py"


def _define_flags() -> None:
    """Defined only when run as a program (``train.launcher``)."""
    launcher.define_config_and_workdir(CONFIG_FILE, "Run directory (checkpoints, tb, config.json).")
    flags.DEFINE_string("policy", None, "train.ppo workdir of the screening policy "
                        "(overrides config.policy_dir; omit for the trace rule).")
    flags.DEFINE_integer(
        "max_chunks", None, "Stop after this many chunks in this invocation (resume later).")


def _build_setup(config):
    """Checks the policy run folder (naming ``--policy`` or ``config.policy_dir``), then
    validates the config and loads traces and policy once and builds the env
    (``envs.stage2.build_setup``), before anything is written; each failure is one BadInput
    line. Returns the Setup for the trainer."""
    # The library imports orbax and chex, which define absl flags; importing train.dual
    # must define none (another absl program may import it).
    from envs.stage2 import build_setup  # lazy: see the comment above

    if config.policy_dir:
        flag = "--policy" if FLAGS.policy is not None else "config.policy_dir"
        config_utils.check_run_dir(config.policy_dir, flag,
                                   files=("config.json", "policy_meta.json"),
                                   kind="train.ppo run")
    return build_setup(config)


def main(argv):
    launcher.check_argv(argv, CONFIG_FILE)
    config = FLAGS.config
    if FLAGS.policy is not None:
        with config.unlocked():
            config.policy_dir = FLAGS.policy
    setup = _build_setup(config)
    from prada_jax.dual.trainer import summary_lines, train_and_evaluate  # lazy: see above

    result = train_and_evaluate(config, FLAGS.workdir, setup, max_chunks=FLAGS.max_chunks)
    for line in summary_lines(result):
        print(line)
    if result.get("stopped_by") in ("SIGINT", "SIGTERM"):
        sys.exit(runloop.exit_code_for(result["stopped_by"]))


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
