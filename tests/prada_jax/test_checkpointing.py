"""Checkpointer: exact round trip incl. typed keys, save_every/keep-K, SIGKILL tmp dirs ignored;
MetricWriter: values read back with TensorBoard's EventAccumulator; config_utils errors."""
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import struct

from prada_jax import checkpointing, config_utils, metric_writer, tree_leaves


@struct.dataclass
class _State:
    params: dict
    key: jax.Array
    keys: jax.Array
    step: jax.Array


def _state(seed):
    k = jax.random.key(seed)
    return _State(params={"w": jax.random.normal(k, (3, 4)), "b": jnp.arange(4.0)},
                  key=jax.random.fold_in(k, 1), keys=jax.random.split(k, 5),
                  step=jnp.int32(seed))


def _same(a, b):
    a, b = tree_leaves.keys_to_data(a), tree_leaves.keys_to_data(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_round_trip_exact_with_typed_keys(tmp_path):
    ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=2, max_to_keep=2)
    assert ckpt.latest_step() is None
    with pytest.raises(FileNotFoundError):
        ckpt.restore(_state(0))
    for step in range(1, 7):
        wrote = ckpt.save(step, _state(step), meta={"step": step})
        assert wrote == (step % 2 == 0)
    assert ckpt.all_steps() == [4, 6]   # keep K=2
    assert not ckpt.save(6, _state(6), force=True)  # already there
    # Restore from a fresh manager with an abstract template (eval_shape keeps key dtypes).
    ckpt.close()
    ckpt2 = checkpointing.Checkpointer(tmp_path / "ck", save_every=2, max_to_keep=2)
    abstract = jax.eval_shape(lambda: _state(0))
    state, meta = ckpt2.restore(abstract)
    _same(state, _state(6))
    assert meta == {"step": 6}
    assert jax.dtypes.issubdtype(state.key.dtype, jax.dtypes.prng_key)
    # Restored keys behave like the originals.
    np.testing.assert_array_equal(jax.random.uniform(state.key, (3,)),
                                  jax.random.uniform(_state(6).key, (3,)))
    state4, _ = ckpt2.restore(_state(0), step=4)
    _same(state4, _state(4))
    with pytest.raises(FileNotFoundError, match="step 5"):
        ckpt2.restore(_state(0), step=5)
    ckpt2.close()


def test_interrupted_save_is_ignored(tmp_path):
    d = tmp_path / "ck"
    with checkpointing.Checkpointer(d) as ckpt:
        ckpt.save(3, _state(3))
    # What a SIGKILL in the middle of a save leaves behind.
    (d / "4.orbax-checkpoint-tmp").mkdir()
    (d / "4.orbax-checkpoint-tmp" / "junk").write_text("partial")
    with checkpointing.Checkpointer(d) as ckpt:
        assert ckpt.latest_step() == 3
        state, _ = ckpt.restore(_state(0))
        _same(state, _state(3))


def _strip_manifests(d):
    for m in d.glob(f"*/{checkpointing.MANIFEST_FILE}"):
        m.unlink()


@pytest.mark.parametrize("damage", ["process_data", "merged_data", "meta_json"])
def test_a_step_without_manifest_is_read_back_in_full(tmp_path, damage):
    """Without ``prada_manifest.json`` a step is checked by reading back every key of every
    OCDBT database in it (the per-process ones too: orbax's restore reads only the merged one,
    so a truncated per-process data file was restored without a word) and its JSON metadata.
    An intact manifest-less step still restores exactly; a damaged one is refused by
    ``verify``, ``restore``, ``restore_latest`` (all steps damaged) and ``check_resumable``."""
    d = tmp_path / "ck"
    with checkpointing.Checkpointer(d, max_to_keep=5) as ckpt:
        for step in (1, 2):
            ckpt.save(step, _state(step), meta={"step": step}, force=True)
    _strip_manifests(d)
    checkpointing.check_resumable(d)            # intact: passes, and restores exactly
    with checkpointing.Checkpointer(d) as ckpt:
        assert ckpt.verify(2) is False
        state, meta, step = ckpt.restore_latest(_state(0))
    _same(state, _state(2))
    assert (meta, step) == ({"step": 2}, 2)
    for step in (1, 2):
        root = d / str(step)
        if damage == "meta_json":
            targets = [root / "meta" / "metadata"]
        else:
            want = "d" if damage == "merged_data" else "ocdbt.process_0"
            targets = [f for f in (root / "state").rglob("*") if f.is_file() and
                       f.parent.name == "d" and (f.parent.parent.name == "state") ==
                       (damage == "merged_data") and want in str(f.relative_to(root))]
        assert targets, damage
        for f in targets:
            f.write_bytes(f.read_bytes()[:5])
    with pytest.raises(checkpointing.DamagedCheckpoint, match=r"no intact checkpoint .*step"):
        checkpointing.check_resumable(d)
    with checkpointing.Checkpointer(d) as ckpt:
        with pytest.raises(checkpointing.DamagedCheckpoint, match=r"step 2 is damaged"):
            ckpt.verify(2)
        with pytest.raises(checkpointing.DamagedCheckpoint, match=r"step 2 is damaged"):
            ckpt.restore(_state(0), step=2)
        with pytest.raises(checkpointing.DamagedCheckpoint, match=r"no intact checkpoint"):
            ckpt.restore_latest(_state(0))


def test_mismatched_template_raises(tmp_path):
    with checkpointing.Checkpointer(tmp_path / "ck") as ckpt:
        ckpt.save(1, {"a": jnp.zeros(3)})
        with pytest.raises(ValueError, match="does not match"):
            ckpt.restore({"a": jnp.zeros(3), "b": jnp.zeros(2)})


def test_metric_writer_reads_back(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    with metric_writer.MetricWriter(tmp_path / "tb") as w:
        for step in (10, 20):
            w.write_scalars(step, {"train/loss": step * 0.5, "env/x": np.float32(-1.25)})
        w.write_texts(0, {"config": "lr: 0.1"})
        w.write_images(5, {"eval/img": np.zeros((4, 5, 3), np.uint8)})
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [(e.step, e.value) for e in loss] == [(10, 5.0), (20, 10.0)]
    assert acc.Scalars("env/x")[0].value == -1.25
    assert "eval/img" in acc.Tags()["images"]
    off = metric_writer.MetricWriter(tmp_path / "off", enabled=False)
    off.write_scalars(1, {"a": 1.0})
    assert not (tmp_path / "off").exists()
    assert metric_writer.all_finite({"a": 1.0}) and not metric_writer.all_finite({"a": np.nan})


def test_config_utils_errors_name_fields(tmp_path):
    cfg = ml_collections.ConfigDict({"ppo": {"lr": -1e-3, "mb": 3, "gamma": 1.5, "n": 2.0},
                                     "name": "x"})
    with pytest.raises(config_utils.ConfigError, match=r"config\.ppo\.lr must be > 0"):
        config_utils.check_positive(cfg, "ppo.lr")
    with pytest.raises(config_utils.ConfigError, match=r"config\.ppo\.mb \(3\) must divide"):
        config_utils.check_divides(cfg, "ppo.mb", 8, total_name="batch")
    with pytest.raises(config_utils.ConfigError, match=r"config\.ppo\.gamma must lie in"):
        config_utils.check_range(cfg, "ppo.gamma", 0.0, 1.0)
    with pytest.raises(config_utils.ConfigError, match=r"config\.ppo\.n must be an integer"):
        config_utils.check_int(cfg, "ppo.n")
    with pytest.raises(config_utils.ConfigError, match=r"config\.ppo\.nope is missing"):
        config_utils.get_field(cfg, "ppo.nope")
    with pytest.raises(config_utils.ConfigError, match=r"config\.name must be one of"):
        config_utils.check_choice(cfg, "name", ["a", "b"])
    config_utils.check_divides(cfg, "ppo.mb", 9, total_name="batch")
    path = config_utils.write_config_json(cfg, tmp_path)
    assert json.loads(path.read_text())["ppo"]["lr"] == -1e-3
    assert config_utils.read_config_json(tmp_path).ppo.mb == 3
    with pytest.raises(config_utils.ConfigError, match="unexpected"):
        config_utils.reject_extra_argv(["prog", "stray"])
