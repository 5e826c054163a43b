"""The preamble of the three training launchers (``train.ppo``, ``train.dual``,
``train.distill``): their ``--config`` / ``--workdir`` flags and the checks at the start of
``main``. Flags are defined only when a launcher runs as a program (its ``_define_flags``
calls ``define_config_and_workdir``), so importing a launcher never clashes with another
one's ``--config`` / ``--workdir``."""
from __future__ import annotations

from typing import Sequence

from absl import app, flags
from ml_collections import config_flags

from prada_jax import config_utils


def define_config_and_workdir(config_file: str, workdir_help: str) -> None:
    """``--config`` (``config_file`` with its variants, locked) and ``--workdir``."""
    config_flags.DEFINE_config_file(
        "config", None, f"Config file, e.g. {config_file}:smoke", lock_config=True)
    flags.DEFINE_string("workdir", None, workdir_help)


def check_argv(argv: Sequence[str], config_file: str) -> None:
    """No stray positional argument (exit 2 naming it), and ``--config`` and ``--workdir``
    given (``app.UsageError`` naming the flag)."""
    config_utils.reject_extra_argv(argv)
    if flags.FLAGS.config is None:
        raise app.UsageError(f"--config is required, e.g. --config={config_file}:smoke")
    if not flags.FLAGS.workdir:
        raise app.UsageError("--workdir is required")
