"""The distillation trainer's shape (issue 34): ``build_setup`` validates, loads and builds but
writes nothing, and one update stepped from a Setup without any run directory equals the
update of a run opened on a workdir."""
import os
from pathlib import Path

import jax
import numpy as np
import pytest

pytest.importorskip("torch")   # the tiny cache's teacher is a PyTorch model


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from prada_jax.distill.task.teacher import tiny_cache
    return tiny_cache(tmp_path_factory.mktemp("cache"))


def _config(cache):
    from prada_jax.configs.distill import get_config
    c = get_config("smoke")
    c.data.cache = str(cache)
    c.eval.n_problems = 0
    return c


def _tree(root: Path) -> dict:
    """Every file and folder under ``root`` with its size and modification time [ns]."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _leaves(tree) -> list[np.ndarray]:
    """The leaves as NumPy arrays (typed PRNG keys as their key data)."""
    def arr(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)
    return [arr(x) for x in jax.tree.leaves(tree)]


def test_build_setup_writes_nothing_and_its_step_equals_a_run_dirs(cache, tmp_path,
                                                                   monkeypatch):
    from prada_jax.distill import stepping, trainer

    monkeypatch.chdir(tmp_path)   # a stray relative write would land here
    before_tmp, before_cache = _tree(tmp_path), _tree(cache)
    setup = trainer.build_setup(_config(cache))
    assert _tree(tmp_path) == before_tmp and _tree(cache) == before_cache

    free = stepping.open_run(setup)            # no workdir, checkpoint or writer
    assert free.files.workdir is None and free.files.ckpt is None and free.files.writers == ()
    free = stepping.step(stepping.step(free, 0), 1)
    assert _tree(tmp_path) == before_tmp and _tree(cache) == before_cache

    # the path every launcher took before the split: a run opened on a workdir
    opened = stepping.open_run(trainer.build_setup(_config(cache)), tmp_path / "wd")
    try:
        assert (tmp_path / "wd" / "config.json").is_file()
        opened = stepping.step(stepping.step(opened, 0), 1)
        for a, b in zip(_leaves(free.state), _leaves(opened.state), strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(free.host.turn_hist, opened.host.turn_hist)
        c = setup.config
        assert free.host.turn_hist.sum() == 2 * c.optim.grad_accum * c.train.batch_size
        for k in opened.host.acc:
            np.testing.assert_array_equal(free.host.acc[k], opened.host.acc[k])
        assert [c["supervised_turns"] for c in free.host.costs] == \
            [c["supervised_turns"] for c in opened.host.costs]
    finally:
        trainer.close_files(opened.files)

    # the Setup is not used up (the jitted step donates its input state): a second run of the
    # same Setup repeats the first exactly, and it moved away from the initial parameters
    again = stepping.open_run(setup)
    init = _leaves(setup.init_state.params)
    again = stepping.step(stepping.step(again, 0), 1)
    for a, b in zip(_leaves(free.state), _leaves(again.state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(init, _leaves(again.state.params)))


def test_host_state_round_trips_through_json():
    """The checkpointed host-state tuple: ``from_json(to_json())`` is the identity (N = 1 and
    N = 2), and updates replace it rather than changing it in place."""
    from prada_jax.distill.host_state import HostState

    for n in (1, 2):
        h = HostState(turn_hist=np.arange(3.0 * n).reshape(n, 3), env_calls=4,
                      update_times=(0.5, 0.25), tokens_done=7,
                      acc={"n": 2, "loss": np.full(n, 1.5) if n > 1 else np.float64(1.5)},
                      costs=({"supervised_turns": 3, "timed": False},), cost_logged=1)
        back = HostState.from_json(h.to_json(stacked=n > 1), n)
        np.testing.assert_array_equal(back.turn_hist, h.turn_hist)
        assert (back.env_calls, back.update_times, back.tokens_done, back.costs,
                back.cost_logged) == (4, (0.5, 0.25), 7, h.costs, 1)
        assert back.acc["n"] == 2
        np.testing.assert_array_equal(back.acc["loss"], h.acc["loss"])
    fresh = HostState.fresh(2, 3)
    later = fresh._replace(env_calls=1)
    assert fresh.env_calls == 0 and later.env_calls == 1 and fresh.turn_hist.shape == (2, 3)
