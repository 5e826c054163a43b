"""train.dual launcher + prada_jax.dual library: :smoke config, checkpoints + curves,
exact resume, exports, bad flags, no absl flags defined at import."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs import stage2
from prada_jax import config_utils
from prada_jax.errors import BadInput
from prada_jax.dual import files, problem, trainer
from prada_jax.traces import splits
from prada_jax.traces.loader import load_config_traces
from prada_jax.configs import dual as dual_configs
from tests.helpers.kill import kill_after_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_smoke_run_resumes_exactly_and_exports(tmp_path):
    cfg = dual_configs.get_config("smoke")
    # Split run: one chunk, then resume to the end (2 chunks).
    r1 = trainer.train_and_evaluate(cfg, tmp_path / "split", stage2.build_setup(cfg), max_chunks=1)
    assert r1["chunk"] == 1 and "gap" not in r1
    assert (tmp_path / "split/checkpoints/1").is_dir()
    r2 = trainer.train_and_evaluate(cfg, tmp_path / "split", stage2.build_setup(cfg))
    assert r2["chunk"] == 2
    # The multipliers are a choice: learned on the validation split with validation seeds.
    assert r2["split"] == "validation"
    assert r2["seed_range_start"] == splits.VALIDATION_SEED_BASE + cfg.seed
    # (a straight run to compare with: tests/train/test_resume_contract.py::
    # test_dual_resume_after_a_checkpoint_equals_uninterrupted)

    m = files.load_multipliers(tmp_path / "split")
    assert isinstance(m, problem.Multipliers) and m.lambda_s >= 0 and m.mu >= 0
    np.testing.assert_allclose([m.lambda_s, m.mu], list(r2["multipliers"]), rtol=1e-6)
    saved = json.loads((tmp_path / "split/multipliers.json").read_text())
    assert saved["final"] and saved["synthetic_traces"] and saved["chunk"] == 2
    gap = json.loads((tmp_path / "split/gap.json").read_text())
    assert gap["slots"] == cfg.eval.gap_slots and gap["infeasible"] == 0
    assert gap["positive_slots"] > 0 and 0.0 < gap["mean"] <= 1.0 + 1e-9   # NaN fails
    assert (gap["lambda_s"], gap["mu"]) == (m.lambda_s, m.mu)   # measured with the export
    assert config_utils.read_config_json(tmp_path / "split").env.num_servers == 1

    tb = _scalars(tmp_path / "split/tb")
    for tag in ("dual/lambda_s", "dual/mu", "dual/excess_units", "dual/relaxed_minus_hard",
                "env/reward_per_slot", "dual/rollout_excess_units"):
        assert len(tb[tag]) == 2, tag  # one point per chunk across the two invocations
    np.testing.assert_allclose(tb["dual/lambda_s"][-1], r2["scalars"]["dual/lambda_s"])
    np.testing.assert_allclose(tb["dual/export_lambda_s"][-1], m.lambda_s, rtol=1e-6)
    assert "eval/gap_mean" in tb

    # benchmarks.duality_gap rebuilds the run's scenario through the library: with the
    # trainer's evaluation settings (sizes, seed) it measures the same gap as gap.json
    # (same sizes: the compiled rollouts are reused)
    from benchmarks import duality_gap

    out = tmp_path / "bench_gap.json"
    assert duality_gap.main([
        "--workdir", str(tmp_path / "split"), "--slots", str(cfg.eval.gap_slots), "--envs",
        str(cfg.eval.gap_envs), "--env_chunks", str(cfg.eval.env_chunks),
        "--seed", str(trainer.learner_seed(cfg) + 1), "--out", str(out)]) == 0
    bench = json.loads(out.read_text())
    assert bench["slots"] == cfg.eval.gap_slots and bench["infeasible"] == 0
    assert bench["zero_infeasible"] == 0
    np.testing.assert_allclose([bench["lambda_s"], bench["mu"]], [m.lambda_s, m.mu], rtol=1e-6)
    for k in ("mean", "p5", "min", "pooled", "positive_slots", "zero_mean", "milp_slots"):
        assert bench[k] == gap[k], k
    assert bench["env"] == gap["env"] and bench["fifo_env"] == gap["fifo_env"]

    # The finished run, its steps without prada_manifest.json and their per-process data files
    # truncated (orbax's restore reads only the merged database, so this went unnoticed): the
    # rerun refuses it as a resume does (exit 2, one line), instead of "already finished",
    # and writes nothing (no run.json entry, no new TensorBoard file).
    import shutil

    from prada_jax import checkpointing

    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "split", damaged)
    for step_dir in (damaged / "checkpoints").iterdir():
        (step_dir / checkpointing.MANIFEST_FILE).unlink()
        for f in step_dir.glob("state/ocdbt.process_*/d/*"):
            f.write_bytes(f.read_bytes()[:10])
    before = {p: p.stat().st_mtime_ns for p in damaged.rglob("*")}
    with pytest.raises(checkpointing.DamagedCheckpoint,
                       match=r"no intact checkpoint .*ocdbt\.process_0 does not read back"):
        trainer.train_and_evaluate(cfg, damaged, stage2.build_setup(cfg))
    assert {p: p.stat().st_mtime_ns for p in damaged.rglob("*")} == before


def test_load_multipliers_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="multipliers.json: missing"):
        files.load_multipliers(tmp_path)
    for text, match in (('{"lambda_s": -1, "mu": 0}', "lambda_s"),
                        ('{"lambda_s": 0.5}', "field 'mu' must be a finite number >= 0, got None"),
                        ("{not json", "multipliers.json: not valid JSON")):
        (tmp_path / "multipliers.json").write_text(text)
        with pytest.raises(ValueError, match=match):
            files.load_multipliers(tmp_path)
    (tmp_path / "multipliers.json").write_text('{"lambda_s": 0.5, "mu": 2e-8, "scenario": "x"}')
    m, info = files.read_multipliers(tmp_path)
    assert (m.lambda_s, m.mu, info) == (0.5, 2e-8, {"scenario": "x"})


@pytest.mark.parametrize("field,value", [("env.num_servers", "0"), ("dual.mode", "adam"),
                                         ("train.num_envs", "0"),
                                         ("dual.temperature", "-1.0"),
                                         ("env.split", "tset"), ("seed", "999999")],
                         ids=["servers", "mode", "envs", "temperature", "split", "seed"])
def test_bad_config_is_refused_naming_the_field(tmp_path, field, value):
    cfg = dual_configs.get_config("smoke")
    node = cfg
    *parents, leaf = field.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = type(node[leaf])(value) if not isinstance(node[leaf], str) else value
    with pytest.raises(BadInput, match=f"config.{field}"):
        trainer.train_and_evaluate(cfg, tmp_path / "bad", stage2.build_setup(cfg))
    assert not (tmp_path / "bad").exists()


def test_learner_seed_lies_in_the_range_of_its_split():
    """Validation (default) and test learners draw from their own seed ranges, disjoint from
    the training seeds [0, 1e6) of train.ppo (prada_jax.traces.splits)."""
    cfg = dual_configs.get_config("smoke")
    assert cfg.env.split == "validation"
    cfg.seed = 7
    assert trainer.learner_seed(cfg) == splits.VALIDATION_SEED_BASE + 7
    for split, base in (("test", splits.TEST_SEED_BASE), ("train", 0), ("all", 0)):
        cfg.env.split = split
        assert trainer.learner_seed(cfg) == base + 7
    lo, hi = splits.VALIDATION_SEED_BASE, splits.TEST_SEED_BASE
    cfg.env.split = "validation"
    assert lo <= trainer.learner_seed(cfg) and trainer.learner_seed(cfg) + 1 < hi


# (M = 0 through train.dual: tests/test_cli_errors.py, which also runs its real entry)


def test_cli_policy_flag_reaches_the_config(tmp_path, run_command):
    # --policy overrides config.policy_dir: a folder that is no train.ppo run is refused
    # (exit 2) with a message naming the missing file inside it. In-process (__main__).
    missing = tmp_path / "no_ppo_run"
    code, _, err = run_command("train.dual", "--config=prada_jax/configs/dual.py:smoke",
                               f"--workdir={tmp_path / 'cli'}", f"--policy={missing}", cwd=REPO)
    proc = subprocess.CompletedProcess("train.dual", code, "", err)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error:" in proc.stderr and str(missing) in proc.stderr


def test_import_defines_no_absl_flags():
    # absl.app / absl.logging define their own flags (verbosity, ...) when imported; train.dual
    # must add none, and the library none of its own (orbax and chex, which it imports, define
    # theirs), so another absl program (with its own --config/--workdir) can import them. Run
    # in a fresh interpreter: this test process may have other flags.
    code = """
import absl.app, absl.logging
from absl import flags
import ml_collections.config_flags
before = set(flags.FLAGS)
import train.dual
added = set(flags.FLAGS) - before
assert not added, sorted(added)
import prada_jax.dual.trainer
ours = [f for f in set(flags.FLAGS) - before
        if flags.FLAGS.find_module_defining_flag(f).startswith(("prada_jax", "train", "envs"))]
assert not ours, ours
flags.DEFINE_string("workdir", None, "a host program's own --workdir")
flags.DEFINE_string("config", None, "a host program's own --config")
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown variant"):
        dual_configs.get_config("smok")


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_matches_uninterrupted(tmp_path):
    """train.dual killed with SIGKILL after checkpoint 3 has committed, rerun on the same
    workdir: the same final state, every curve point (timing left out) and the same
    multipliers.json / gap.json / config.json as an uninterrupted run."""
    import os

    import jax
    from prada_jax import checkpointing

    flags = ["--config=prada_jax/configs/dual.py:smoke", "--config.train.num_chunks=30"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"))
    cmd = [sys.executable, "-m", "train.dual"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    r = subprocess.run(cmd + flags + [f"--workdir={ref}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = kill_after_checkpoint(cmd + flags + [f"--workdir={run}"], REPO, env,
                                  run / "checkpoints", 3, poll_s=0.01)
    assert 3 <= steps[-1] < 30, steps
    r = subprocess.run(cmd + flags + [f"--workdir={run}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed" in r.stderr

    def curves(d):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
        acc.Reload()
        return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]
                if not t.startswith("perf/")}
    ca, cb = curves(ref / "tb"), curves(run / "tb")
    assert ca == cb and len(ca["dual/lambda_s"]) == 30
    for name in ("multipliers.json", "gap.json", "config.json"):
        assert (ref / name).read_text() == (run / name).read_text(), name
    cfg = dual_configs.get_config("smoke")
    template = stage2.build_setup(cfg).init_carry(0)
    states = []
    for d in (ref, run):
        ck = checkpointing.Checkpointer(d / "checkpoints", create=False)
        states.append(ck.restore(template, 30)[0])
        ck.close()
    for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_policy_reward_mode_is_read_from_policy_meta(tmp_path, run_command):
    """The scheduler's value accounting follows the policy's training reward: read from
    policy_meta.json, ``coarse`` when the field is absent (older policies) or without a
    policy; an unknown mode is refused before anything is written (exit 2, naming the file)."""
    from prada_jax.errors import BadInput

    cfg = dual_configs.get_config("smoke")
    assert stage2.policy_reward_mode(cfg) == "coarse"
    pdir = tmp_path / "ppo"
    pdir.mkdir()
    meta = pdir / "policy_meta.json"
    for written, want in (({"reward_mode": "true"}, "true"), ({}, "coarse")):
        meta.write_text(json.dumps(written))
        cfg.policy_dir = str(pdir)
        assert stage2.policy_reward_mode(cfg) == want
        params = stage2.build_env_params(cfg, load_config_traces(cfg)[0])
        assert bool(params.policy_true_reward) is (want == "true")
    meta.write_text(json.dumps({"reward_mode": "dense"}))
    with pytest.raises(BadInput, match="policy_meta.json: reward_mode"):
        stage2.policy_reward_mode(cfg)
    code, _, err = run_command("train.dual", "--config=prada_jax/configs/dual.py:smoke",
                               f"--workdir={tmp_path / 'cli'}", f"--policy={pdir}", cwd=REPO)
    proc = subprocess.CompletedProcess("train.dual", code, "", err)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "reward_mode" in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "cli").exists()
