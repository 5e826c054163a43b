"""ReOPD distillation launcher.

    python -m train.distill --config=train/configs/distill.py[:variant] --workdir=DIR \
        [--kappa=0.6|auto] [--config.sampler.schedule=exact-ratio ...]

``--kappa=auto`` sets κ = exp(−c̄) from the student's mean per-turn gap c̄ to the teacher on
the pool (re-estimated every ``config.sampler.refresh_every`` updates); ``--kappa=<float>``
is the same as ``--config.sampler.kappa=<float>``.

Rerunning on an existing workdir resumes from its latest checkpoint. See docs/distill.md.
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
        "config", None, "Config file, e.g. train/configs/distill.py:smoke", lock_config=True)
    flags.DEFINE_string("workdir", None, "Run directory (checkpoints, tb, results).")
    flags.DEFINE_string(
        "kappa", None, "Turn-decay base: a number in (0, 1] (= --config.sampler.kappa) or "
        "'auto' (kappa = exp(-mean per-turn teacher-student gap), "
        "--config.sampler.schedule=auto).")


def apply_kappa_flag(config, value: str | None) -> None:
    """Applies ``--kappa`` (None = leave the config alone); bad values raise ConfigError."""
    if value is None:
        return
    if value.strip().lower() == "auto":
        config.sampler.schedule = "auto"
        return
    try:
        k = float(value)
    except ValueError:
        raise config_utils.ConfigError(
            f"--kappa must be a number in (0, 1] or 'auto', got {value!r}") from None
    if not (0.0 < k <= 1.0):
        raise config_utils.ConfigError(f"--kappa must lie in (0, 1], got {value!r}")
    config.sampler.kappa = k


def main(argv):
    config_utils.reject_extra_argv(argv)
    if FLAGS.config is None:
        raise app.UsageError("--config is required, e.g. --config=train/configs/distill.py")
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    logging.info(config_utils.runtime_info())
    from prada_jax.distill.loop import train_and_evaluate
    from prada_jax.distill.pool import PoolFormatError
    from prada_jax.distill.teacher_table import TeacherLogitsMismatch
    try:
        apply_kappa_flag(FLAGS.config, FLAGS.kappa)
        res = train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except (config_utils.ConfigError, PoolFormatError, TeacherLogitsMismatch,
            FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    before = res.get("before", {}).get("success_rate")
    after = res.get("after", {}).get("success_rate")
    print(f"task success (synthetic arithmetic): before {before} after {after}; "
          f"env calls during training {res['env_calls_during_training']}; "
          f"median update {res['update_s_median']:.4f} s")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
