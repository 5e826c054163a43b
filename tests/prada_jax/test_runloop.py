"""prada_jax.runloop (the shared host loop), prada_jax.run_state (config-checked resume) and the
synchronous MetricWriter: plain-Python reference counters, EventAccumulator read-back, and
subprocesses killed with SIGKILL / SIGTERM."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax import checkpointing, errors, run_state, runloop
from prada_jax.metric_writer import MetricWriter

ROOT = Path(__file__).resolve().parents[2]


def _curves(logdir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _step(state, i):
    """State {'x': float}, x += i + 1 per call; metric loss = x / 10."""
    x = state["x"] + (i + 1)
    return {"x": x}, {"loss": x / 10.0}


def _run(tmp_path, total, *, start_state=None, max_calls=None, save_every=2, step_fn=_step,
         check=runloop._all):
    ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=save_every, max_to_keep=10)
    init = {"x": jnp.float32(0.0)} if start_state is None else start_state
    state, meta, start = runloop.restore_or_init(ckpt, init)
    walls = []

    def scalars_fn(m, step, wall):
        walls.append(wall)
        return {"train/loss": float(m["loss"])}
    with MetricWriter(tmp_path / "tb", enabled=True) as w:
        try:
            res = runloop.run(state, step_fn, start=start, total=total, writers=[w], ckpt=ckpt,
                              scalars_fn=scalars_fn, max_calls=max_calls, check=check,
                              meta_fn=lambda s, step, sc: {"step": step, "last": sc})
        finally:
            ckpt.close()
    return res, walls


def test_run_matches_reference_and_checkpoints(tmp_path):
    res, walls = _run(tmp_path, 5)
    ref = [sum(range(1, n + 1)) for n in range(1, 6)]       # x after each step
    assert float(res.state["x"]) == ref[-1] and res.step == 5 and res.finished
    assert walls[0] is None and all(w is not None and w >= 0 for w in walls[1:])
    assert [v for _, v in _curves(tmp_path / "tb")["train/loss"]] == pytest.approx(
        [r / 10 for r in ref])
    ck = checkpointing.Checkpointer(tmp_path / "ck")
    assert ck.all_steps() == [2, 4, 5]        # every 2 steps, plus the end
    _, meta = ck.restore({"x": jnp.float32(0)})
    assert meta["step"] == 5 and meta["last"] == [{"train/loss": pytest.approx(1.5)}]
    ck.close()


def test_resume_after_max_calls_equals_uninterrupted(tmp_path):
    a, _ = _run(tmp_path / "a", 7)
    part, _ = _run(tmp_path / "b", 7, max_calls=3)
    assert part.stopped_by == "max_calls" and part.step == 3 and part.saved_step == 3
    b, _ = _run(tmp_path / "b", 7)
    assert b.start_step == 3 and float(b.state["x"]) == float(a.state["x"])
    assert _curves(tmp_path / "a" / "tb") == _curves(tmp_path / "b" / "tb")


def test_non_finite_metric_stops_before_writing(tmp_path):
    def bad_at_4(state, i):
        s, m = _step(state, i)
        return s, {"loss": np.nan if i == 3 else m["loss"]}
    with pytest.raises(errors.NonFiniteTraining) as e:
        _run(tmp_path, 6, step_fn=bad_at_4)
    msg = str(e.value)
    assert "train/loss" in msg and "steps 4..4" in msg and "(step 2) is kept" in msg
    assert "\n" not in msg
    assert len(_curves(tmp_path / "tb")["train/loss"]) == 3    # nothing non-finite written
    assert checkpointing.Checkpointer(tmp_path / "ck").all_steps() == [2]


def test_non_finite_before_any_checkpoint_says_so(tmp_path):
    def bad(state, i):
        return state, {"loss": np.inf}
    with pytest.raises(errors.NonFiniteTraining, match="no checkpoint was saved yet"):
        _run(tmp_path, 3, step_fn=bad)


def test_unchecked_non_finite_is_dropped(tmp_path):
    def nan_acc(state, i):
        s, m = _step(state, i)
        return s, {"loss": m["loss"], "acc": np.nan if i % 2 else 1.0}
    ckpt = None
    with MetricWriter(tmp_path / "tb", enabled=True) as w:
        res = runloop.run({"x": jnp.float32(0)}, nan_acc, start=0, total=4, writers=[w],
                          ckpt=ckpt, scalars_fn=lambda m, s, wall: {
                              "train/loss": m["loss"], "env/acc": m["acc"]},
                          check=lambda t: t.startswith("train/"))
    c = _curves(tmp_path / "tb")
    assert res.finished and len(c["train/loss"]) == 4 and [s for s, _ in c["env/acc"]] == [1, 3]


def test_non_finite_state_is_never_saved(tmp_path):
    def nan_state(state, i):
        return {"x": state["x"] * np.nan if i == 1 else state["x"] + 1}, {"loss": 0.0}
    with pytest.raises(errors.NonFiniteTraining, match=r"refusing to checkpoint step 2.*\['x'\]"):
        _run(tmp_path, 4, step_fn=nan_state)
    assert checkpointing.Checkpointer(tmp_path / "ck").all_steps() == []


def test_damaged_latest_step_falls_back_with_warning(tmp_path, capsys):
    _run(tmp_path, 4)                              # steps 2, 4
    data = [p for p in (tmp_path / "ck" / "4" / "state").rglob("*")
            if p.is_file() and p.parent.name == "d"]
    data[0].write_bytes(data[0].read_bytes()[:5])  # truncate a data file
    ck = checkpointing.Checkpointer(tmp_path / "ck")
    with pytest.raises(checkpointing.DamagedCheckpoint, match=str(data[0].name)):
        ck.restore({"x": jnp.float32(0)})
    state, meta, start = runloop.restore_or_init(ck, {"x": jnp.float32(0)})
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step 4 is damaged" in err[0] and "falling back to step 2" in err[0]
    assert start == 2 and float(state["x"]) == 3.0
    assert ck.all_steps() == [2] and (tmp_path / "ck" / "4.damaged").is_dir()
    ck.save(4, {"x": jnp.float32(10)}, force=True)   # the step can be written again
    assert ck.all_steps() == [2, 4]
    ck.close()


def test_garbage_meta_is_named(tmp_path):
    _run(tmp_path, 2)
    (tmp_path / "ck" / "2" / "meta" / "metadata").write_text("[[[[garbage")
    ck = checkpointing.Checkpointer(tmp_path / "ck")
    with pytest.raises(checkpointing.DamagedCheckpoint, match="meta/metadata"):
        ck.restore({"x": jnp.float32(0)})
    with pytest.raises(checkpointing.DamagedCheckpoint):   # nothing older to fall back to
        runloop.restore_or_init(ck, {"x": jnp.float32(0)})
    ck.close()


_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import jax.numpy as jnp
    from prada_jax import checkpointing, runloop
    from prada_jax.metric_writer import MetricWriter
    out = Path(sys.argv[1]); total = int(sys.argv[2]); slow = float(sys.argv[3])
    ck = checkpointing.Checkpointer(out / "ck", save_every=3, max_to_keep=10)
    state, meta, start = runloop.restore_or_init(ck, {"x": jnp.float32(0)})
    def step(s, i):
        if i == 4 and slow:
            (out / "ready").write_text("1")
        time.sleep(slow)
        return {"x": s["x"] + (i + 1)}, {"loss": float(s["x"]) + i}
    with MetricWriter(out / "tb", enabled=True) as w:
        res = runloop.run(state, step, start=start, total=total, writers=[w], ckpt=ck,
                          scalars_fn=lambda m, s, wall: {"train/loss": m["loss"]})
    ck.close()
    print("STOP", res.stopped_by, res.step, float(res.state["x"]))
    sys.exit(runloop.exit_code_for(res.stopped_by))
""")


def _child(out, total, slow):
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(out), str(total), str(slow)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path, proc, timeout=120):
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout
        time.sleep(0.05)


def test_sigterm_saves_at_the_boundary_and_resume_is_exact(tmp_path):
    """SIGTERM in a 20-step child (0.2 s per step once it signals ready after step 4): exit 143
    at a boundary with a checkpoint there; the resumed child ends with the state and every
    curve point of an uninterrupted run, here in closed form (step i adds i + 1 to x and logs
    x + i before the update, at step i + 1)."""
    total = 20
    proc = _child(tmp_path / "a", total, 0.2)
    _wait_for(tmp_path / "a" / "ready", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    stop = out.split("STOP")[1].split()
    assert stop[0] == "SIGTERM" and 5 <= int(stop[1]) < total
    steps = checkpointing.Checkpointer(tmp_path / "a" / "ck").all_steps()
    assert steps[-1] == int(stop[1])             # saved at the boundary it stopped at
    resumed = _child(tmp_path / "a", total, 0.0)
    out_r, err_r = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err_r
    assert out_r.split("STOP")[1].split()[2] == str(float(sum(range(1, total + 1))))
    expected = [(i + 1, float(i * (i + 1) // 2 + i)) for i in range(total)]
    assert _curves(tmp_path / "a" / "tb") == {"train/loss": expected}


def test_metric_writer_flush_survives_sigkill(tmp_path):
    code = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from prada_jax.metric_writer import MetricWriter
        out = Path(sys.argv[1])
        w = MetricWriter(out / "tb", enabled=True)
        for i in range(13):
            w.write_scalars(i, {"a": i * 0.5, "b": -i})
        w.flush()
        (out / "flushed").write_text("1")
        time.sleep(600)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env)
    _wait_for(tmp_path / "flushed", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    c = _curves(tmp_path / "tb")
    assert c["a"] == [(i, i * 0.5) for i in range(13)] and len(c["b"]) == 13


# ----------------------------------------------------------------------------- run_state

def _cfg(**kw):
    import ml_collections
    c = ml_collections.ConfigDict({"seed": 0, "net": {"hidden": (8, 8)},
                                   "train": {"steps": 10, "lr": 1e-3},
                                   "log": {"every": 1, "progress": False}})
    for k, v in kw.items():
        a, b = k.split("__")
        c[a][b] = v
    return c


OBS = ("train.steps", "log.*")


def test_resume_check_fresh_then_allowed_changes_recorded(tmp_path):
    chk = run_state.check_resume(_cfg(), tmp_path, OBS)
    assert chk.fresh and not list(tmp_path.iterdir())
    run_state.commit(_cfg(), tmp_path, chk)
    new = _cfg(train__steps=20, log__every=5)
    chk = run_state.check_resume(new, tmp_path, OBS)
    assert not chk.fresh and chk.changed == {"log.every": (1, 5), "train.steps": (10, 20)}
    run_state.commit(new, tmp_path, chk)
    prov = run_state.read_run_meta(tmp_path)["provenance"]
    assert [p["event"] for p in prov] == ["start", "resume"]
    assert prov[1]["changed"] == {"log.every": [1, 5], "train.steps": [10, 20]}
    assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 20


def test_resume_check_refuses_computational_changes_and_writes_nothing(tmp_path):
    run_state.commit(_cfg(), tmp_path, run_state.check_resume(_cfg(), tmp_path, OBS))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    bad = _cfg(train__lr=3e-4, net__hidden=(16,), train__steps=99)
    with pytest.raises(run_state.ConfigMismatch) as e:
        run_state.check_resume(bad, tmp_path, OBS)
    msg = str(e.value)
    assert isinstance(e.value, errors.BadInput) and "\n" not in msg
    assert "train.lr: 0.001 → 0.0003" in msg and "net.hidden: [8, 8] → [16]" in msg
    assert "train.steps" not in msg
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(errors.BadInput, match="config.json"):
        run_state.check_resume(_cfg(), tmp_path, OBS)


def test_writers_opened_in_one_second_are_read_in_opening_order(tmp_path, monkeypatch):
    """Two writers in one second whose counter crosses a digit (9 -> 10), as a resume in the
    same process can (the flaky resume test above): TensorBoard reads the folder's files in
    name order, so the second file must sort after the first, else its points come first and
    the first file's older steps purge them. tensorboardX's own clock is frozen to one second
    here; the reference is the plain list of steps written."""
    import itertools

    import tensorboardX.event_file_writer as efw

    monkeypatch.setattr(MetricWriter, "_count", itertools.count(9))
    monkeypatch.setattr(efw.time, "time", lambda: 1796194425.25)
    written = []
    for steps in ((1, 2, 3), (4, 5, 6, 7)):
        w = MetricWriter(tmp_path)
        for s in steps:
            w.write_scalars(s, {"loss": s / 10.0})
            written.append(s)
        w.close()
    assert [s for s, _ in _curves(tmp_path)["loss"]] == written
    assert len(list(tmp_path.iterdir())) == 2
