"""train.main: its config (prada_jax/configs/main.py), the --seeds rule, the parts' cache,
table-point rule and trace summary part (train.parts; fast); the whole --smoke pipeline, its
rerun reusing every part, and evals.run on its checkpoint (slow)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

from train.parts import cache, tables, training
from prada_jax import config_utils
from prada_jax.configs import main as main_cfg
from prada_jax.configs import ppo as ppo_cfg
from prada_jax.presets import BENCHMARKS as PRESETS
from prada_jax.traces import splits
from train import main as tm

REPO = Path(__file__).resolve().parents[2]


def test_config_variants():
    demo, smoke, full = (main_cfg.get_config(m) for m in ("demo", "smoke", "full"))
    assert main_cfg.get_config().to_dict() == demo.to_dict()
    assert (demo.mode, smoke.mode, full.mode) == ("demo", "smoke", "full")
    assert list(demo.benchmarks) == ["gsm8k"] and list(full.benchmarks) == list(PRESETS)
    assert smoke.eval.seeds == 2 and demo.eval.seeds == 5
    assert full.calibration.stress_miscalibration == 1.0
    assert demo.calibration.stress_miscalibration == smoke.calibration.stress_miscalibration == 0
    # The sweep reuses the table's compiled rollout only if the static sizes match.
    keys = ("seeds", "slots", "warmup_slots", "drain_slots")
    assert [smoke.sweep[k] for k in keys] == [smoke.eval[k] for k in keys]
    # Issue 32: the load curve is the headline of the old scenario (the 8 seeds a crossover
    # needs); the stage-2 verdict is its own study (studies.stage2_verdict), no part here.
    assert all("stage2" not in c for c in (demo, smoke, full))
    assert demo.curve.seeds >= 8 and full.curve.seeds >= 8
    # The pre-registered grids (studies/load_curve): 2^(k/2), k = -8..2 (demo) and
    # k = -10..6 (full), geometric so one grid spans clocks whose capacities differ by 10x.
    assert demo.curve.loads_per_server_hz == pytest.approx(
        [2 ** (k / 2) for k in range(-8, 3)], rel=1e-5)
    assert full.curve.loads_per_server_hz == pytest.approx(
        [2 ** (k / 2) for k in range(-10, 7)], rel=1e-5)
    assert demo.curve.num_users == 32
    # The demo skips the M/B sweep (≈ 90 of its CPU seconds); --full and evals.sweep keep it.
    assert not demo.sweep.axes and len(full.sweep.axes) == 3
    # Issue 52: the demo's headline is the frontier (make demo's second command, below), not
    # issue 42's capacity part; the old scenario runs in full/smoke.
    assert (demo.capacity_size, demo.legacy_parts) == ("", False)
    assert smoke.legacy_parts and full.legacy_parts and not full.capacity_size
    # Issue 23: tables on test, choices (critic refit, dual learner) on validation.
    for c in (demo, smoke, full):
        assert c.split == "test" and c.choice_split == "validation"
    with pytest.raises(ValueError, match="huge"):
        main_cfg.get_config("huge")


def test_seeds_flag_rule():
    demo, smoke = main_cfg.get_config("demo"), main_cfg.get_config("smoke")
    tm.apply_seeds(demo, 3)
    assert (demo.eval.seeds, demo.sweep.seeds, demo.curve.seeds) == (3, 3, 8)
    tm.apply_seeds(smoke, 3)
    assert (smoke.eval.seeds, smoke.sweep.seeds, smoke.curve.seeds) == (3, 3, 3)
    tm.apply_seeds(demo, 12)
    assert demo.curve.seeds == 12


def test_demo_ppo_config_is_the_default_with_150_updates():
    """What the demo trains: ppo.py's default config of the preset with 150 instead of 300
    updates (E·T = 16·64 env slots each), generator seed 0, the progress bar on."""
    got = training.ppo_config(main_cfg.get_config("demo"), "gsm8k")
    ref = ppo_cfg.get_config("gsm8k")
    ref.ppo.total_env_steps = ref.ppo.num_envs * ref.ppo.rollout_len * 150
    ref.env.trace_seed = 0
    ref.log.progress = True
    assert got.to_dict() == ref.to_dict()
    # smoke: ppo.py's smoke variant on the legacy server, 60 problems
    got = training.ppo_config(main_cfg.get_config("smoke"), "gsm8k")
    ref = ppo_cfg.get_config("smoke,gsm8k")
    ref.env.server_model, ref.env.problems, ref.env.trace_seed = "legacy", 60, 0
    ref.log.progress = True
    assert got.to_dict() == ref.to_dict()


def test_table_points_rule():
    """Uncontended: the largest load with the LLM alone's ρ ≤ 0.3; contended: the stable load
    (ρ < 1) with ρ nearest 0.9 (here 0.95 beats 0.8; 1.2 is unstable)."""
    rho = {0.125: 0.05, 0.25: 0.12, 0.5: 0.28, 1.0: 0.55, 1.5: 0.8, 2.0: 0.95, 3.0: 1.2}
    assert tables.table_points(rho) == {"uncontended": 0.5, "contended": 2.0}
    assert tables.table_points({1.0: 0.5, 2.0: 1.4}) == {"uncontended": 1.0, "contended": 1.0}
    assert tables.table_points({1.0: 1.5}) == {"uncontended": 1.0, "contended": None}


def test_part_cache(tmp_path):
    key = {"a": 1, "grid": [1.0, 2.0]}
    assert cache.part_done(tmp_path, key) is None
    cache.mark_done(tmp_path, key, {"x": 3})
    assert cache.part_done(tmp_path, key)["result"] == {"x": 3}
    assert cache.part_done(tmp_path, {"a": 2, "grid": [1.0, 2.0]}) is None   # settings changed
    (tmp_path / cache.DONE_FILE).write_text("{broken")
    assert cache.part_done(tmp_path, key) is None


def test_a_run_finished_before_the_rename_is_reused(tmp_path):
    """A part folder written when the parts were called stages holds ``stage_done.json``: it is
    still read (and ``reuse_finished`` logs the reuse); a new marker takes precedence."""
    key = {"a": 1}
    cache.mark_done(tmp_path, key, {"x": 3})
    (tmp_path / cache.DONE_FILE).rename(tmp_path / cache.OLD_DONE_FILE)
    logged = []
    assert cache.reuse_finished(tmp_path, key, False, logged.append, "reused")["result"] == {
        "x": 3}
    assert logged == ["reused"]
    assert cache.reuse_finished(tmp_path, key, True, logged.append, "again") is None   # --redo
    cache.mark_done(tmp_path, {"a": 2}, {"x": 4})
    assert cache.part_done(tmp_path, key) is None and cache.part_done(tmp_path, {"a": 2})


def test_trace_part_and_reuse(tmp_path, capsys):
    c = main_cfg.get_config("smoke")
    c.summary_problems = 12
    log = lambda m: None  # noqa: E731
    first = training.part_traces(tmp_path, c, log, redo=False)
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "gsm8k" in out and "mmlu_stem" in out
    assert "accuracy all-LLM" in first["table"]
    (tmp_path / "traces" / "summary.txt").unlink()   # reuse must not regenerate it
    training.part_traces(tmp_path, c, log, redo=False)
    assert not (tmp_path / "traces" / "summary.txt").exists()
    c.summary_problems = 13                          # other settings: the part is redone
    training.part_traces(tmp_path, c, log, redo=False)
    assert (tmp_path / "traces" / "summary.txt").exists()


def test_dual_config_matches_the_train_dual_command_line(tmp_path):
    """The in-process stage-2 config equals what ``python -m train.dual`` parses from the same
    choices given as flags (ml_collections' own command-line path), on the eval's scenario."""
    c = main_cfg.get_config("smoke")
    env_kw = dict(num_users=16, num_servers=4, bandwidth_hz=20e6, arrival_rate_hz=4.0,
                  beta=0.2, tau_s=0.05)
    config, key = training.dual_config(c, "gsm8k", tmp_path / "ppo", env_kw)
    argv = ["train.dual", f"--config={REPO / 'prada_jax/configs/dual.py'}:smoke,gsm8k",
            "--config.env.trace_seed=0", "--config.env.problems=60",
            f"--config.policy_dir={tmp_path / 'ppo'}", "--config.env.server_model=legacy"]
    argv += [f"--config.env.{k}={v}" for k, v in env_kw.items()]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    fv(argv)
    assert config_utils.config_to_dict(config) == config_utils.config_to_dict(fv.config)
    assert key["variant"] == "smoke,gsm8k" and key["fields"]["policy_dir"] == str(tmp_path / "ppo")


@pytest.mark.slow
def test_smoke_pipeline_end_to_end_and_rerun(tmp_path):
    work = tmp_path / "demo"
    cmd = [sys.executable, "-m", "train.main", f"--workdir={work}", "--smoke"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    first_s = time.time() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "SYNTHETIC" in out and f"tensorboard --logdir {work}" in out
    assert "knee in M" in out and "All-LLM" in out
    assert "crossover" in out and "table points" in out
    assert (work / "curve" / "gsm8k" / "curve.json").is_file()
    # the capacity part (issue 42) at the tests' size, this run's policy as the one sample
    assert "Capacity per server GPU under the SLO" in out
    assert (work / "capacity" / "gsm8k" / "report.md").is_file()
    table = work / "eval" / "gsm8k" / "uncontended"
    for f in ("results.json", "results.csv", "table.txt", "accuracy.png"):
        assert (table / f).is_file(), f
    res = json.loads((table / "results.json").read_text())
    assert {"All-SLM", "All-LLM", "Draft then LLM (recompute)", "RSD (online PRM)",
            "PRADA (λ=µ=0)"} <= set(res["policies"])
    assert res["meta"]["traces"]["synthetic"] is True
    # The table is on the test split (problems the policy never trained on, test seeds), the
    # headline against the paper's All-LLM (the server LLM alone).
    meta = res["meta"]
    assert meta["split"] == "test" and meta["traces"]["split"] == "test"
    assert meta["eval_seed_range"][0] == splits.TEST_SEED_BASE
    assert meta["traces"]["problems"] < meta["traces"]["problems_total"] == 60
    assert res["headline"]["reference"] == "All-LLM"
    assert "Benchmark table, uncontended point, on the test split" in out
    assert "test split (" in out
    # Choices on validation: the dual learner's traces and the critic refit's judged split.
    dual = json.loads((work / "dual" / "gsm8k" / "multipliers.json").read_text())
    assert dual["scenario"]["traces"]["split"] == "validation"
    critic = json.loads((work / "critic" / "gsm8k" / "critic_check.json").read_text())
    assert critic["split"] == "validation"
    assert "on the validation split" in out
    assert any((work / "sweep" / "gsm8k").glob("delays_vs_M_*.png"))
    assert (work / "calibration" / "calibration_reliability.png").is_file()
    assert (work / "ppo" / "gsm8k" / "checkpoints").is_dir()
    # Rerun: every part is reused, nothing is retrained.
    t0 = time.time()
    p2 = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p2.returncode == 0, p2.stdout[-3000:] + p2.stderr[-3000:]
    assert p2.stdout.count("reusing") >= 5, p2.stdout
    assert "training the screening policy" not in p2.stdout
    assert time.time() - t0 < first_s
    # evals.run on the produced checkpoint; a corrupt copy gives a clear error.
    ev = subprocess.run([sys.executable, "-m", "evals.run", f"--policy={work / 'ppo' / 'gsm8k'}",
                         "--traces=gsm8k", "--problems=30", "--seeds=2", "--slots=60",
                         "--warmup_slots=10", f"--out={tmp_path / 'ev'}"],
                        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert (tmp_path / "ev" / "results.csv").is_file() and "All-LLM" in ev.stdout
    ev_meta = json.loads((tmp_path / "ev" / "results.json").read_text())["meta"]
    assert ev_meta["policy_step"] == trainer_ckpt_step(work / "ppo" / "gsm8k")
    bad = subprocess.run([sys.executable, "-m", "evals.run", f"--policy={tmp_path / 'nope'}",
                          f"--out={tmp_path / 'ev2'}"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "no such run directory" in bad.stderr


def trainer_ckpt_step(run) -> int:
    """The newest checkpoint step of a train.ppo run (what evals.run evaluates)."""
    return max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())


def test_make_demo_ends_with_the_frontier_at_its_small_size():
    """Issue 52 item 6: ``make demo`` prints the default pair's frontier at a small size (one
    policy sample, >= 4 seeds, a few knob settings), after the pipeline."""
    import studies.frontier as fr
    text = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipe = text.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    lines = [ln.strip() for ln in recipe.splitlines()[1:] if ln.strip()]
    assert lines[0].endswith("-m train.main --workdir=checkpoints/demo")
    assert "-m studies.frontier --size=demo --pairs=a100_orin_int4" in lines[1]
    d = fr.SIZES["demo"]
    assert len(d.samples) == 1 and d.seeds >= 4 and len(d.shares) <= 3
    assert d.retentions == fr.SIZES["study"].retentions
