"""Input handling of the evals: traces, missing/corrupt checkpoints, shape mismatch, multipliers."""
import json
from types import SimpleNamespace

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
    nt = SimpleNamespace(lambda_s=np.float32(0.5), mu=np.float32(2e-8))
    assert suite._unpack_multipliers(nt) == (0.5, pytest.approx(2e-8), {})
    assert suite._unpack_multipliers(({"lambda_s": 1.0, "mu": 0.0}, {"step": 3}))[2] == {"step": 3}
    with pytest.raises(suite.EvalError, match="unexpected"):
        suite._unpack_multipliers([1, 2, 3])
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
