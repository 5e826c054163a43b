"""Stage-1 PPO screening policy launcher.

    python -m train.ppo --config=train/configs/ppo.py[:variant] --workdir=DIR [--config.x=...]

Rerunning on an existing workdir resumes from its latest checkpoint. See docs/ppo.md.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags, logging  # noqa: E402
from prada_jax import config_utils  # noqa: E402

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
    logging.info(config_utils.runtime_info())
    from prada_jax.rl import trainer

    try:
        result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                                            max_chunks=FLAGS.max_chunks)
    except config_utils.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except trainer.NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(3)
    scal = result["scalars"][0]
    print(f"done: update {result['update_step']}, env steps {result['env_steps']}, "
          f"episode return {scal.get('train/episode_return', float('nan')):.4f}, "
          f"nominate rate {scal.get('train/nominate_rate', float('nan')):.3f}")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
