"""Stage-1 PPO screening policy launcher.

    python -m train.ppo --config=prada_jax/configs/ppo.py[:variant] --workdir=DIR [--config.x=...]

Rerunning on an existing workdir checks the config against the stored one, then resumes from
its newest intact checkpoint. ``--helpconfig`` prints the resolved config. Exit codes
(``prada_jax.cli``): 2 bad input (one line naming the flag/field/file), 3 non-finite training,
130/143 stopped by SIGINT/SIGTERM (checkpoint saved), 1 a bug. See docs/ppo.md.
"""
from __future__ import annotations

import sys

from absl import flags

from prada_jax import cli, runloop
from train import launcher

FLAGS = flags.FLAGS
CONFIG_FILE = "prada_jax/configs/ppo.py"


def _define_flags() -> None:
    """Defined only when run as a program (``train.launcher``)."""
    launcher.define_config_and_workdir(CONFIG_FILE, "Run directory (checkpoints, tb, config.json).")
    flags.DEFINE_integer(
        "max_chunks", None, "Stop after this many chunks in this invocation (resume later).")


def main(argv):
    launcher.check_argv(argv, CONFIG_FILE)
    from envs import stage1  # lazy: pulls in orbax and chex, which define absl flags
    from prada_jax.rl import trainer  # lazy: imports orbax too (as above)

    # Bad input is reported before anything is logged or written (one stderr line, exit 2):
    # the config is validated once, by build_setup, which builds the env the config names
    # (envs.stage1), and the Setup is handed to the trainer.
    setup = stage1.build_setup(FLAGS.config)
    # (the runtime line is logged by prada_jax.runloop once the run starts, after the resume
    # checks: a refused resume prints only its error line)

    result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir, setup,
                                        max_chunks=FLAGS.max_chunks)
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
    head = runloop.status_head(result.get("stopped_by"), bool(result.get("finished")),
                               result.get("start_update") == result["update_step"])
    return f"{head}: " + ", ".join(parts)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
