"""Smoke tests of ``python -m train.distill``: offline + on-policy, checkpoint/resume, curves,
HF export parity with transformers, zero environment calls, bad-input errors."""
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from prada_jax import config_utils as cu  # noqa: E402
from prada_jax.errors import BadInput  # noqa: E402
from prada_jax.distill import pool as pool_lib  # noqa: E402
from prada_jax.distill.task import arith  # noqa: E402
from tests.helpers.distill import cache  # noqa: E402,F401 (the module-scoped fixture)
from tests.helpers.distill import smoke_config as _config, tb_scalars as _scalars  # noqa: E402


@pytest.fixture(scope="module")
def offline_run(cache, tmp_path_factory):
    """One finished offline :smoke run (4 updates), shared read-only: (workdir, result).
    Tests that change the folder work on a copy (:func:`_copy_run`)."""
    from prada_jax.distill.trainer import train_and_evaluate
    wd = tmp_path_factory.mktemp("offline") / "run"
    return wd, train_and_evaluate(_config(cache), wd)


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst)
    return dst


def test_offline_smoke_resume_and_hf_parity(cache, offline_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from prada_jax.distill.trainer import train_and_evaluate
    from prada_jax.lm.hf import load_hf

    wd = _copy_run(offline_run[0], tmp_path / "run")
    res = offline_run[1]
    assert res["env_calls_during_training"] == 0
    assert res["after"]["n"] == 4 and res["after"]["success_rate"] * 4 in (0, 1, 2, 3, 4)
    assert (wd / "config.json").is_file() and (wd / "results.json").is_file()
    sc = _scalars(wd / "tb")
    assert [s for s, _ in sc["distill/loss"]] == [2, 4]
    assert all(np.isfinite(v) for _, v in sc["distill/kl"])
    assert sc["distill/env_calls"][-1][1] == 0
    assert any(t.startswith("distill/kl_turn_") for t in sc)
    assert "distill/tokens_per_s" in sc and "distill/turn_frac_0" in sc
    # resume: 2 more updates continue from the saved step 4
    res2 = train_and_evaluate(_config(cache, **{"train.steps": 6}), wd)
    sc = _scalars(wd / "tb")
    assert [s for s, _ in sc["distill/loss"]][-1] == 6
    assert "before" in res2  # carried over from the checkpoint meta
    # the saved HF student: transformers logits == Flax logits
    flax_model, _ = load_hf(wd / "student_hf")
    pt = AutoModelForCausalLM.from_pretrained(str(wd / "student_hf"), dtype=torch.float32)
    ids = np.array([arith.encode("<q>12*7+5</q><calc>12*7</calc><res>84</res>")], np.int32)
    with torch.no_grad():
        ref = pt(torch.from_numpy(ids).long()).logits.numpy()
    np.testing.assert_allclose(np.asarray(flax_model(ids)), ref, rtol=1e-4, atol=1e-4)
    # the reported task success, re-measured independently: the saved student in PyTorch,
    # decoded by the teacher's torch decoder on the evaluation problems (eval.seed 0)
    from prada_jax.distill.task.teacher import torch_generate_fn
    eps = arith.run_episodes(arith.make_problems(3, 4, split="eval"),
                             torch_generate_fn(pt, max_new_tokens=12))
    assert res2["after"]["success_rate"] == sum(e.success for e in eps) / 4
    assert res2["after"]["tool_calls"] == sum(e.tool_calls for e in eps)
    assert res2["after"]["mean_turns"] == pytest.approx(np.mean([e.turns for e in eps]))


def test_onpolicy_smoke_makes_no_env_calls(cache, tmp_path):
    from prada_jax.distill.trainer import train_and_evaluate
    res = train_and_evaluate(_config(cache, "onpolicy", **{"eval.n_problems": 0,
                                                           "loss.fkl_coef": 0.5}),
                             tmp_path / "on")
    assert res["env_calls_during_training"] == 0
    sc = _scalars(tmp_path / "on" / "tb")
    assert np.isfinite(sc["distill/kl"][-1][1]) and "distill/fkl" in sc
    # ReOPD's cost record: no tool calls, one supervised turn per pair that generated a token
    cost = res["cost"]
    assert cost["totals"]["tool_calls"] == 0 and sc["cost/total_tool_calls"][-1][1] == 0
    assert 0 < cost["totals"]["supervised_turns"] <= 4 * 8
    assert cost["totals"]["teacher_tokens_scored"] == cost["totals"]["student_tokens"] > 0
    assert all(u["rollout_s"] > 0 and u["scoring_s"] > 0 for u in cost["per_update"])


def test_bad_inputs(cache, tmp_path):
    from prada_jax import config_utils as cu
    from prada_jax.distill.trainer import train_and_evaluate
    from prada_jax.distill.teacher_table import TeacherLogitsMismatch
    with pytest.raises(cu.ConfigError, match=r"config.sampler.kappa must lie in \(0, 1\]"):
        train_and_evaluate(_config(cache, **{"sampler.kappa": 1.5}), tmp_path / "a")
    with pytest.raises(cu.ConfigError, match="config.loss.kind"):
        train_and_evaluate(_config(cache, **{"loss.kind": "rkl"}), tmp_path / "b")
    # logits exported for a different pool
    other = tmp_path / "pool2"
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(99, 12)))
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, [1] * 12), other,
                       {"task": arith.TASK_NAME,
                        "tokenizer": pool_lib.tokenizer_meta(arith.build_tokenizer())})
    with pytest.raises(TeacherLogitsMismatch, match="pool"):
        train_and_evaluate(_config(cache, **{"data.pool_dir": str(other)}), tmp_path / "c")


@pytest.mark.parametrize("variant", ["auto", "exact"])
def test_adaptive_schedules_log_ratio_and_resume_exactly(cache, tmp_path, variant):
    """auto / exact-ratio: the weights are re-estimated every refresh from the current student
    (κ = clip(exp(−c̄)) of that refresh), logged, and a run resumed from a mid-run checkpoint
    ends with the same student and the same diagnostics as an uninterrupted one."""
    import math
    import shutil

    from safetensors.numpy import load_file

    from prada_jax.distill.trainer import train_and_evaluate
    cfg = dict(**{"sampler.refresh_every": 2, "eval.n_problems": 0, "sampler.kappa_min": 0.05})
    a = tmp_path / "a"
    res = train_and_evaluate(_config(cache, variant, **cfg), a)
    steps = [r["step"] for r in res["ratio"]]
    assert steps == [0, 2, 4]
    if variant == "auto":
        for r in res["ratio"][:-1]:
            # a gap above sampler.auto_gap_max (1 nat per turn) holds the configured κ
            assert r["kappa_held"] == (r["mean_gap"] > 1.0)
            want = 0.6 if r["kappa_held"] else max(0.05, math.exp(-max(r["mean_gap"], 0)))
            assert r["kappa_used"] == pytest.approx(want)
        assert res["ratio"][0]["kappa_held"]   # a random student: c̄ of many nats
        assert res["kappa"] == res["ratio"][1]["kappa_used"]
    else:
        assert 0.0 <= res["ratio"][0]["clipped_low_frac"] <= 1.0
    def no_nan(c):
        raise AssertionError(f"results.json holds {c}")
    json.loads((a / "results.json").read_text(), parse_constant=no_nan)   # strict JSON
    sc = _scalars(a / "tb")
    assert [s for s, _ in sc["ratio/slope"]] == [0, 2, 4] and "ratio/r2" in sc
    assert "ratio/log_ratio_turn_1" in sc and "ratio/mean_gap" in sc
    # interrupt after update 2: drop the step-4 checkpoint and results, rerun
    b = tmp_path / "b"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "4")
    (b / "results.json").unlink()
    res_b = train_and_evaluate(_config(cache, variant, **cfg), b)
    wa = load_file(str(a / "student_hf" / "model.safetensors"))
    wb = load_file(str(b / "student_hf" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
    assert [r["step"] for r in res_b["ratio"]] == steps
    assert res_b["ratio"][-1]["mean_gap"] == res["ratio"][-1]["mean_gap"]


def test_auto_kappa_from_scratch_holds_configured_kappa_unless_disabled(cache, tmp_path):
    """From a random init c̄ is many nats: ``auto`` holds sampler.kappa (no collapse to the
    floor); with ``auto_gap_max = inf`` it uses exp(−c̄) clipped at kappa_min, as before."""
    from prada_jax.distill.trainer import train_and_evaluate
    ov = {"sampler.refresh_every": 2, "eval.n_problems": 0, "train.steps": 2}
    res = train_and_evaluate(_config(cache, "auto", **ov), tmp_path / "held")
    r0 = res["ratio"][0]
    assert r0["mean_gap"] > 1.0 and r0["kappa_held"] and r0["kappa_used"] == 0.6
    res = train_and_evaluate(_config(cache, "auto", **ov, **{"sampler.auto_gap_max": 1e9}),
                             tmp_path / "free")
    r0 = res["ratio"][0]
    assert not r0["kappa_held"]
    assert r0["kappa_used"] == pytest.approx(max(1e-3, np.exp(-r0["mean_gap"])))
    with pytest.raises(cu.ConfigError, match="auto_gap_max"):
        train_and_evaluate(_config(cache, "auto", **{"sampler.auto_gap_max": 0.0}),
                           tmp_path / "bad")


def test_adaptive_needs_logits_and_kappa_flag_errors(cache, tmp_path, run_command):
    from prada_jax.distill.trainer import train_and_evaluate
    with pytest.raises(BadInput, match="nowhere"):
        train_and_evaluate(_config(cache, "onpolicy", "auto",
                                   **{"data.logits_dir": str(tmp_path / "nowhere")}),
                           tmp_path / "x")
    from prada_jax import config_utils as cu
    with pytest.raises(cu.ConfigError, match="ratio_max"):
        train_and_evaluate(_config(cache, "exact", **{"sampler.ratio_max": 0.5}), tmp_path / "y")
    root = Path(__file__).resolve().parents[2]
    # in-process (the command's __main__; tests/test_cli_errors.py runs the real entry)
    for bad, msg in (("1.5", "--kappa must lie in (0, 1]"), ("often", "--kappa must be a number")):
        code, _, err = run_command("train.distill", "--config=prada_jax/configs/distill.py:smoke",
                                   f"--workdir={tmp_path / 'z'}", f"--kappa={bad}",
                                   f"--config.data.cache={cache}", cwd=root)
        assert code == 2 and msg in err, err[-500:]
        assert not (tmp_path / "z").exists()


def test_kappa_flag_and_launchers_define_no_flags_on_import():
    import subprocess
    import sys

    from prada_jax import config_utils as cu
    from prada_jax.configs.distill import get_config
    from train.distill import apply_kappa_flag
    c = get_config()
    apply_kappa_flag(c, None)
    assert c.sampler.schedule == "kappa" and c.sampler.kappa == 0.6
    apply_kappa_flag(c, "0.8")
    assert c.sampler.kappa == 0.8
    apply_kappa_flag(c, "AUTO")
    assert c.sampler.schedule == "auto"
    for bad in ("0", "-0.2", "nan", "x"):
        with pytest.raises(cu.ConfigError, match="--kappa"):
            apply_kappa_flag(c, bad)
    code = ("from absl import app, flags, logging; before = set(flags.FLAGS); "
            "import train.distill, train.ppo, train.dual; "
            "print(sorted(set(flags.FLAGS) - before))")
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr[-500:]


TIMING_TAGS = ("distill/tokens_per_s", "distill/update_s", "cost/rollout_s",
               "cost/scoring_s", "cost/update_s")


def _same_run(a, b, skip_results=("update_s_median",)):
    """Final weights bit-identical, results.json equal (timing aside), every curve point of
    every non-timing tag equal."""
    from safetensors.numpy import load_file
    wa = load_file(str(a / "student_hf" / "model.safetensors"))
    wb = load_file(str(b / "student_hf" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)
    ra = json.loads((a / "results.json").read_text())
    rb = json.loads((b / "results.json").read_text())
    for k in skip_results:
        ra.pop(k, None), rb.pop(k, None)
    from prada_jax.distill.opd import untimed_results
    assert untimed_results(ra) == untimed_results(rb)
    sa, sb = _scalars(a / "tb"), _scalars(b / "tb")
    assert set(sa) == set(sb)
    for t in sa:
        if t not in TIMING_TAGS:
            assert sa[t] == sb[t], t


def test_resume_equals_uninterrupted_run_and_finished_rerun(cache, tmp_path, capsys):
    """Stop after update 5 (checkpoints at 2, 4, 5), lose the step-5 checkpoint, resume from
    step 4 — whose window of metric sums (log every 3) is open — and end with the same weights,
    results.json (histogram, env calls, ratio records) and curves as an uninterrupted run.
    A finished workdir rerun changes nothing and returns its stored results; a changed seed is
    refused before anything is written."""
    import shutil

    from prada_jax.distill.trainer import train_and_evaluate
    from prada_jax.run_state import ConfigMismatch
    ov = {"train.steps": 6, "log.every": 3, "log.ckpt_every": 2, "sampler.refresh_every": 3}
    a, b = tmp_path / "a", tmp_path / "b"
    train_and_evaluate(_config(cache, **ov), a)
    part = train_and_evaluate(_config(cache, **ov), b, max_steps=5)
    assert part["finished"] is False and part["opt_step"] == 5
    assert not (b / "results.json").exists()
    shutil.rmtree(b / "checkpoints" / "5")
    capsys.readouterr()
    train_and_evaluate(_config(cache, **ov), b)
    assert "resumed" in capsys.readouterr().out
    _same_run(a, b)
    prov = json.loads((b / "run.json").read_text())["provenance"]
    assert [p["event"] for p in prov] == ["start", "resume"]
    before = (b / "results.json").read_bytes()
    again = train_and_evaluate(_config(cache, **ov), b)
    assert again["already_finished"] and "finished run" in capsys.readouterr().out
    assert (b / "results.json").read_bytes() == before
    assert again["after"] == json.loads(before)["after"]
    cfg_before = (b / "config.json").read_bytes()
    with pytest.raises(ConfigMismatch, match="seed: 0 → 1"):
        train_and_evaluate(_config(cache, **ov, seed=1), b)
    assert (b / "config.json").read_bytes() == cfg_before


def test_checkpoint_of_another_structure_is_refused_before_config_json_is_rewritten(
        cache, offline_run, tmp_path):
    """A workdir whose newest (intact) checkpoint does not fit the student's state (here a
    foreign pytree saved in its place) is refused with CheckpointError before config.json or
    run.json change, even when the resume changes an observational field (train.steps)."""
    import shutil

    from prada_jax.checkpointing import CheckpointError, Checkpointer
    from prada_jax.distill.trainer import train_and_evaluate
    wd = _copy_run(offline_run[0], tmp_path / "run")
    before = {n: (wd / n).read_text() for n in ("config.json", "run.json")}
    shutil.rmtree(wd / "checkpoints")
    with Checkpointer(wd / "checkpoints") as ck:
        ck.save(4, {"w": np.zeros((3,), np.float32)}, meta={"opt_step": 4}, force=True)
    with pytest.raises(CheckpointError):
        train_and_evaluate(_config(cache, **{"train.steps": 6}), wd)
    assert {n: (wd / n).read_text() for n in before} == before


def test_diverging_run_raises_non_finite_and_keeps_last_good_checkpoint(cache, tmp_path):
    import re

    from prada_jax.checkpointing import Checkpointer
    from prada_jax.distill.trainer import train_and_evaluate
    from prada_jax.errors import NonFiniteTraining
    wd = tmp_path / "nan"
    with pytest.raises(NonFiniteTraining) as ei:
        train_and_evaluate(_config(cache, **{"optim.lr": 1e30, "optim.clip_norm": 1e30,
                                             "train.steps": 8, "log.every": 1,
                                             "log.ckpt_every": 1, "eval.n_problems": 0}), wd)
    m = re.search(r"non-finite distill/\w+ in updates (\d+)\.\.\d+; stopping; the last good "
                  r"checkpoint \(step (\d+)\)", str(ei.value))
    assert m, str(ei.value)
    assert int(m.group(2)) == int(m.group(1)) - 1
    assert not (wd / "results.json").exists()
    ck = Checkpointer(wd / "checkpoints")
    assert max(ck.all_steps()) == int(m.group(2))
    ck.close()


def _launch(cache, wd, *extra):
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen([sys.executable, "-m", "train.distill",
                             "--config=prada_jax/configs/distill.py:smoke", f"--workdir={wd}",
                             f"--config.data.cache={cache}", *extra], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_equals_uninterrupted(cache, tmp_path):
    """``python -m train.distill`` killed (SIGKILL) after its step-60 checkpoint has committed,
    rerun to the end: final weights, every curve point (EventAccumulator) and results.json
    equal an uninterrupted run's; a diverging run exits 3 with one line."""
    import signal
    import time

    from prada_jax.checkpointing import MANIFEST_FILE
    flags = ["--config.train.steps=400", "--config.log.every=7", "--config.log.ckpt_every=60",
             "--config.sampler.refresh_every=50"]
    a, b = tmp_path / "a", tmp_path / "b"
    p = _launch(cache, a, *flags)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]
    p = _launch(cache, b, *flags)
    t0 = time.time()
    while not (b / "checkpoints" / "60" / MANIFEST_FILE).is_file():
        assert p.poll() is None and time.time() - t0 < 600, "run ended before its checkpoint"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (b / "results.json").exists(), "killed too late: the run had finished"
    p = _launch(cache, b, *flags)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-2000:]
    assert "resumed" in out
    _same_run(a, b)
    p = _launch(cache, tmp_path / "nan", "--config.optim.lr=1e30",
                "--config.optim.clip_norm=1e30", "--config.log.every=1",
                "--config.eval.n_problems=0")
    out, err = p.communicate(timeout=600)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert p.returncode == 3 and len(lines) == 1 and "non-finite" in lines[0], err[-2000:]
