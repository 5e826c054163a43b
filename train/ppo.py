"""Stage-1 PPO screening policy launcher.

    python -m train.ppo --config=train/configs/ppo.py[:variant] --workdir=DIR [--config.x=...]

Rerunning on an existing workdir resumes from its latest checkpoint. See docs/ppo.md.
``--helpconfig`` prints the resolved config. Exit codes (``prada_jax.cli``): 2 bad input (one
line naming the flag/field/file), 3 non-finite training, 1 a bug.
"""
from __future__ import annotations

from absl import app, flags, logging

from prada_jax import cli, config_utils

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so importing this module (tests, other
    launchers) never clashes with another launcher's ``--config`` / ``--workdir``."""
    from ml_collections import config_flags

    config_flags.DEFINE_config_file(
        "config", None, "Config file, e.g. train/configs/ppo.py:smoke", lock_config=True)
    flags.DEFINE_string("workdir", None, "Run directory (checkpoints, tb, config.json).")
    flags.DEFINE_integer(
        "max_chunks", None, "Stop after this many chunks in this invocation (resume later).")


def main(argv):
    config_utils.reject_extra_argv(argv)
    if FLAGS.config is None:
        raise app.UsageError("--config is required, e.g. --config=train/configs/ppo.py:smoke")
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    from prada_jax.rl import trainer

    # Bad input is reported before anything is logged or written (one stderr line, exit 2).
    trainer.validate_config(FLAGS.config)
    if FLAGS.config.env.get("trace_dir"):
        trainer.load_traces(FLAGS.config)
    logging.info(config_utils.runtime_info())

    result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                                        max_chunks=FLAGS.max_chunks)
    scal = result["scalars"][0]
    print(f"done: update {result['update_step']}, env steps {result['env_steps']}, "
          f"episode return {scal.get('train/episode_return', float('nan')):.4f}, "
          f"nominate rate {scal.get('train/nominate_rate', float('nan')):.3f}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
