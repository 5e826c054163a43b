"""Two trainer fixes of issue 53: the final evaluation is written at the update of the model it
evaluated (a run finished before ``train.steps``, as the regime study's cold start at its plateau,
was labelled ``train.steps``), and with ``train.num_seeds`` > 1 the simulated tool latency is paid
once per turn round merged across the seeds (the count ``tool_rounds`` the GPU cost model
prices), not once per seed one after another."""
import sys

import pytest

torch = pytest.importorskip("torch")

from prada_jax.distill import results, stepping, trainer  # noqa: E402
from prada_jax.distill.task import common  # noqa: E402
from prada_jax.lm.hf import save_hf  # noqa: E402
from tests.helpers.distill import cache  # noqa: E402,F401 (the module-scoped fixture)
from tests.helpers.distill import smoke_config as _config, tb_scalars as _scalars  # noqa: E402
from tests.prada_jax.distill.test_opd import bigram_student  # noqa: E402


def test_final_eval_of_a_run_stopped_early_is_labelled_with_its_update(cache, tmp_path):
    # 6 updates registered, stopped after 2 (as a plateau rule stops a chunked run), then the
    # student at that point is evaluated and saved: its point is update 2, not 6
    c = _config(cache, **{"train.steps": 6, "log.ckpt_every": 2, "eval.every": 0})
    wd = tmp_path / "run"
    part = trainer.train_and_evaluate(c, wd, max_steps=2)
    assert part["finished"] is False and part["opt_step"] == 2
    run = stepping.open_run(trainer.build_setup(c), wd, restore=True)
    try:
        res = results.finish(run.setup, run.rec, run.files, run.state, run.host)
    finally:
        trainer.close_files(run.files)
    pts = _scalars(wd / "tb")["eval/success_rate"]
    assert max(st for st, _ in pts) == 2, pts       # before: (6, ...) for the model of update 2
    assert res["after_step"] == 2


def test_final_eval_of_a_full_run_is_at_its_last_update(cache, tmp_path):
    c = _config(cache, **{"train.steps": 4, "eval.every": 0})
    res = trainer.train_and_evaluate(c, tmp_path / "run")
    assert max(st for st, _ in _scalars(tmp_path / "run" / "tb")["eval/success_rate"]) == 4
    assert res["after_step"] == 4


def _recording_sleep(slept: list, real):
    """time.sleep that records the calls made from prada_jax.distill only (patching the time
    module is process-wide: a checkpointer's or writer's thread sleeping at the same moment
    is not the simulator's tool wait)."""
    def sleep(s):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("prada_jax.distill"):
            slept.append(s)
        return real(s)
    return sleep


def test_multi_seed_opd_waits_once_per_merged_tool_round(cache, tmp_path, monkeypatch):
    """2 seeds, the deterministic student (a tool call at every turn of every episode): the
    seeds' calls of one turn run concurrently, so the run sleeps L per merged round, i.e.
    L × the recorded ``tool_rounds`` in all, not once per seed (≈ 2× the model)."""
    student, cfg = bigram_student()
    save_hf(student, cfg, tmp_path / "student", arch="qwen2")
    lat = 0.004
    c = _config(cache, "opd", **{"student.init": str(tmp_path / "student"),
                                 "eval.n_problems": 0, "opd.episodes": 2, "train.steps": 2,
                                 "opd.tool_latency_s": lat, "train.num_seeds": 2})
    slept = []
    real = common.time.sleep
    monkeypatch.setattr(common.time, "sleep", _recording_sleep(slept, real))
    res = trainer.train_and_evaluate(c, tmp_path / "run")
    tot = res["cost"]["totals"]
    assert tot["tool_calls"] > 0
    rounds = sum(u["tool_rounds"] for u in res["cost"]["per_update"])
    assert rounds > 0
    # every seed calls at every turn, so the per-seed rounds are twice the merged ones
    assert sum(slept) == pytest.approx(lat * rounds, rel=1e-9), (len(slept), rounds)
    assert min(u["rollout_s"] for u in res["cost"]["per_update"]) >= lat


def test_single_seed_opd_still_waits_once_per_round(cache, tmp_path, monkeypatch):
    student, cfg = bigram_student()
    save_hf(student, cfg, tmp_path / "student", arch="qwen2")
    lat = 0.004
    c = _config(cache, "opd", **{"student.init": str(tmp_path / "student"),
                                 "eval.n_problems": 0, "opd.episodes": 2, "train.steps": 2,
                                 "opd.tool_latency_s": lat})
    slept = []
    real = common.time.sleep
    monkeypatch.setattr(common.time, "sleep", _recording_sleep(slept, real))
    res = trainer.train_and_evaluate(c, tmp_path / "run")
    rounds = sum(u["tool_rounds"] for u in res["cost"]["per_update"])
    assert rounds > 0 and slept == [lat] * rounds
