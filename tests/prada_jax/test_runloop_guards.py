"""prada_jax.runloop guards, in-process and small: the curves are on disk before each
checkpoint, a non-finite metric of any seed (not only the first) stops the run, SIGINT saves at
the boundary and maps to exit 130."""
import os
import signal
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax import checkpointing, errors, runloop
from prada_jax.metric_writer import MetricWriter


def _curves(logdir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


class _SpyCheckpointer(checkpointing.Checkpointer):
    """Reads every writer's curves back from disk at each save, before saving: what a SIGKILL
    right after this checkpoint would leave."""

    def __init__(self, path, logdirs, **kw):
        super().__init__(path, **kw)
        self.logdirs = logdirs
        self.on_disk = {}

    def save(self, step, state, *a, **kw):
        self.on_disk[int(step)] = [_curves(d) for d in self.logdirs]
        return super().save(step, state, *a, **kw)


def _step(state, i):
    """x += i + 1 per call; one loss per seed: (x + 10 s) / 10 for seed s."""
    x = state["x"] + (i + 1)
    return {"x": x}, {"loss": (x + 10.0 * jnp.arange(3.0)) / 10.0}


def test_curves_are_flushed_before_each_checkpoint(tmp_path):
    """At every save, each seed's curve already holds one point per step up to that step."""
    logdirs = [tmp_path / "tb" / f"seed{s}" for s in range(3)]
    ckpt = _SpyCheckpointer(tmp_path / "ck", logdirs, save_every=2, max_to_keep=10)
    writers = [MetricWriter(d, enabled=True) for d in logdirs]
    try:
        res = runloop.run({"x": jnp.float32(0.0)}, _step, start=0, total=7, writers=writers,
                          ckpt=ckpt,
                          scalars_fn=lambda m, step, wall: [{"train/loss": float(v)}
                                                            for v in m["loss"]])
    finally:
        for w in writers:
            w.close()
        ckpt.close()
    assert res.finished and sorted(ckpt.on_disk) == [2, 4, 6, 7]
    x = np.cumsum(np.arange(1, 8, dtype=np.float64))   # plain-Python reference of x per step
    for saved, per_seed in ckpt.on_disk.items():
        for s, curves in enumerate(per_seed):
            got = curves.get("train/loss", [])
            assert [st for st, _ in got] == list(range(1, saved + 1)), (saved, s)
            np.testing.assert_allclose([v for _, v in got], (x[:saved] + 10 * s) / 10,
                                       rtol=1e-6)


def test_sigkill_right_after_a_checkpoint_keeps_every_point_up_to_it(tmp_path):
    """The exact-resume claim end to end: the host loop is killed with SIGKILL (no exit
    handler, no final flush) right after its step-4 checkpoint is on disk; the event file then
    holds every point of steps 1..4 (plain-Python values), and step 4 is the checkpoint a
    resume starts from (the resume itself: test_runloop.py's SIGKILL/SIGTERM tests). Without the
    flush before each checkpoint the points sat in the writer's buffer and the kill lost
    them."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    code = textwrap.dedent("""
        import os, signal, sys
        from pathlib import Path
        import jax.numpy as jnp
        from prada_jax import checkpointing, runloop
        from prada_jax.metric_writer import MetricWriter
        out, kill_at = Path(sys.argv[1]), int(sys.argv[2])
        ckpt = checkpointing.Checkpointer(out / "ck", save_every=2, max_to_keep=10)
        state, _, start = runloop.restore_or_init(ckpt, {"x": jnp.float32(0.0)})

        def step(s, i):
            x = s["x"] + (i + 1)
            return {"x": x}, {"loss": x / 10.0}

        def after_save(s, step, meta):
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        w = MetricWriter(out / "tb", enabled=True)
        runloop.run(state, step, start=start, total=6, writers=[w], ckpt=ckpt,
                    scalars_fn=lambda m, st, wall: {"train/loss": float(m["loss"])},
                    after_save=after_save, handle_signals=False)
        ckpt.close()
        w.close()
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]),
               JAX_PLATFORMS="cpu")
    killed = subprocess.run([sys.executable, "-c", code, str(tmp_path), "4"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    x = np.cumsum(np.arange(1, 7, dtype=np.float64))    # x after each step, plain Python
    got = _curves(tmp_path / "tb").get("train/loss", [])
    assert [st for st, _ in got] == [1, 2, 3, 4], got
    np.testing.assert_allclose([v for _, v in got], x[:4] / 10, rtol=1e-6)
    ck = checkpointing.Checkpointer(tmp_path / "ck")
    try:
        state, _, start = runloop.restore_or_init(ck, {"x": jnp.float32(0.0)})
    finally:
        ck.close()
    assert start == 4 and float(state["x"]) == x[3]


@pytest.mark.parametrize("bad_seed", [0, 2])
def test_non_finite_metric_of_any_seed_stops_the_run(tmp_path, bad_seed):
    """Seed ``bad_seed`` alone turns NaN at step 5: the run stops there naming that seed, the
    last checkpoint is step 4 and no writer holds a point past step 4."""
    def step(state, i):
        x = state["x"] + (i + 1)
        loss = np.array([1.0, 2.0, 3.0])
        if i + 1 == 5:
            loss[bad_seed] = np.nan
        return {"x": x}, {"loss": loss}

    logdirs = [tmp_path / "tb" / f"seed{s}" for s in range(3)]
    ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=2, max_to_keep=10)
    writers = [MetricWriter(d, enabled=True) for d in logdirs]
    try:
        with pytest.raises(errors.NonFiniteTraining) as ei:
            runloop.run({"x": jnp.float32(0.0)}, step, start=0, total=8, writers=writers,
                        ckpt=ckpt, writer_names=[f"seed {s}" for s in range(3)],
                        step_name="updates",
                        scalars_fn=lambda m, st, wall: [{"train/loss": v} for v in m["loss"]])
    finally:
        for w in writers:
            w.close()
    msg = str(ei.value)
    assert f"train/loss (seed {bad_seed}) in updates 5..5" in msg and "step 4" in msg, msg
    assert ckpt.all_steps()[-1] == 4
    ckpt.close()
    for d in logdirs:
        assert [st for st, _ in _curves(d)["train/loss"]] == [1, 2, 3, 4]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers need the main thread")
def test_sigint_saves_at_the_boundary_and_maps_to_130(tmp_path):
    """SIGINT during call 3 (of 10): the call finishes, a checkpoint is saved at step 3 (not a
    save_every multiple), the loop returns ``stopped_by="SIGINT"``; exit code 128 + 2."""
    def step(state, i):
        if i == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return {"x": state["x"] + (i + 1)}, {"loss": float(i)}

    ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=5, max_to_keep=10)
    old = signal.getsignal(signal.SIGINT)
    try:
        res = runloop.run({"x": jnp.float32(0.0)}, step, start=0, total=10, ckpt=ckpt)
    finally:
        ckpt.close()
    assert signal.getsignal(signal.SIGINT) is old   # the handler is restored
    assert res.stopped_by == "SIGINT" and res.step == 3 and res.saved_step == 3
    assert float(res.state["x"]) == 1 + 2 + 3
    assert runloop.exit_code_for(res.stopped_by) == 130
    assert runloop.exit_code_for("SIGTERM") == 143
    assert checkpointing.Checkpointer(tmp_path / "ck").all_steps() == [3]
