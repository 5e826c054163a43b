"""Resume contract of the PPO and dual trainers (prada_jax.runloop + prada_jax.run_state):
a run resumed after a checkpoint (with curve points written past it, as a SIGKILL leaves them)
ends with the same parameters, every curve point and the same output files as an
uninterrupted run; a changed computational field is refused before anything is written; a
finished run rerun reports its stored final metrics."""
import json
import shutil

import jax
import numpy as np
import pytest

from envs import stage1, stage2
from prada_jax import checkpointing, errors, run_state
from prada_jax.dual import trainer as dual_trainer
from prada_jax.rl import policy as policy_files, trainer
from train import ppo as ppo_launcher
from prada_jax.configs import dual as dual_configs
from prada_jax.configs import ppo as ppo_configs

TIMING = ("train/steps_per_second", "perf/chunks_per_s")


def _curves(logdir) -> dict:
    """Every point per tag after TensorBoard's reader drops the points a resumed run
    rewrote; wall-clock tags (which differ by nature) are left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]
            if t not in TIMING}


def _untimed(scalars):
    if isinstance(scalars, dict):
        return {k: v for k, v in scalars.items() if k not in TIMING}
    return [_untimed(s) for s in scalars]


def _files_equal(a, b, names):
    for n in names:
        assert (a / n).read_text() == (b / n).read_text(), n


# Compile flags: the session's (tests/conftest.py); a per-test jax_disable_most_optimizations
# toggle would give the programs other cache keys than the same programs compiled by
# test_exit_codes.py / test_ppo.py, so each would be compiled twice.


def _ppo_config():
    c = ppo_configs.get_config("toy")
    c.ppo.total_env_steps = 4 * 8 * 8      # 8 updates = 4 chunks of 2
    c.log.checkpoint_every = 4
    c.ppo.lr_schedule = "constant"         # so that the total may be extended on resume
    return c


def test_ppo_resume_after_a_checkpoint_equals_uninterrupted(tmp_path):
    ref = trainer.train_and_evaluate(_ppo_config(), tmp_path / "ref",
                                     stage1.build_setup(_ppo_config()))
    part = trainer.train_and_evaluate(_ppo_config(), tmp_path / "run",
                                      stage1.build_setup(_ppo_config()), max_chunks=3)
    assert part["stopped_by"] == "max_calls" and part["update_step"] == 6
    # As a SIGKILL after checkpoint 4 and after chunk 3's curves would leave it:
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "6")
    got = trainer.train_and_evaluate(_ppo_config(), tmp_path / "run",
                                     stage1.build_setup(_ppo_config()))
    assert got["start_update"] == 4 and got["update_step"] == 8 and got["finished"]
    for a, b in zip(jax.tree.leaves(ref["states"].params), jax.tree.leaves(got["states"].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ca, cb = _curves(tmp_path / "ref" / "tb"), _curves(tmp_path / "run" / "tb")
    assert ca == cb and len(ca["train/policy_loss"]) == 4
    _files_equal(tmp_path / "ref", tmp_path / "run", ("config.json", "policy_meta.json"))
    assert _untimed(ref["scalars"]) == _untimed(got["scalars"])

    # rerun of the finished run: nothing to do, the stored final metrics, never NaN
    again = trainer.train_and_evaluate(_ppo_config(), tmp_path / "run",
                                       stage1.build_setup(_ppo_config()))
    assert again["finished"] and again["start_update"] == again["update_step"] == 8
    assert again["scalars"] == got["scalars"]
    line = ppo_launcher.summary_line(again)
    assert line.startswith("already finished") and "nan" not in line.lower()


def test_ppo_resume_refuses_a_changed_computation_and_records_extensions(tmp_path):
    trainer.train_and_evaluate(_ppo_config(), tmp_path,
                               stage1.build_setup(_ppo_config()), max_chunks=1)
    before = {n: (tmp_path / n).read_text() for n in ("config.json", "policy_meta.json",
                                                      "run.json")}
    bad = _ppo_config()
    bad.seed = 1
    bad.net.hidden = (16,)
    with pytest.raises(run_state.ConfigMismatch) as e:
        trainer.train_and_evaluate(bad, tmp_path, stage1.build_setup(bad))
    assert isinstance(e.value, errors.BadInput)
    assert "seed: 0 → 1" in str(e.value) and "net.hidden: [32, 32] → [16]" in str(e.value)
    assert {n: (tmp_path / n).read_text() for n in before} == before
    longer = _ppo_config()
    longer.ppo.total_env_steps = 4 * 8 * 10
    longer.log.checkpoint_every = 2
    out = trainer.train_and_evaluate(longer, tmp_path, stage1.build_setup(longer))
    assert out["update_step"] == 10
    prov = run_state.read_run_meta(tmp_path)["provenance"]
    assert [p["event"] for p in prov] == ["start", "resume"]
    assert prov[1]["changed"] == {"log.checkpoint_every": [4, 2],
                                  "ppo.total_env_steps": [256, 320]}
    # with a decaying schedule the total is part of the computation
    sched = _ppo_config()
    sched.ppo.lr_schedule = "linear"
    assert "ppo.total_env_steps" not in trainer.observational_fields(sched)

    # load_policy: a damaged latest step is reported naming the file (never skipped), and a
    # folder without checkpoints/ is refused without creating anything in it
    data = [p for p in (tmp_path / "checkpoints" / "10" / "state").rglob("*")
            if p.is_file() and p.parent.name == "d"]
    for p in data:
        p.write_bytes(p.read_bytes()[:3])
    with pytest.raises(checkpointing.DamagedCheckpoint,
                       match=r"step 10 is damaged: .*truncated"):
        policy_files.load_policy(tmp_path)
    assert policy_files.load_policy(tmp_path, step=8)[0].meta["step"] == 8
    bare = tmp_path / "bare"
    bare.mkdir()
    for n in ("config.json", "policy_meta.json"):
        shutil.copy(tmp_path / n, bare / n)
    with pytest.raises(checkpointing.MissingCheckpoint):
        policy_files.load_policy(bare)
    assert sorted(p.name for p in bare.iterdir()) == ["config.json", "policy_meta.json"]


def _dual_config(chunks=3):
    c = dual_configs.get_config("smoke")
    c.train.num_chunks = chunks
    c.eval.gap_slots = 0          # the gap evaluation is covered by test_dual_launcher.py
    return c


def test_dual_resume_after_a_checkpoint_equals_uninterrupted(tmp_path):
    ref = dual_trainer.train_and_evaluate(_dual_config(), tmp_path / "ref",
                                          stage2.build_setup(_dual_config()))
    part = dual_trainer.train_and_evaluate(_dual_config(), tmp_path / "run",
                                           stage2.build_setup(_dual_config()), max_chunks=2)
    assert part["chunk"] == 2 and not part["finished"]
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "2")   # killed after checkpoint 1
    got = dual_trainer.train_and_evaluate(_dual_config(), tmp_path / "run",
                                          stage2.build_setup(_dual_config()))
    assert got["start_chunk"] == 1 and got["chunk"] == 3
    assert got["multipliers"] == ref["multipliers"]
    assert _untimed(got["scalars"]) == _untimed(ref["scalars"])
    assert _curves(tmp_path / "ref" / "tb") == _curves(tmp_path / "run" / "tb")
    _files_equal(tmp_path / "ref", tmp_path / "run", ("config.json",))
    ma, mb = (json.loads((tmp_path / d / "multipliers.json").read_text()) for d in ("ref", "run"))
    assert ma == mb
    again = dual_trainer.train_and_evaluate(_dual_config(), tmp_path / "run",
                                            stage2.build_setup(_dual_config()))
    assert again["finished"] and again["start_chunk"] == 3
    assert again["scalars"] == got["scalars"]
    bad = _dual_config()
    bad.dual.learning_rate = 123.0
    with pytest.raises(run_state.ConfigMismatch, match="dual.learning_rate"):
        dual_trainer.train_and_evaluate(bad, tmp_path / "run", stage2.build_setup(bad))


def test_drop_removed_fields_deletes_only_the_listed_paths():
    """``config_utils.REMOVED_FIELDS`` is the one list of removed fields; dropping them leaves
    every other field (same name elsewhere included) and the caller's dict unchanged."""
    from prada_jax import config_utils

    assert "dual.queue_price" in config_utils.REMOVED_FIELDS
    stored = {"dual": {"queue_price": True, "mode": "pid"}, "env": {"queue_price": 1},
              "seed": 0}
    out = config_utils.drop_removed_fields(stored)
    assert out == {"dual": {"mode": "pid"}, "env": {"queue_price": 1}, "seed": 0}
    assert stored["dual"] == {"queue_price": True, "mode": "pid"}  # not mutated
    assert config_utils.drop_removed_fields({"ppo": {"lr": 1.0}}) == {"ppo": {"lr": 1.0}}
    assert config_utils.drop_removed_fields({"dual": 3}) == {"dual": 3}


def test_config_json_with_a_removed_field_still_resumes(tmp_path):
    """A dual run whose config.json was written while ``dual.queue_price`` existed resumes to
    the same result as one that never had it; ``read_config_json`` drops it too (the config
    loads into the learner), and a changed live field is still refused."""
    from prada_jax import config_utils

    ref = dual_trainer.train_and_evaluate(_dual_config(chunks=2), tmp_path / "ref",
                                          stage2.build_setup(_dual_config(chunks=2)))
    dual_trainer.train_and_evaluate(_dual_config(chunks=2), tmp_path / "old",
                                    stage2.build_setup(_dual_config(chunks=2)), max_chunks=1)
    path = tmp_path / "old" / "config.json"
    stored = json.loads(path.read_text())
    stored["dual"]["queue_price"] = True     # as written before the field was removed
    path.write_text(json.dumps(stored, indent=2, sort_keys=True))
    loaded = config_utils.read_config_json(tmp_path / "old")
    assert "queue_price" not in loaded.dual
    dual_trainer.validate_config(loaded)
    got = dual_trainer.train_and_evaluate(_dual_config(chunks=2), tmp_path / "old",
                                          stage2.build_setup(_dual_config(chunks=2)))
    assert got["start_chunk"] == 1 and got["finished"]
    assert got["multipliers"] == ref["multipliers"]
    bad = _dual_config(chunks=2)
    bad.dual.step_size = 0.5
    with pytest.raises(run_state.ConfigMismatch, match="dual.step_size") as e:
        dual_trainer.train_and_evaluate(bad, tmp_path / "old", stage2.build_setup(bad))
    assert "queue_price" not in str(e.value)



def test_checkpoint_template_mismatch_is_found_before_config_json_is_rewritten(tmp_path):
    """Both trainers restore the checkpoint against their template before they rewrite
    config.json, append to run.json or rewrite policy_meta.json. Each folder is given the other
    trainer's (intact) checkpoints, which ``check_resume``'s file-level check passes and only a
    restore can refuse; a resume with a changed observational field then raises
    ``CheckpointError`` and leaves those files as they were (before the fix config.json
    already held the new value and run.json a "resume" entry when the restore failed)."""
    files = {"ppo": ("config.json", "run.json", "policy_meta.json"),
             "dual": ("config.json", "run.json")}
    trainer.train_and_evaluate(_ppo_config(), tmp_path / "ppo",
                               stage1.build_setup(_ppo_config()), max_chunks=1)
    dual_trainer.train_and_evaluate(_dual_config(), tmp_path / "dual",
                                    stage2.build_setup(_dual_config()), max_chunks=1)
    before = {k: {n: (tmp_path / k / n).read_text() for n in names}
              for k, names in files.items()}
    (tmp_path / "ppo" / "checkpoints").rename(tmp_path / "swap")
    (tmp_path / "dual" / "checkpoints").rename(tmp_path / "ppo" / "checkpoints")
    (tmp_path / "swap").rename(tmp_path / "dual" / "checkpoints")
    longer = _ppo_config()
    longer.ppo.total_env_steps = 4 * 8 * 10      # observational (constant schedule)
    with pytest.raises(checkpointing.CheckpointError):
        trainer.train_and_evaluate(longer, tmp_path / "ppo", stage1.build_setup(longer))
    more = _dual_config(chunks=4)                # train.num_chunks is observational
    with pytest.raises(checkpointing.CheckpointError):
        dual_trainer.train_and_evaluate(more, tmp_path / "dual", stage2.build_setup(more))
    after = {k: {n: (tmp_path / k / n).read_text() for n in names}
             for k, names in files.items()}
    assert after == before
