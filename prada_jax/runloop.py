"""The one host loop every trainer runs (PPO, dual ascent, distillation).

A trainer builds its state and its step function; :func:`run` calls the step between host
boundaries and owns everything around it:

* **restore-or-init** (:func:`restore_or_init`): the newest intact checkpoint, falling back
  (with one warning line) past a damaged newest step (``Checkpointer.restore_latest``);
* **curves**: each writer first gets ``mark_restart(x)`` at the step it continues from, so
  points an interrupted run wrote past its last checkpoint are dropped by TensorBoard's reader;
  the trainer's ``scalars_fn`` turns one call's metrics into per-writer scalar dicts; non-finite values of tags that are not checked (e.g. ``env/accuracy`` in a chunk where
  no user finished) are dropped, so nothing non-finite reaches TensorBoard;
* **non-finite guard**: if a checked tag is NaN/inf the loop stops *before* writing that
  boundary's curves or saving, keeps the last good checkpoint, and raises
  ``errors.NonFiniteTraining`` whose one line names the metric, the writer (seed), the step
  range and the last good checkpoint (or says that no checkpoint was saved yet);
* **checkpoints**: at a boundary where ``Checkpointer.should_save(step)`` holds, where the run
  ends, where ``max_calls`` stops it, or on SIGINT/SIGTERM: the writers are flushed first
  (``MetricWriter.flush`` puts every event on disk), then ``ckpt.save`` (which refuses a
  non-finite state) with ``meta_fn``'s JSON meta, then ``after_save`` (e.g. an export file);
* **progress bar** (tqdm): created after the first call of this process returns, so neither its
  rate nor its ETA counts compilation;
* **timing**: the first call after a (re)start compiles, so ``scalars_fn`` gets
  ``wall_s=None`` for it and trainers write *no* steps-per-second point for that call (the
  point is dropped, not estimated); every later call is timed from dispatch to metrics on the
  host;
* **runtime line**: the first ``run`` of a process logs ``host_info.runtime_info()`` (Python,
  JAX, backend, devices) at INFO, so a launcher's refused input or resume (exit 2) prints only
  its one error line;
* **signals**: SIGINT/SIGTERM (main thread only) finish the current call, save a checkpoint at
  that boundary and return with ``stopped_by`` = ``"SIGINT"``/``"SIGTERM"``; a second signal
  raises ``KeyboardInterrupt`` at once. Entry modules then exit with 128 + the signal number.

The step function is either a jitted chunk (PPO, dual: many updates per call) or a plain Python
callable (distillation: host-side batch sampling per optimiser step); both have the signature
``step_fn(state, step) -> (state, metrics)`` where ``step`` is the number of steps done before
the call and each call advances ``steps_per_call`` steps.

Example::

    ckpt = Checkpointer(workdir / "checkpoints", save_every=10)
    state, meta, start = runloop.restore_or_init(ckpt, init_state)
    with MetricWriter(workdir / "tb") as w:
        res = runloop.run(state, lambda s, i: chunk(s, params), start=start, total=100,
                          writers=[w], ckpt=ckpt,
                          scalars_fn=lambda m, step, wall_s: [{"train/loss": m["loss"]}],
                          check=lambda tag: tag.startswith("train/"))
    ckpt.close()
"""
from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from absl import logging
from tqdm import tqdm

from prada_jax import host_info
from prada_jax.errors import NonFiniteTraining

__all__ = ["LoopResult", "run", "restore_or_init", "exit_code_for", "no_checkpoint_note",
           "Stop", "status_head"]


def _all(tag: str) -> bool:
    return True


_runtime_logged = False


def _log_runtime() -> None:
    """Logs the runtime line once per process."""
    global _runtime_logged
    if not _runtime_logged:
        logging.info(host_info.runtime_info())
        _runtime_logged = True


def no_checkpoint_note(ckpt) -> str:
    """'the last good checkpoint (step N) is kept in DIR' or 'no checkpoint was saved yet'."""
    latest = None if ckpt is None else ckpt.latest_step()
    if latest is None:
        return "no checkpoint was saved yet"
    return f"the last good checkpoint (step {latest}) is kept in {ckpt.directory}"


@dataclasses.dataclass
class LoopResult:
    """What :func:`run` returns.

    state: the state after the last completed call.
    step: steps done at exit (trainer units: updates, chunks, optimiser steps).
    start_step: steps done when this call of ``run`` began.
    calls: step-function calls made.
    scalars: per-writer scalars of the last boundary this call wrote (``[]`` if none).
    stopped_by: None, ``"max_calls"``, ``"SIGINT"`` or ``"SIGTERM"``.
    finished: ``step >= total``.
    saved_step: the last step checkpointed in this call (None if none).
    meta: the meta of the last checkpoint written in this call (``{}`` if none).
    """

    state: Any
    step: int
    start_step: int
    calls: int
    scalars: list
    stopped_by: str | None
    finished: bool
    saved_step: int | None
    meta: dict


class Stop(Exception):
    """Raise from ``scalars_fn`` / ``after_save`` to end the loop cleanly after this boundary
    (it is checkpointed)."""


def exit_code_for(stopped_by: str | None) -> int:
    """Exit status for a run that stopped: 128 + signal number for a signal, else 0."""
    if stopped_by == "SIGINT":
        return 128 + int(signal.SIGINT)
    if stopped_by == "SIGTERM":
        return 128 + int(signal.SIGTERM)
    return 0


def status_head(stopped_by: str | None, finished: bool, did_nothing: bool) -> str:
    """The first words of a launcher's closing line: ``"stopped by SIGTERM, checkpoint saved
    (rerun to continue)"``, ``"already finished (nothing to do)"``, ``"done"`` or ``"paused
    (rerun to continue)"`` (``max_calls`` reached before the end)."""
    if stopped_by in ("SIGINT", "SIGTERM"):
        return f"stopped by {stopped_by}, checkpoint saved (rerun to continue)"
    if finished and did_nothing:
        return "already finished (nothing to do)"
    return "done" if finished else "paused (rerun to continue)"


def restore_or_init(ckpt, init_state: Any) -> tuple[Any, dict, int]:
    """``(state, meta, start_step)``: the newest intact checkpoint or ``(init_state, {}, 0)``.

    ``init_state`` is the template (a fresh state of the same structure). A damaged newest
    step falls back to the next intact one with one warning line on stderr; a mismatch with the
    template raises ``checkpointing.CheckpointError`` (``BadInput``, exit 2).
    """
    got = ckpt.restore_latest(init_state)
    if got is None:
        return init_state, {}, 0
    state, meta, step = got
    return state, meta, int(step)


class _Signals:
    """Installs SIGINT/SIGTERM handlers (main thread only) that record the first signal."""

    def __init__(self, enabled: bool):
        self.received: str | None = None
        self._old: dict = {}
        self._enabled = enabled and threading.current_thread() is threading.main_thread()

    def _handler(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt(f"second signal {signal.Signals(signum).name}")
        self.received = signal.Signals(signum).name

    def __enter__(self):
        if self._enabled:
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def _as_list(scalars, n: int) -> list[dict]:
    if scalars is None:
        return []
    if isinstance(scalars, Mapping):
        scalars = [scalars]
    scalars = [dict(s) for s in scalars]
    if n and len(scalars) != n:
        raise ValueError(f"runloop: scalars_fn returned {len(scalars)} dicts for {n} writers")
    return scalars


def _finite(v) -> bool:
    try:
        return math.isfinite(float(np.asarray(v)))
    except (TypeError, ValueError):
        return False


def run(state: Any, step_fn: Callable[[Any, int], tuple[Any, Any]], *, start: int, total: int,
        steps_per_call: int = 1, max_calls: int | None = None,
        writers: Sequence = (), ckpt=None,
        scalars_fn: Callable[[Any, int, float | None], Any] | None = None,
        x_fn: Callable[[Any, int], int] | None = None,
        check: Callable[[str], bool] = _all,
        meta_fn: Callable[[Any, int, list], dict] | None = None,
        after_save: Callable[[Any, int, dict], None] | None = None,
        progress: bool = False, desc: str = "", unit: str = "step",
        postfix_fn: Callable[[list], dict] | None = None,
        writer_names: Sequence[str] | None = None,
        handle_signals: bool = True, step_name: str = "steps") -> LoopResult:
    """Runs ``step_fn`` from ``start`` until ``total`` steps (or ``max_calls`` calls).

    Args:
      state: the state to continue from (restored or fresh; see :func:`restore_or_init`).
      step_fn: ``(state, step) -> (state, metrics)``; ``step`` = steps done before the call.
        A jitted function may donate ``state``: the loop never reuses the old one.
      start: steps done at ``state``. total: steps of the whole run.
      steps_per_call: steps one call advances (PPO: updates per chunk; dual: 1 chunk).
      max_calls: stop after this many calls in this invocation (checkpointed; resume later).
      writers: ``MetricWriter``s, one per entry of the scalars list (e.g. one per seed).
      ckpt: a ``Checkpointer`` (None: never save).
      scalars_fn: ``(metrics, step_after, wall_s) -> dict | [dict per writer] | None``;
        ``wall_s`` is None for the first (compiling) call of this process. None: nothing is
        written at this boundary. Default: the metrics themselves (a flat dict).
      x_fn: ``(state, step_after) -> x`` of the curve points (default ``step_after``; RL
        runs use env steps).
      check: which tags must be finite (default all). A non-finite checked value stops the run
        with ``NonFiniteTraining``; a non-finite unchecked value is just not written.
      meta_fn: ``(state, step_after, scalars) -> JSON dict`` stored with each checkpoint (all
        host-side state that feeds results belongs here).
      after_save: ``(state, step_after, meta)`` called after each checkpoint is on disk.
      progress, desc, unit: tqdm bar (total in steps).
      postfix_fn: ``scalars -> dict`` of short strings for the bar.
      writer_names: how a writer is named in the non-finite message (e.g. ``seed 3``).
      handle_signals: catch SIGINT/SIGTERM as described in the module docstring.
      step_name: the unit in the non-finite message (``updates``, ``chunks``, ...).

    Returns:
      A :class:`LoopResult`.

    Raises:
      errors.NonFiniteTraining: a checked metric (or the state at a save) is non-finite.
    """
    _log_runtime()
    step, calls = int(start), 0
    last_scalars: list = []
    saved_step, saved_meta = None, {}
    stopped_by = None
    bar = None
    first = True
    k = int(steps_per_call)
    # Points an interrupted run wrote past the checkpoint we continue from are superseded.
    x0 = int(x_fn(state, step)) if x_fn is not None else step
    for w in writers:
        if hasattr(w, "mark_restart"):
            w.mark_restart(x0)
    try:
        with _Signals(handle_signals) as sig:
            while step < total and (max_calls is None or calls < max_calls):
                t0 = time.perf_counter()
                new_state, metrics = step_fn(state, step)
                metrics = jax.device_get(metrics)
                wall = None if first else time.perf_counter() - t0
                after = step + k
                stop_req = False
                try:
                    raw = (scalars_fn(metrics, after, wall) if scalars_fn is not None
                           else metrics)
                except Stop:
                    raw, stop_req = None, True
                scalars = _as_list(raw, len(writers))
                for i, sc in enumerate(scalars):
                    bad = [t for t, v in sc.items() if check(t) and not _finite(v)]
                    if bad:
                        who = ""
                        if len(scalars) > 1:
                            who = f" ({writer_names[i] if writer_names else f'writer {i}'})"
                        raise NonFiniteTraining(
                            f"non-finite {bad[0]}{who} in {step_name} {step + 1}..{after}; "
                            f"stopping; {no_checkpoint_note(ckpt)}")
                    for t in [t for t, v in sc.items() if not _finite(v)]:
                        del sc[t]
                state = new_state
                step, calls = after, calls + 1
                if scalars:
                    x = int(x_fn(state, step)) if x_fn is not None else step
                    for w, sc in zip(writers, scalars):
                        w.write_scalars(x, sc)
                    last_scalars = scalars
                if sig.received and stopped_by is None:
                    stopped_by = sig.received
                if stop_req and stopped_by is None:
                    stopped_by = "stop"
                end = (step >= total or stopped_by is not None
                       or (max_calls is not None and calls >= max_calls))
                if ckpt is not None and (ckpt.should_save(step) or end):
                    for w in writers:
                        w.flush()   # curves up to this boundary are on disk before it
                    meta = dict(meta_fn(state, step, last_scalars)) if meta_fn else {}
                    if ckpt.save(step, state, meta=meta, force=True):
                        saved_step, saved_meta = step, meta
                        if after_save is not None:
                            after_save(state, step, meta)
                if first:
                    first = False
                    if progress:
                        bar = tqdm(total=int(total), initial=step, desc=desc, unit=unit,
                                   dynamic_ncols=True)
                elif bar is not None:
                    bar.update(step - bar.n)
                if bar is not None and postfix_fn is not None and last_scalars:
                    bar.set_postfix(postfix_fn(last_scalars), refresh=False)
                if stopped_by is not None:
                    break
            if stopped_by is None and max_calls is not None and calls >= max_calls \
                    and step < total:
                stopped_by = "max_calls"
    finally:
        if bar is not None:
            bar.close()
        for w in writers:
            w.flush()
    return LoopResult(state=state, step=step, start_step=int(start), calls=calls,
                      scalars=last_scalars, stopped_by=stopped_by, finished=step >= total,
                      saved_step=saved_step, meta=saved_meta)
