"""ReOPD distillation launcher.

    python -m train.distill --config=prada_jax/configs/distill.py[:variant] --workdir=DIR \
        [--kappa=0.6|auto] [--config.sampler.schedule=exact-ratio ...]

``--kappa=auto`` sets κ = exp(−c̄) from the student's mean per-turn gap c̄ to the teacher on
the pool (re-estimated every ``config.sampler.refresh_every`` updates); ``--kappa=<float>``
is the same as ``--config.sampler.kappa=<float>``.

Rerunning on an existing workdir resumes from its latest checkpoint (the config is checked
against the stored one first); a finished workdir prints its final metrics. ``--helpconfig``
prints the resolved config. Exit codes (``prada_jax.cli``): 2 bad input (one line naming the
flag/field/file), 3 non-finite training, 130/143 stopped by SIGINT/SIGTERM (checkpointed), 1 a
bug. See docs/distill.md.
"""
from __future__ import annotations

import sys

from absl import flags

from prada_jax import cli, config_utils, runloop
from train import launcher

FLAGS = flags.FLAGS
CONFIG_FILE = "prada_jax/configs/distill.py"


def _define_flags() -> None:
    """Defined only when run as a program (``train.launcher``)."""
    launcher.define_config_and_workdir(CONFIG_FILE, "Run directory (checkpoints, tb, results).")
    flags.DEFINE_string(
        "kappa", None, "Turn-decay base: a number in (0, 1] (= --config.sampler.kappa) or "
        "'auto' (kappa = exp(-mean per-turn teacher-student gap), "
        "--config.sampler.schedule=auto).")
    flags.DEFINE_integer("max_steps", None,
                         "Stop after this many updates in this invocation (resume later).")


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


def summary_line(res: dict) -> str:
    """One line with the run's final metrics (task success before/after, env calls, update
    time); never prints NaN: missing values say so."""
    def rate(key):
        v = (res.get(key) or {}).get("success_rate")
        return "n/a" if v is None else f"{v:.3f}"
    upd = res.get("update_s_median")
    upd = "n/a" if upd is None else f"{upd:.4f} s"
    if "per_seed" in res:   # config.train.num_seeds > 1: mean ± 95% CI over the seeds
        def ci(key):
            c = res.get(key)
            if not c or c.get("mean") is None:
                return "n/a"
            half = c.get("ci_half_width")
            return f"{c['mean']:.3f}" + ("" if half is None else f" ± {half:.3f}")
        return (f"{res['num_seeds']} seeds {res['seeds'][0]}..{res['seeds'][-1]}: task success "
                f"(mean ± 95% CI) before {ci('success_before')} after {ci('success_after')}; "
                f"env calls during training {res.get('env_calls_during_training', 'n/a')}; "
                f"median update (all seeds) {upd}")
    return (f"task success: before {rate('before')} after {rate('after')}; env calls during "
            f"training {res.get('env_calls_during_training', 'n/a')}; median update {upd}")


def gate_line(gate: dict) -> str:
    """One line on the gate (``config.gate``): reached at which update, or "gate not reached"
    with the last check, within the budget."""
    want = f"success >= {gate['success_min']:g} and per-turn gap <= {gate['gap_max']:g} nats"
    if gate.get("reached"):
        return f"gate reached at update {gate['step']} ({want})"
    last = gate["checks"][-1] if gate.get("checks") else None
    seen = ("no check ran" if last is None else
            f"last check at update {last['step']}: success {last['success_rate']:.3f}, gap "
            + ("n/a" if last["mean_gap"] is None else f"{last['mean_gap']:.3f}"))
    return (f"gate not reached within {gate['budget_updates']} updates ({want}; {seen}); the "
            "student is saved as trained")


def main(argv):
    cli.hub_offline()
    launcher.check_argv(argv, CONFIG_FILE)
    apply_kappa_flag(FLAGS.config, FLAGS.kappa)
    # The trainer imports transformers (after hub_offline above), orbax and chex (absl flags).
    # lazy: see the line above
    from prada_jax.distill.trainer import build_setup, check_stored_run, train_and_evaluate

    # Bad input is reported before anything is logged or written (one stderr line, exit 2):
    # the stored run first (a refused resume or a damaged checkpoint before the pool, logits
    # and teacher are loaded), then the config is validated once, by build_setup, and the
    # Setup is handed to the trainer.
    check_stored_run(FLAGS.config, FLAGS.workdir)
    setup = build_setup(FLAGS.config)
    # (the runtime line is logged by prada_jax.runloop once the run starts, after the resume
    # checks: a refused resume prints only its error line)
    # BadInput (exit 2) and NonFiniteTraining (exit 3) are mapped by prada_jax.cli
    res = train_and_evaluate(FLAGS.config, FLAGS.workdir, setup, max_steps=FLAGS.max_steps)
    if res.get("finished") is False:
        print(f"stopped ({res['stopped_by']}) at update {res['opt_step']}; rerun the same "
              "command to resume", file=sys.stderr)
        return runloop.exit_code_for(res["stopped_by"])
    print(("finished earlier; " if res.get("already_finished") else "") + summary_line(res))
    gate = res.get("gate")
    if gate:
        print(gate_line(gate))
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
