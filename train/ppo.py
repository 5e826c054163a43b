"""Stage-1 PPO screening policy launcher.

    python -m train.ppo --config=train/configs/ppo.py[:variant] --workdir=DIR [--config.x=...]

Rerunning on an existing workdir checks the config against the stored one, then resumes from
its newest intact checkpoint. Exit codes: 2 bad input, 3 non-finite training, 130/143 stopped
by SIGINT/SIGTERM (checkpoint saved). See docs/ppo.md.
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

    from prada_jax import errors, runloop
    try:
        result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                                            max_chunks=FLAGS.max_chunks)
    except (config_utils.ConfigError, errors.BadInput) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(errors.EXIT_BAD_INPUT)
    except errors.NonFiniteTraining as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(errors.EXIT_NON_FINITE)
    print(summary_line(result))
    if result["stopped_by"] in ("SIGINT", "SIGTERM"):
        sys.exit(runloop.exit_code_for(result["stopped_by"]))


def summary_line(result: dict) -> str:
    """One line: where the run stands and the last chunk's metrics (seed 0); a metric the
    chunk did not have (no finished episode) is left out, never printed as NaN."""
    scal = result["scalars"][0] if result["scalars"] else {}
    parts = [f"update {result['update_step']}", f"env steps {result['env_steps']}"]
    for tag, name, fmt in (("train/episode_return", "episode return", ".4f"),
                           ("train/nominate_rate", "nominate rate", ".3f")):
        if tag in scal:
            parts.append(f"{name} {scal[tag]:{fmt}}")
    stopped = result.get("stopped_by")
    if stopped in ("SIGINT", "SIGTERM"):
        head = f"stopped by {stopped}, checkpoint saved (rerun to continue)"
    elif result.get("finished") and result.get("start_update") == result["update_step"]:
        head = "already finished (nothing to do)"
    elif result.get("finished"):
        head = "done"
    else:
        head = "paused (rerun to continue)"
    return f"{head}: " + ", ".join(parts)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
