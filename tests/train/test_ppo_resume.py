"""Exact resume: a train.ppo run killed with SIGKILL mid-training and restarted on the same
workdir ends with the same parameters and metrics as an uninterrupted run (CPU, same seed)."""
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from prada_jax.rl import policy as policy_files
from tests.helpers.kill import kill_after_checkpoint

REPO = Path(__file__).resolve().parents[2]
FLAGS = ["--config=prada_jax/configs/ppo.py:smoke", "--config.ppo.total_env_steps=512",
         "--config.log.checkpoint_every=2"]   # 8 updates = 4 chunks, a checkpoint per chunk


def _env(cache):
    return dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
                JAX_COMPILATION_CACHE_DIR=str(cache), JAX_DISABLE_MOST_OPTIMIZATIONS="1")


def _scalars(logdir):
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    # Every point: the resumed run marks its restart, so the reader drops the points the killed
    # run wrote past its last checkpoint and each step appears once.
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    cache = tmp_path / "jax_cache"
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "killed"
    cmd = [sys.executable, "-m", "train.ppo"]
    r = subprocess.run(cmd + FLAGS + [f"--workdir={ref_dir}"], cwd=REPO, env=_env(cache),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]

    ckpt = run_dir / "checkpoints"
    steps = kill_after_checkpoint(cmd + FLAGS + [f"--workdir={run_dir}"], REPO, _env(cache),
                                  ckpt, 4)
    assert 8 not in steps, steps

    r = subprocess.run(cmd + FLAGS + [f"--workdir={run_dir}"], cwd=REPO, env=_env(cache),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed" in r.stderr

    ref, _ = policy_files.load_policy(ref_dir)
    got, _ = policy_files.load_policy(run_dir)
    assert ref.meta["step"] == got.meta["step"] == 8
    for a, b in zip(jax.tree.leaves(ref.params), jax.tree.leaves(got.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    sa, sb = _scalars(ref_dir / "tb"), _scalars(run_dir / "tb")
    assert set(sa) == set(sb)
    for tag in sa:
        if tag == "train/steps_per_second":
            continue
        assert sa[tag] == sb[tag], tag
    assert len(sa["train/policy_loss"]) == 4
    for name in ("config.json", "policy_meta.json"):
        assert (ref_dir / name).read_text() == (run_dir / name).read_text(), name
