"""evals.capacity.study's part cache (issue 55 item 1): every part is keyed by the pair's name
and the sha256 of its resolved figures, and the whole ``--pairs`` list is checked for two
pairs sharing a folder before anything is trained. The measurements are replaced by fakes
that record their calls, so these run in seconds; the real parts run in test_capacity_run."""
from __future__ import annotations

import hashlib
import json
import types

import numpy as np
import pytest

from evals import suite
from evals.capacity import measure, study
from prada_jax import latency as lat
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json
from train import capacity_study, policy_samples


def _pair_file(path, server="a100_80gb_bf16"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"edge": "orin_agx_64gb_int4", "server": server}))
    return str(path)


@pytest.fixture
def fakes(monkeypatch):
    """Fake policies and measurements; ``calls`` lists (part, pair) per measurement run."""
    calls = []

    def policy(d):
        return types.SimpleNamespace(params={"w": np.zeros(2)}, dir=d)

    def part(name):
        def run(pols, pair=None, *a, **k):
            calls.append((name, pair))
            figures = repr(lat.pair_latency_params(pair)) if pair else ""
            return {"part": name, "pair": pair,
                    "figures": hashlib.sha256(figures.encode()).hexdigest()}
        return run

    monkeypatch.setattr(policy_samples, "train_sample",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    monkeypatch.setattr(suite, "load_policy", policy)
    for name in ("reference_run", "fit_prices", "test_grid", "bisect_rows"):
        monkeypatch.setattr(measure, name, part(name), raising=False)
    monkeypatch.setattr(measure, "test_pool", lambda pols: calls.append(("test_pool", None))
                        or {"llm_alone_accuracy": 0.9}, raising=False)
    monkeypatch.setattr(measure, "env_fingerprint", lambda pols, pair, sizes: {"env": 1},
                        raising=False)
    monkeypatch.setattr(study, "analyse_pairs", lambda out, pairs: ({}, {}))
    monkeypatch.setattr(study, "write_report", lambda out, pairs, r, t, meta: {"meta": meta})
    monkeypatch.setattr(study.analysis, "slo_for", lambda data, a: study.analysis.cap.SLO(
        1.0, 0.9, 0.95, 0.95), raising=False)
    return calls


def test_two_pair_files_of_one_name_are_refused_before_training(tmp_path, fakes,
                                                                monkeypatch):
    a = _pair_file(tmp_path / "a" / "pair.json")
    b = _pair_file(tmp_path / "b" / "pair.json", "h100_sxm_bf16")
    trained = []
    monkeypatch.setattr(policy_samples, "train_sample",
                        lambda *x, **k: trained.append(x) or tmp_path)
    out = tmp_path / "out"
    with pytest.raises(BadInput, match=f"{a}.*{b}"):
        capacity_study.run_study(out, [a, b], "quick", log=lambda m: None)
    assert not trained and not fakes and not out.exists()


def test_an_edited_pair_file_is_measured_again(tmp_path, fakes):
    pair = _pair_file(tmp_path / "hw" / "pair.json")
    out = tmp_path / "out"
    run = lambda: study.run_study(out, [pair], "quick", log=lambda m: None,  # noqa: E731
                                  policy_dirs=[tmp_path / "p0"])
    run()
    first = list(fakes)
    assert {c[0] for c in first} == {"reference_run", "fit_prices", "test_grid", "test_pool",
                                     "bisect_rows"}
    run()                                   # unchanged: every part reused
    assert fakes == first
    old = read_json(out / "pair" / "reference.json")
    _pair_file(tmp_path / "hw" / "pair.json", "h100_sxm_bf16")    # edited in place
    run()
    again = fakes[len(first):]
    assert {c[0] for c in again} >= {"reference_run", "fit_prices", "test_grid",
                                     "bisect_rows"}, again
    new = read_json(out / "pair" / "reference.json")
    assert new["key"]["pair"]["figures_sha256"] != old["key"]["pair"]["figures_sha256"]
    assert new["data"]["figures"] != old["data"]["figures"]   # the new pair's measurement


def test_the_pair_key_follows_the_profile_table(monkeypatch):
    """A named pair's key changes when a profile it resolves to changes in
    prada_jax.latency (the stale-result case of editing a profile)."""
    before = study.pair_key("a100_orin_int4")
    prof = lat.PROFILES["a100_80gb_bf16"]
    monkeypatch.setitem(lat.PROFILES, "a100_80gb_bf16",
                        lambda: prof().replace(peak_flops=prof().peak_flops * 0.9))
    after = study.pair_key("a100_orin_int4")
    assert after["name"] == before["name"]
    assert after["figures_sha256"] != before["figures_sha256"]


def test_a_changed_env_default_is_measured_again(tmp_path, fakes, monkeypatch):
    """The parts' key holds the env's resolved settings: a default that changes under the
    same pair and sizes (as the server's prefix cache did) is not reused."""
    pair = "a100_orin_int4"
    out = tmp_path / "out"
    run = lambda: study.run_study(out, [pair], "quick", log=lambda m: None,  # noqa: E731
                                  policy_dirs=[tmp_path / "p0"])
    run()
    n = len(fakes)
    monkeypatch.setattr(measure, "env_fingerprint", lambda pols, pair, sizes: {"env": 2})
    run()
    assert {c[0] for c in fakes[n:]} >= {"reference_run", "fit_prices", "test_grid"}


def test_the_env_fingerprint_follows_make_params(monkeypatch):
    """``env_fingerprint`` changes with an EnvParams leaf outside the traces (here the server's
    prefix cache switched by hand) and not with anything else."""
    from envs import edge
    from evals.capacity.study import SIZES
    pol = types.SimpleNamespace(config=None, apply_fn=None, params=None, meta={})
    monkeypatch.setattr(measure, "load_split", lambda p, split: suite.load_traces(
        "gsm8k", 300, 0, split=split))
    monkeypatch.setattr(measure, "env_kwargs", lambda p, pair, sizes: dict(
        hardware=pair, server_model="serving", num_servers=4, bandwidth_hz=20e6, beta=0.02,
        tau_s=0.05))
    a = measure.env_fingerprint([pol], "a100_orin_int4", SIZES["quick"])
    assert a == measure.env_fingerprint([pol], "a100_orin_int4", SIZES["quick"])
    make = edge.make_params
    monkeypatch.setattr(measure.edge, "make_params",
                        lambda tr, **kw: make(tr, **dict(kw, server_kv_cache=False)))
    b = measure.env_fingerprint([pol], "a100_orin_int4", SIZES["quick"])
    assert a["traces"] == b["traces"] and a["params_sha256"] != b["params_sha256"]
