"""TensorBoard writer for scalars, text and images, active on JAX process 0 only.

Events are written synchronously (tensorboardX's protobuf builders and its ``EventsWriter``,
without its background queue): ``flush()`` returns only once every event logged so far is in
the file and fsync'ed, so curves logged before a checkpoint survive a SIGKILL right after it.
(tensorboardX's ``SummaryWriter.flush()`` does not drain its asynchronous event queue, which
is written every ``flush_secs``.)

Tags are namespaced with slashes (``train/policy_loss``, ``env/offload_rate``,
``dual/lambda_s``, ``eval/accuracy``). On every process other than 0 all calls are no-ops, so
launchers can call the writer unconditionally in multi-host runs.

Example::

    with MetricWriter(workdir / "tb") as w:
        w.write_scalars(env_steps, {"train/policy_loss": 0.1, "train/approx_kl": 0.01})
        w.write_texts(0, {"config": config.to_json_best_effort(indent=2)})
        w.write_images(step, {"eval/curve": rgb_uint8_hwc})
"""
from __future__ import annotations

import itertools
import math
import os
import time
from pathlib import Path
from typing import Mapping

import jax
import numpy as np

# tensorboardX is imported inside the methods: importing any of its modules imports torch when
# torch is installed, and the run loop (so every launcher and prada_jax.rl) imports this module.

__all__ = ["MetricWriter", "all_finite"]


class MetricWriter:
    """Writes TensorBoard events into ``logdir`` (created if missing).

    Args:
      logdir: event folder; use ``<workdir>/tb`` (or ``<workdir>/tb/seed<k>`` per seed).
      enabled: write at all; default ``jax.process_index() == 0``.
      flush_secs: ignored (kept for callers); events are written synchronously and
        ``flush()`` puts them on disk.

    Each writer opens a new event file (``events.out.tfevents.<s>.<host>.<ns>.<pid>.<n>``, in opening order by name); a
    resumed run appends a new file that starts with ``mark_restart`` (the host loop writes
    it), so TensorBoard's reader drops points of the older file past the resumed step.
    """

    _count = itertools.count()

    def __init__(self, logdir: os.PathLike | str, *, enabled: bool | None = None,
                 flush_secs: int = 10):
        del flush_secs
        self.logdir = Path(logdir)
        self.enabled = (jax.process_index() == 0) if enabled is None else bool(enabled)
        self._writer = None
        if self.enabled:
            from tensorboardX.event_file_writer import EventsWriter  # lazy: pulls in torch
            self.logdir.mkdir(parents=True, exist_ok=True)
            # TensorBoard reads a folder's event files in name order, and tensorboardX's
            # name carries whole seconds only: the suffix keeps files of one second in the
            # order they were opened (nanoseconds, then a zero-padded count; an unpadded
            # count put writer 10 before writer 9, and a resumed run's points were purged).
            self._writer = EventsWriter(
                str(self.logdir / "events"),
                f".{time.time_ns():020d}.{os.getpid()}.{next(self._count):08d}")

    def _add(self, step: int, summary) -> None:
        from tensorboardX.proto import event_pb2  # lazy: pulls in torch
        self._writer.write_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                                 summary=summary))

    def mark_restart(self, step: int) -> None:
        """Marks a restart from ``step``: TensorBoard's reader then drops every point with a
        larger step written before it (points an interrupted run logged past the checkpoint
        it resumes from), so each curve has one point per step. (A ``SessionLog.START`` event
        at ``step + 1``: the reader purges points at steps >= the event's.)"""
        if not self.enabled:
            return
        from tensorboardX.proto import event_pb2  # lazy: pulls in torch
        self._writer.write_event(event_pb2.Event(
            wall_time=time.time(), step=int(step) + 1,
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """One point per tag at x = ``step``. Values are converted with ``float()``; NaN/inf
        are written as they are (TensorBoard shows them), so the caller decides whether a
        non-finite value stops the run."""
        if not self.enabled:
            return
        from tensorboardX.summary import scalar  # lazy: pulls in torch
        for tag, value in scalars.items():
            self._add(step, scalar(tag, float(np.asarray(value))))

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Markdown text per tag (e.g. the resolved config)."""
        if not self.enabled:
            return
        from tensorboardX.summary import text as text_summary  # lazy: pulls in torch
        for tag, text in texts.items():
            self._add(step, text_summary(tag, str(text)))

    def write_images(self, step: int, images: Mapping[str, np.ndarray]) -> None:
        """Images per tag, each ``[H, W]`` (grey) or ``[H, W, C]`` with C in {1, 3, 4};
        uint8 in [0, 255] or float in [0, 1]."""
        if not self.enabled:
            return
        for tag, img in images.items():
            arr = np.asarray(img)
            if arr.ndim == 2:
                arr = arr[:, :, None]
            if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
                raise ValueError(f"write_images: image '{tag}' must be [H, W] or [H, W, C] with "
                                 f"C in (1, 3, 4), got shape {arr.shape}")
            from tensorboardX.summary import image  # lazy: pulls in torch
            self._add(step, image(tag, arr, dataformats="HWC"))

    def flush(self) -> None:
        """Every event written so far is in the file and fsync'ed when this returns."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self.enabled = False

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def all_finite(scalars: Mapping[str, float]) -> bool:
    """True iff every value is a finite number."""
    return all(math.isfinite(float(np.asarray(v))) for v in scalars.values())
