"""The load curve (``evals.curve``): one vmapped evaluation equal to the rows run one by one,
one compilation, the crossover rule against hand-made per-seed objectives, the outputs, and
the command's bad-input contract."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge
from evals import curve, report, suite
from evals import evaluate as ev
from evals.plots import is_valid_png
from evals.testing import crafted_traces, oracle_apply

REPO = Path(__file__).resolve().parents[2]
LOADS = [2.0, 12.0]


@pytest.fixture(scope="module")
def setup():
    params = edge.make_params(crafted_traces(), num_users=12, num_servers=2, bandwidth_hz=1e9,
                              snr_threshold_db=-np.inf, tau_s=0.01)
    e = ev.Evaluator(params, seeds=2, num_slots=200, warmup_slots=20, apply_fn=oracle_apply,
                     net_params=jnp.zeros(()), drain_slots=60)
    rows = curve.curve_rows((0.01, 0.0))
    fn = curve.make_curve_fn(e.evaluate_fn)
    return e, rows, fn, curve.run_curve(e, rows, LOADS, curve_fn=fn)


def test_one_evaluation_equals_the_rows_one_by_one(setup):
    """Every (row, load) point of the vmapped curve equals that row run alone at λ = load·M
    (``suite.run_row``, the table's path), metric by metric."""
    e, rows, _, res = setup
    for load in LOADS:
        for r in rows:
            alone = suite.run_row(e, r, arrival_rate_hz=load * 2)
            for k, v in alone.items():
                np.testing.assert_allclose(res[load][r.name][k], v, rtol=1e-6, atol=1e-9,
                                           err_msg=f"{r.name} {load} {k}")
    # More load asks more of the server: the LLM alone's ρ grows about with λ.
    r0 = np.mean(res[LOADS[0]][curve.LLM_ALONE]["rho"])
    r1 = np.mean(res[LOADS[1]][curve.LLM_ALONE]["rho"])
    assert 3.0 < r1 / r0 < 9.0


def test_the_curve_compiles_once(setup):
    e, rows, fn, _ = setup
    curve.run_curve(e, rows, [3.0, 5.0], curve_fn=fn)   # other loads, same number of points
    assert fn._cache_size() == 1


def _fake(diffs_by_load, seeds):
    """Per-seed objectives with PRADA − LLM alone = the given per-seed differences."""
    out = {}
    rng = np.random.default_rng(0)
    for x, d in diffs_by_load.items():
        base = rng.uniform(0.5, 0.9, seeds)
        out[x] = {curve.LLM_ALONE: {"objective": base},
                  curve.PRADA: {"objective": base + np.asarray(d, float)}}
    return out


def test_crossover_rule():
    """The first load, ascending, whose paired differences have a 95 % t-interval above 0;
    hand-made differences: a clear gain from load 2 on (load 1: mean > 0 but the interval
    reaches below 0). Fewer than 8 seeds: undetermined; no gain anywhere: none."""
    s = 8
    noise = np.array([-1, 1, -1, 1, -1, 1, -1, 1], float)
    res = _fake({1.0: 0.01 + 0.05 * noise, 2.0: 0.05 + 0.01 * noise,
                 4.0: 0.08 + 0.01 * noise, 0.5: -0.05 + 0.01 * noise}, s)
    cx = curve.crossover(res)
    assert cx["status"] == "found" and cx["load"] == 2.0
    # The interval at load 1 by hand: mean 0.01, sd = 0.05·sqrt(8/7), t(0.975, 7) = 2.3646.
    half = 2.3646 * 0.05 * np.sqrt(8 / 7) / np.sqrt(8)
    assert cx["diffs"]["1.0"]["ci_low"] == pytest.approx(0.01 - half, rel=1e-3)
    assert curve.crossover(_fake({1.0: [0.1] * 4}, 4))["status"].startswith("undetermined")
    none = curve.crossover(_fake({1.0: -0.02 + 0.01 * noise, 2.0: 0.01 * noise}, s))
    assert none["status"] == "none in the range tried" and none["load"] is None


def test_outputs(setup, tmp_path):
    e, rows, _, res = setup
    # A load the LLM alone cannot carry: its latency is withheld in the JSON.
    hot = curve.run_curve(e, rows[:1], [60.0])
    res = {**res, 60.0: {**hot[60.0], **{r.name: res[LOADS[0]][r.name] for r in rows[1:]}}}
    out = curve.write_curve_outputs({"paper": res}, tmp_path, title="t", meta={"m": 1})
    assert is_valid_png(out["figures"]["paper"])
    data = json.loads((tmp_path / "curve.json").read_text())
    pts = data["pairs"]["paper"]["points"]
    assert sorted(pts) == sorted(str(x) for x in res)
    llm = pts["60.0"]["policies"][curve.LLM_ALONE]
    assert np.mean(hot[60.0][curve.LLM_ALONE]["rho"]) >= 1.0
    assert llm["latency_mean_s"]["mean"] is None and report.UNSTABLE in \
        pts["60.0"]["flags"][curve.LLM_ALONE]
    per_seed = pts["2.0"]["policies"]["All-SLM"]["accuracy"]["per_seed"]
    np.testing.assert_allclose(per_seed, res[2.0]["All-SLM"]["accuracy"])
    assert data["pairs"]["paper"]["crossover"]["status"].startswith("undetermined")
    assert (tmp_path / "curve.txt").read_text().count("unstable") >= 2


@pytest.mark.parametrize("args,needle", [(["--loads=0,1"], "--loads"),
                                         (["--pairs=no_such_pair"], "--pairs"),
                                         (["--warmup_slots=50", "--slots=20"], "--warmup_slots")])
def test_bad_input_exits_2_writing_nothing(tmp_path, args, needle):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-m", "evals.curve", f"--out={out}", *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["out"] * 0
