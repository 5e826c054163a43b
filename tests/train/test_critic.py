"""``train.critic_refit`` end to end on a smoke PPO run: the refit folder loads as a policy, the
actor is unchanged, the report has both comparisons, and the same arguments give the same
report (CPU). Slow: it trains a smoke policy first."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
               JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1200)


@pytest.mark.slow
def test_refit_command_writes_a_loadable_policy_with_the_same_actor(tmp_path):
    ppo = tmp_path / "ppo"
    p = _run(["train.ppo", f"--config={REPO}/prada_jax/configs/ppo.py:smoke", f"--workdir={ppo}"],
             REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        p = _run(["train.critic_refit", f"--policy={ppo}", f"--out={out}", "--fit_states=300",
                  "--eval_states=200", "--steps=100", "--sampling_replicates=4"], REPO)
        assert p.returncode == 0, p.stderr[-3000:]
        outs.append(out)
    rep = json.loads((outs[0] / "critic_check.json").read_text())
    assert set(rep["before"]) >= {"greedy", "sampling"} and set(rep["after"]) >= {"greedy"}
    assert rep["before"]["unfinished"] == 0 and rep["reward_mode"] == "coarse"
    assert rep["before"]["greedy"]["n"] == 200
    # Judged (and early-stopped) on the validation split with validation seeds; the MC
    # regression targets on the policy's training problems.
    from prada_jax.traces import splits
    assert rep["split"] == "validation" and rep["refit"]["held_out_split"] == "validation"
    assert rep["judge_seed0"] == splits.VALIDATION_SEED_BASE + rep["seed"]
    assert 0 < rep["judge_problems"] < rep["traces"]["problems_total"]
    assert (outs[0] / "critic_check.json").read_text() == \
        (outs[1] / "critic_check.json").read_text()      # same seed → same numbers

    from prada_jax.rl import policy as policy_files
    old, _ = policy_files.load_policy(ppo)
    new, _ = policy_files.load_policy(outs[0])
    assert new.meta["critic_refit"]["source"] == str(ppo)
    assert new.meta["step"] == old.meta["step"]
    obs = jax.random.normal(jax.random.key(0), (64, int(old.meta["obs_dim"])))
    lo, qo = old.apply_fn(old.params, obs)
    ln, qn = new.apply_fn(new.params, obs)
    np.testing.assert_array_equal(np.asarray(lo), np.asarray(ln))   # the actor is unchanged
    assert not np.array_equal(np.asarray(qo), np.asarray(qn))      # the critic is not
    # A second refit into a folder that is not a refit is refused (exit 2, one line).
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "x.txt").write_text("x")
    p = _run(["train.critic_refit", f"--policy={ppo}", f"--out={junk}"], REPO)
    assert p.returncode == 2 and "--out=" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_unknown_split_is_refused_before_anything_is_written(tmp_path):
    from prada_jax.errors import BadInput
    from train import critic as critic_refit

    with pytest.raises(BadInput, match="--split=tset"):
        critic_refit.check_and_refit(str(tmp_path / "ppo"), str(tmp_path / "out"), split="tset")
    assert not (tmp_path / "out").exists()
