"""train.ppo: config validation, CLI errors, smoke run + resume (edge env), non-finite stop,
multi-seed logging, load_policy."""
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from envs import stage1
from prada_jax import config_utils, errors
from prada_jax.rl import policy as policy_files, toy_env, trainer
from prada_jax.configs import ppo as ppo_configs

REPO = Path(__file__).resolve().parents[2]


def _scalars(logdir):
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("field,value,match", [
    ("ppo.lr", -1e-3, r"config\.ppo\.lr must be > 0"),
    ("ppo.minibatch_size", 30, r"config\.ppo\.minibatch_size \(30\) must divide the batch"),
    ("ppo.gamma", 1.5, r"config\.ppo\.gamma must lie in"),
    ("log.checkpoint_every", 3, r"config\.log\.checkpoint_every \(3\) must be a multiple"),
    ("env.reward_mode", "fine", r"config\.env\.reward_mode must be one of"),
    ("num_seeds", 0, r"config\.num_seeds must be >= 1"),
    ("ppo.total_env_steps", 1, r"config\.ppo\.total_env_steps \(1\) must cover"),
], ids=["neg_lr", "minibatch", "gamma", "ckpt_every", "reward_mode", "seeds", "total_steps"])
def test_bad_config_fields_raise_naming_the_field(field, value, match):
    config = ppo_configs.get_config("toy")
    parent, _, leaf = field.rpartition(".")
    node = config_utils.get_field(config, parent) if parent else config
    setattr(node, leaf, value)
    with pytest.raises(config_utils.ConfigError, match=match):
        trainer.validate_config(config)
        stage1.validate_env_config(config)


def test_variants_and_unknown_variant():
    for v in ("", "smoke", "gaokao2023en", "mmlu_stem", "true", "mmlu_stem,true", "toy"):
        trainer.validate_config(ppo_configs.get_config(v))
        stage1.validate_env_config(ppo_configs.get_config(v))
    assert ppo_configs.get_config("mmlu_stem,true").env.reward_mode == "true"
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        ppo_configs.get_config("fast")


def test_cli_rejects_bad_flags(tmp_path, run_command):
    # in-process (the command's __main__); tests/test_cli_errors.py runs train.ppo's real entry
    cfg = "--config=prada_jax/configs/ppo.py:toy"
    code, _, err = run_command("train.ppo", f"--workdir={tmp_path / 'a'}", cfg,
                               "--config.ppo.lrr=1", cwd=REPO)
    assert code != 0 and "lrr" in err and 'Did you mean "lr"' in err
    code, _, err = run_command("train.ppo", f"--workdir={tmp_path / 'b'}", cfg,
                               "--config.ppo.lr=-0.1", cwd=REPO)
    assert code == 2 and "config.ppo.lr must be > 0" in err
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_smoke_cli_two_chunks_then_resume(tmp_path, run_command):
    """The :smoke config on the edge env: one chunk, stop; rerun resumes at the saved step.
    In-process (the command's ``__main__``; tests/test_cli_errors.py runs train.ppo's real
    entry in a subprocess): the rerun loads the compiled chunk from the session's cache."""
    wd = tmp_path / "run"   # compiled programs: the session's cache (tests/conftest.py)
    cfg = "--config=prada_jax/configs/ppo.py:smoke"
    code, out, err = run_command("train.ppo", f"--workdir={wd}", cfg, "--max_chunks=1",
                                 cwd=REPO)
    assert code == 0, err[-3000:]
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == [2]
    code, out, err = run_command("train.ppo", f"--workdir={wd}", cfg, cwd=REPO)
    assert code == 0, err[-3000:]
    assert "resumed" in err and "at update 2" in err
    assert "done: update 4" in out
    steps = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [2, 4]
    config = json.loads((wd / "config.json").read_text())
    assert config["env"]["problems"] == 300 and config["ppo"]["updates_per_chunk"] == 2
    meta = json.loads((wd / "policy_meta.json").read_text())
    assert meta["obs_dim"] == 18 and meta["traces"]["feature_dim"] == 16
    assert meta["traces"]["synthetic"] is True
    sc = _scalars(wd / "tb")
    for tag in ("train/policy_loss", "train/value_loss", "train/approx_kl", "train/clip_frac",
                "train/entropy", "train/explained_variance", "train/episode_return",
                "train/nominate_rate", "env/offload_rate"):
        assert tag in sc, tag
    # each process's first chunk compiles: it gets no steps/s point (one chunk per call here)
    assert "train/steps_per_second" not in sc
    per_chunk = 4 * 16 * 2
    assert [s for s, _ in sc["train/policy_loss"]] == [per_chunk, 2 * per_chunk]
    assert all(math.isfinite(v) for _, v in sc["train/policy_loss"])
    policy, config = policy_files.load_policy(wd, action_fn=stage1.edge_action)
    assert policy.meta["step"] == 4
    obs = np.zeros((4, 18), np.float32)
    gain = policy.advantage_fn(policy.params, obs)
    assert gain.shape == (4,)
    action = policy.act_fn(policy.params, jax.random.key(0), obs)
    assert action.screen.shape == (4,) and np.allclose(action.gain, gain)
    with pytest.raises(FileNotFoundError, match="step 3"):
        policy_files.load_policy(wd, step=3)


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path):
    config = ppo_configs.get_config("toy")
    config.num_seeds = 2
    out = trainer.train_and_evaluate(config, tmp_path, stage1.build_setup(config), max_chunks=1)
    assert out["update_step"] == 2
    assert (tmp_path / "tb" / "seed0").is_dir() and (tmp_path / "tb" / "seed1").is_dir()
    r0, r1 = (_scalars(tmp_path / "tb" / f"seed{s}") for s in (0, 1))
    assert r0["train/policy_loss"] != r1["train/policy_loss"]
    env, params = toy_env.make(num_users=4, threshold=float("nan"))
    with pytest.raises(errors.NonFiniteTraining, match=r"train/\w+ \(seed \d\) in updates 3\.\.4; stopping; the last good checkpoint \(step 2\)"):
        trainer.train_and_evaluate(config, tmp_path, env_and_params=(env, params))
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [2]
    # The kept checkpoint loads, per seed.
    p1, _ = policy_files.load_policy(tmp_path, seed_index=1)
    assert p1.meta["seed"] == 1 and p1.meta["step"] == 2
    with pytest.raises(ValueError, match="seed_index 2"):
        policy_files.load_policy(tmp_path, seed_index=2)
