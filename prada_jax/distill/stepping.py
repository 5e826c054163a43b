"""A distillation run stepped update by update by its caller instead of by the host loop.

Timing studies, benchmarks and tests that time or compare single updates step a run themselves.
:class:`Stepped` holds what :func:`prada_jax.distill.trainer.train_and_evaluate` threads
through the host loop: the frozen :class:`~prada_jax.distill.trainer.Setup`, the per-seed
:class:`~prada_jax.distill.host_state.SeedRecords`, the open
:class:`~prada_jax.distill.host_state.RunFiles`, the train state and the
:class:`~prada_jax.distill.host_state.HostState`. It is a frozen tuple: :func:`step` returns a
new one (the jitted step donates its input state, so the old one's state is used up).

    setup = trainer.build_setup(config)
    run = stepping.open_run(setup)                  # no workdir: nothing written
    run = stepping.step(run, 0)                     # update 0; run.host.costs[-1] its cost

On a workdir (``open_run(setup, workdir)``) the caller closes the files at the end
(``trainer.close_files(run.files)``); with ``restore=True`` the run continues its stored
checkpoint (:func:`prada_jax.distill.trainer.restore_state`) and
``results.finish(run.setup, run.rec, run.files, run.state, run.host)`` ends it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from prada_jax.distill import trainer
from prada_jax.distill.host_state import HostState, RunFiles, SeedRecords
from prada_jax.distill.host_update import optimizer_update


class Stepped(NamedTuple):
    """A run between two of its caller's updates (what the host loop threads)."""

    setup: trainer.Setup
    rec: SeedRecords
    files: RunFiles
    state: Any                      # TrainState; [N, ...] stacked if N > 1
    host: HostState


def open_run(setup: trainer.Setup, workdir: str | Path | None = None, *,
             restore: bool = False) -> Stepped:
    """A run of ``setup``: without ``workdir`` in memory (a fresh copy of the initial state; no
    checkpoint or curves), else on ``workdir`` (:func:`prada_jax.distill.trainer.open_workdir`:
    the resume contract, ``config.json`` / ``run.json``, curve writers; the state is the newest
    checkpoint's if there is one). ``restore`` (workdir only): also restore the stored run's
    results, host counters and sampler states, or, fresh, evaluate the untrained students
    (:func:`prada_jax.distill.trainer.restore_state`); the files are closed if that fails."""
    if workdir is None:
        if restore:
            raise ValueError("open_run: restore=True needs a workdir")
        files, state = RunFiles(), trainer.copy_state(setup.init_state)
    else:
        files, restored = trainer.open_workdir(setup, workdir)
        state = restored[0]
    rec = trainer.new_records(setup)
    host = HostState.fresh(len(setup.seeds), setup.num_turns)
    if restore:
        try:
            state, host, _ = trainer.restore_state(setup, rec, files, restored, host)
        except BaseException:
            trainer.close_files(files)
            raise
    return Stepped(setup=setup, rec=rec, files=files, state=state, host=host)


def step(run: Stepped, opt_step: int) -> Stepped:
    """Update ``opt_step`` of ``run`` (:func:`prada_jax.distill.host_update.optimizer_update`:
    ``optim.grad_accum`` micro-steps of every seed); returns the run after it."""
    state, host = optimizer_update(run.setup, run.rec, run.state, run.host, opt_step)
    return run._replace(state=state, host=host)
