"""Input handling of the evals: traces, missing/corrupt checkpoints, shape mismatch, multipliers."""
import json

import numpy as np
import pytest

from evals import suite
from evals.testing import crafted_traces
from prada_jax.traces import format as tf
from prada_jax.traces.testing import random_meta


def test_load_traces_folder_preset_and_errors(tmp_path):
    tr = crafted_traces(6)
    tf.save(tr, tmp_path / "t", random_meta(tr, "crafted"))
    got = suite.load_traces(str(tmp_path / "t"))
    assert got.info["problems"] == 6 and got.info["feature_dim"] == 4
    syn = suite.load_traces("gsm8k", problems=5, trace_seed=3)
    assert syn.info["synthetic"] and syn.info["problems"] == 5
    with pytest.raises(suite.EvalError, match="neither an existing trace folder"):
        suite.load_traces("nope_preset")
    (tmp_path / "t" / "nodes.safetensors").write_bytes(b"garbage")
    with pytest.raises(suite.EvalError, match="invalid trace folder"):
        suite.load_traces(str(tmp_path / "t"))


def test_missing_or_corrupt_policy_folder(tmp_path):
    with pytest.raises(suite.EvalError, match="no such run directory"):
        suite.load_policy(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(suite.EvalError, match="cannot load the policy checkpoint.*config.json"):
        suite.load_policy(str(empty))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(suite.EvalError, match="bad.*config.json.*not valid JSON"):
        suite.load_policy(str(bad))
    # A run directory whose checkpoint folder holds no complete checkpoint.
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"env": {"pass_gain": True}}))
    (run / "policy_meta.json").write_text(json.dumps(
        {"obs_dim": 6, "hidden": [8], "separate_critic": True, "num_seeds": 1, "seeds": [0],
         "env": "edge", "traces": {"feature_dim": 4}}))
    with pytest.raises(suite.EvalError, match="run.*no checkpoint"):
        suite.load_policy(str(run))
    # A corrupt checkpoint step folder.
    (run / "checkpoints" / "4" / "state").mkdir(parents=True)
    (run / "checkpoints" / "4" / "state" / "garbage").write_text("x")
    with pytest.raises(suite.EvalError, match="--policy=.*run"):
        suite.load_policy(str(run))


def test_trace_shape_mismatch_is_refused():
    pol = suite.LoadedPolicy(None, None, {"obs_dim": 18, "traces": {"feature_dim": 16,
                                                                   "source": "synthetic:gsm8k"}},
                             None, "/runs/ppo")
    traces = suite.LoadedTraces(crafted_traces(4), {"feature_dim": 4, "source": "crafted"})
    with pytest.raises(suite.EvalError, match="feature_dim 16.*feature_dim 4"):
        suite.check_policy_traces(pol, traces)
    ok = suite.LoadedTraces(None, {"feature_dim": 16, "source": "x"})
    suite.check_policy_traces(pol, ok)


def test_multiplier_shapes_and_errors(tmp_path):
    (tmp_path / "multipliers.json").write_text('{"lambda_s": 0.5, "mu": 2e-8, "step": 3}')
    assert suite.load_multipliers(str(tmp_path)) == (
        0.5, 2e-8, {"file": str(tmp_path / "multipliers.json"), "step": 3})
    (tmp_path / "multipliers.json").write_text('{"lambda_s": NaN, "mu": 0}')
    with pytest.raises(suite.EvalError, match="cannot load the multipliers: .*'lambda_s'"):
        suite.load_multipliers(str(tmp_path))
    with pytest.raises(suite.EvalError, match="no such run directory"):
        suite.load_multipliers(str(tmp_path / "nodual"))


def test_resolve_traces_defaults_to_the_policy_traces():
    cfg = {"env": {"preset": "mmlu_stem", "trace_seed": 2, "problems": 50, "trace_dir": ""}}
    import ml_collections
    pol = suite.LoadedPolicy(None, None, {}, ml_collections.ConfigDict(cfg), "p")
    off = suite.HELD_OUT_SEED_OFFSET
    assert suite.resolve_traces(pol, None, None, None) == ("mmlu_stem", 50, 2 + off)
    assert suite.resolve_traces(pol, "gsm8k", None, 9) == ("gsm8k", 50, 9)
    assert suite.resolve_traces(None, "gsm8k", None, None) == ("gsm8k", None, off)
    assert suite.resolve_traces(None, "gsm8k", 7, 3) == ("gsm8k", 7, 3)


def test_env_kwargs_from_config():
    import ml_collections
    cfg = ml_collections.ConfigDict({"env": {"num_users": 8, "num_servers": 4,
                                             "bandwidth_hz": 20e6, "arrival_rate_hz": 4.0,
                                             "beta": 0.2, "tau_s": 0.05, "contention": False}})
    kw = suite.env_kwargs_from(cfg, {"num_servers": 2, "beta": None})
    assert kw["num_users"] == 16 and kw["num_servers"] == 2 and kw["beta"] == 0.2


def test_load_traces_selects_and_names_a_split(tmp_path):
    from prada_jax.traces import splits

    t = suite.load_traces("gsm8k", problems=40, trace_seed=2, split="test")
    want = splits.problem_split(40, 2)["test"]
    assert t.info["split"] == "test" and t.info["problems"] == len(want)
    assert t.info["problems_total"] == 40
    assert suite.split_label(t.info) == f"test split ({len(want)} of 40 problems)"
    every = suite.load_traces("gsm8k", problems=40, trace_seed=2)
    assert every.info["split"] == "all" and "includes training problems" in \
        suite.split_label(every.info)
    # A policy trained on every problem: the test table says so.
    pol = suite.LoadedPolicy(None, None, {"traces": {"split": "all"}}, None, "p")
    assert "the policy trained on all problems" in suite.split_label(t.info, pol)
    tr = crafted_traces(6)
    tf.save(tr, tmp_path / "t", random_meta(tr, "crafted"))
    with pytest.raises(suite.EvalError, match=r"^--split=test: --traces=.*has no split "
                       "metadata"):
        suite.load_traces(str(tmp_path / "t"), split="test")
    with pytest.raises(suite.EvalError, match=r"^--split=held_out: unknown split"):
        suite.load_traces("gsm8k", problems=10, split="held_out")


def test_evaluation_seeds_leave_the_training_seeds():
    from prada_jax.traces import splits

    info = {"split": "test"}
    pol = suite.LoadedPolicy(None, None, {"seeds": [0, 1, 2, 3]}, None, "p")
    first = suite.evaluation_seed0(info, pol, seeds=8, seed0=0)
    assert first == splits.TEST_SEED_BASE and not set(range(first, first + 8)) & {0, 1, 2, 3}
    assert suite.evaluation_seed0({"split": "validation"}, pol, 8, 3) == \
        splits.VALIDATION_SEED_BASE + 3
    odd = suite.LoadedPolicy(None, None, {"seeds": [splits.TEST_SEED_BASE + 4]}, None, "p")
    with pytest.raises(suite.EvalError, match=r"^seed ranges overlap: --seed0/--seeds .* the "
                       r"policy's training seed 2000004"):
        suite.evaluation_seed0(info, odd, seeds=8, seed0=0)
    with pytest.raises(suite.EvalError, match=r"^seed ranges overlap: --seed0/--seeds"):
        suite.evaluation_seed0(info, None, seeds=8, seed0=splits.SEED_RANGE - 4)


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (("--traces=gsm8k", "--split=held_out"), r"^error: --split=held_out: unknown split"),
    (("--traces={folder}",), r"^error: --split=test: --traces=.*has no split metadata"),
    (("--traces=gsm8k", "--seed0=999998", "--seeds=4"), r"^error: seed ranges overlap: "
                                                          r"--seed0/--seeds")])
def test_run_refuses_bad_split_input_writing_nothing(tmp_path, args, needle):
    """Exit 2, one stderr line naming the flag, no output folder (in a subprocess)."""
    import re
    import subprocess
    import sys

    tr = crafted_traces(6)
    tf.save(tr, tmp_path / "t", random_meta(tr, "crafted"))
    out = tmp_path / "out"
    argv = [a.format(folder=tmp_path / "t") for a in args]
    p = subprocess.run([sys.executable, "-m", "evals.run", "--problems=20", "--slots=20",
                        "--warmup_slots=2", "--seeds=1", *argv, f"--out={out}"],
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(lines) == 1 and re.search(needle, lines[0]), p.stderr[-2000:]
    assert not out.exists()


def test_all_llm_is_the_server_llm_alone_and_the_recompute_row_is_named():
    names = [s.name for s in suite.baseline_rows()]
    assert names[:3] == ["All-SLM", suite.ALL_LLM, suite.DRAFT_RECOMPUTE]
    specs = {s.name: s for s in suite.baseline_rows()}
    assert specs[suite.ALL_LLM].screen == specs[suite.DRAFT_RECOMPUTE].screen == "always"

    class Spy:
        def __init__(self):
            self.calls = {}

        def run(self, spec, **kw):
            self.calls[spec.name] = kw
            return {}

    spy = Spy()
    for spec in suite.baseline_rows():
        suite.run_row(spy, spec, num_servers=2)
    assert spy.calls[suite.ALL_LLM] == {"num_servers": 2, **suite.LLM_ONLY_OVERRIDES}
    assert spy.calls[suite.ALL_LLM]["llm_only"] is True
    assert spy.calls[suite.DRAFT_RECOMPUTE] == {"num_servers": 2}
    assert "llm_only" not in spy.calls["All-SLM"]


@pytest.mark.slow
def test_llm_alone_row_beats_the_recompute_row_on_latency():
    """On a tiny trace set the LLM-alone row is faster than the draft-then-recompute row (it
    skips the drafts). Slow (~60 s); the wiring is guarded by the test above and the latency
    by tests/envs/test_llm_only.py."""
    from envs import edge
    from evals import evaluate as ev

    tr = crafted_traces(4)
    params = edge.make_params(tr, num_users=2, num_servers=2, arrival_rate_hz=2.0,
                              bandwidth_hz=1e9, snr_threshold_db=-float("inf"))
    e = ev.Evaluator(params, seeds=2, num_slots=120, warmup_slots=10)
    specs = {s.name: s for s in suite.baseline_rows()}
    alone = suite.run_row(e, specs[suite.ALL_LLM])
    recompute = suite.run_row(e, specs[suite.DRAFT_RECOMPUTE])
    assert np.all(alone["latency_mean_s"] < recompute["latency_mean_s"])
    assert np.all(alone["offload_rate"] == 1.0)
