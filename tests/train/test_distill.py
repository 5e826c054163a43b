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


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A tiny cache: a pool of solved episodes, a random tiny PyTorch teacher, its logits."""
    from transformers import Qwen2ForCausalLM

    from prada_jax.distill.task.export_local import export_logits
    from prada_jax.distill.task.teacher import model_config

    root = tmp_path_factory.mktemp("cache")
    torch.manual_seed(0)
    teacher = Qwen2ForCausalLM(model_config(16, 1, 2, 1, 32))
    teacher.save_pretrained(root / "teacher")
    arith.build_tokenizer().save_pretrained(root / "teacher")
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(5, 12)))
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, [1] * 12), root / "pool",
                       {"task": arith.TASK_NAME, "synthetic": True,
                        "tokenizer": pool_lib.tokenizer_meta(arith.build_tokenizer())})
    export_logits(root / "teacher", root / "pool", root / "logits", top_k=4)
    return root


def _config(cache, *variants, **overrides):
    from train.configs.distill import get_config
    c = get_config(",".join(("smoke",) + variants))
    c.data.cache = str(cache)
    for k, v in overrides.items():
        cu.set_field(c, k, v)
    return c


def _scalars(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tb_dir))
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def test_offline_smoke_resume_and_hf_parity(cache, tmp_path):
    from transformers import AutoModelForCausalLM

    from prada_jax.distill.loop import train_and_evaluate
    from prada_jax.lm.hf import load_hf

    wd = tmp_path / "run"
    res = train_and_evaluate(_config(cache), wd)
    assert res["env_calls_during_training"] == 0
    assert 0.0 <= res["after"]["success_rate"] <= 1.0 and res["after"]["n"] == 4
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


def test_onpolicy_smoke_makes_no_env_calls(cache, tmp_path):
    from prada_jax.distill.loop import train_and_evaluate
    res = train_and_evaluate(_config(cache, "onpolicy", **{"eval.n_problems": 0,
                                                           "loss.fkl_coef": 0.5}),
                             tmp_path / "on")
    assert res["env_calls_during_training"] == 0
    sc = _scalars(tmp_path / "on" / "tb")
    assert np.isfinite(sc["distill/kl"][-1][1]) and "distill/fkl" in sc


def test_bad_inputs(cache, tmp_path):
    from prada_jax import config_utils as cu
    from prada_jax.distill.loop import train_and_evaluate
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

    from prada_jax.distill.loop import train_and_evaluate
    cfg = dict(**{"sampler.refresh_every": 2, "eval.n_problems": 0, "sampler.kappa_min": 0.05})
    a = tmp_path / "a"
    res = train_and_evaluate(_config(cache, variant, **cfg), a)
    steps = [r["step"] for r in res["ratio"]]
    assert steps == [0, 2, 4]
    if variant == "auto":
        for r in res["ratio"][:-1]:
            assert r["kappa_used"] == pytest.approx(max(0.05, math.exp(-max(r["mean_gap"], 0))))
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


def test_adaptive_needs_logits_and_kappa_flag_errors(cache, tmp_path):
    import subprocess
    import sys
    from prada_jax.distill.loop import train_and_evaluate
    with pytest.raises(BadInput, match="nowhere"):
        train_and_evaluate(_config(cache, "onpolicy", "auto",
                                   **{"data.logits_dir": str(tmp_path / "nowhere")}),
                           tmp_path / "x")
    from prada_jax import config_utils as cu
    with pytest.raises(cu.ConfigError, match="ratio_max"):
        train_and_evaluate(_config(cache, "exact", **{"sampler.ratio_max": 0.5}), tmp_path / "y")
    root = Path(__file__).resolve().parents[2]
    for bad, msg in (("1.5", "--kappa must lie in (0, 1]"), ("often", "--kappa must be a number")):
        p = subprocess.run([sys.executable, "-m", "train.distill",
                            "--config=train/configs/distill.py:smoke",
                            f"--workdir={tmp_path / 'z'}", f"--kappa={bad}",
                            f"--config.data.cache={cache}"],
                           cwd=root, capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and msg in p.stderr, p.stderr[-500:]


def test_kappa_flag_and_launchers_define_no_flags_on_import():
    import subprocess
    import sys

    from prada_jax import config_utils as cu
    from train.configs.distill import get_config
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
