"""studies.stage2_verdict / evals.grid: schema, paired differences against an independent computation,
the grid search, the conditioned load features, bad flags."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from envs import edge, scenarios, stage1
from evals import evaluate as ev
from evals import grid
from studies import stage2_verdict as stage2

REPO = Path(__file__).resolve().parents[2]
TINY = dict(seeds=3, slots=60, warmup=10, scenario_length=60, num_users=8, eval_problems=60,
            env={"num_servers": 1, "arrival_rate_hz": 12.0}, ppo_variant="smoke", ppo_overrides={},
            dual={"train.num_envs": 2, "train.rollout_len": 10, "train.num_chunks": 1,
                  "train.sgd_steps": 2, "dual.anneal_steps": 2},
            grid=dict(lam=(0.0, 0.1), mu_per_mhz=(0.0,), fine=False))


def test_grid_search_finds_the_exhaustive_best_and_refines():
    calls = []

    def f(lams, mus):  # objective peaked at λ = 0.03, µ = 0; 2 "seeds"
        calls.append(len(lams))
        lam = np.maximum(np.asarray(lams, np.float64), 1e-6)
        v = -(np.log10(lam) - np.log10(0.03)) ** 2 - 1e6 * np.asarray(mus, np.float64)
        return np.stack([v, v], -1)

    g = grid.search(f)
    pts = np.array([[p[0], p[1], p[2]] for p in g["points"]])
    assert g["evaluated"] == len(pts) == sum(calls)
    assert g["best"]["objective"] == pytest.approx(pts[:, 2].max())
    assert len(calls) == 2 and calls[0] == 32  # coarse 8 x 4, then the fine grid
    assert abs(math.log10(g["best"]["lambda_s"]) - math.log10(0.03)) < 0.06  # fine step 0.1 dec
    assert g["best"]["mu_per_mhz"] == 0.0


def test_grid_ties_go_to_the_smallest_pair():
    g = grid.search(lambda la, mu: np.zeros((len(la), 2)), fine=False)
    assert g["best"]["lambda_s"] == 0.0 and g["best"]["mu_per_mhz"] == 0.0


def test_paired_differences_and_ci_formula():
    rng = np.random.default_rng(0)
    per = {"a": {"objective": rng.normal(size=6)}, "b": {"objective": rng.normal(size=6)}}
    d = stage2.paired_differences(per, "a", "b", metrics=("objective",))["objective"]
    diff = per["a"]["objective"] - per["b"]["objective"]
    half = sps.t.ppf(0.975, 5) * diff.std(ddof=1) / math.sqrt(6)
    assert d["mean"] == pytest.approx(diff.mean()) and d["ci95"] == pytest.approx(half)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("stage2")
    old = dict(stage2.SIZES["quick"])
    stage2.SIZES["quick"] = TINY
    try:
        from prada_jax.rl import trainer
        from prada_jax.configs import ppo as ppo_cfg

        c = ppo_cfg.get_config("smoke,gsm8k")
        c.ppo.total_env_steps = 256
        c.log.progress = False
        trainer.train_and_evaluate(c, out / "pol", stage1.build_setup(c))
        res = stage2.run(out, ["burst"], quick=True, policy_dir=str(out / "pol"),
                         log=lambda *a: None)
    finally:
        stage2.SIZES["quick"] = old
    return out, res


@pytest.mark.slow
def _power_rows(headroom, spread, seeds=16, seed=0):
    """Per-seed objectives with a given mean no-limits − λ=µ=0 gap and per-seed spread."""
    rng = np.random.default_rng(seed)
    zero = rng.normal(0.7, 0.01, seeds)
    noise = rng.normal(0.0, 1.0, seeds)
    nolim = zero + headroom + spread * (noise - noise.mean()) / noise.std(ddof=1)
    return {stage2.ROW_ZERO: {"objective": zero}, stage2.ROW_CONST: {"objective": zero.copy()},
            stage2.ROW_NOLIM: {"objective": nolim}}


@pytest.mark.parametrize("headroom,spread,ok,needle", [
    (0.013, 0.005, False, "< 0.02"),      # MDE <= h/2 but h below the pre-registered floor
    (0.030, 0.040, False, "MDE"),         # room for a price, too few seeds
    (0.030, 0.010, True, "resolvable")])
def test_power_note_applies_the_headroom_floor(headroom, spread, ok, needle):
    """``resolvable`` is issue 23's gate: headroom >= 0.02 and MDE <= headroom / 2 (MDE by
    scipy's t quantiles, independent of the code's), and the note names what fails."""
    per = _power_rows(headroom, spread)
    pw = stage2.power_report(per)
    d = per[stage2.ROW_NOLIM]["objective"] - per[stage2.ROW_ZERO]["objective"]
    n = d.size
    mde = (sps.t.ppf(0.975, n - 1) + sps.t.ppf(0.8, n - 1)) * d.std(ddof=1) / math.sqrt(n)
    assert pw["headroom"] == pytest.approx(headroom, abs=1e-9)
    assert pw["mde"] == pytest.approx(mde, rel=1e-4)
    assert pw["resolvable"] is ok == (headroom >= 0.02 and mde <= headroom / 2)
    assert needle in pw["note"], pw["note"]
    if headroom < 0.02:
        assert mde <= headroom / 2      # the case the old note called resolvable


@pytest.mark.parametrize("name,m", [("outage_burst", 4), ("outage_burst_m2", 2),
                                    ("nominal", 1)])
def test_schedule_report_counts_partial_cycles_slot_by_slot(name, m):
    """The share of measured slots with M_t < M, counted in plain Python from the preset's
    definition (outage in the first 120 of every 400 slots of a schedule of length L, read at
    t mod L), for the full size's L = 600 (not a multiple of 400) and window [150, 1200)."""
    rep = stage2.schedule_report(name, 600, 1200, 150, m)
    outage = [name != "nominal" and (t % 600) % 400 < 120 for t in range(150, 1200)]
    assert rep["reduced_capacity_share"] == pytest.approx(sum(outage) / len(outage))
    assert rep["window"] == [150, 1200] and rep["cycles"] == pytest.approx(1050 / 600)
    assert "t mod 600" in rep["note"]


def test_stage2_json_schema(tiny_run):
    out, _ = tiny_run
    data = json.loads((out / "stage2.json").read_text())  # strict JSON (no NaN)
    sc = data["scenarios"]["burst"]
    assert set(sc["rows"]) == set(stage2.ROWS)
    for row in sc["rows"].values():
        for m in ("accuracy", "latency_mean_s", "latency_p95_s", "objective", "server_util",
                  "queue_len"):
            assert set(row[m]) >= {"mean", "ci95"}
    assert {"learned_minus_zero", "learned_minus_fifo",
            "learned_minus_best_constant"} <= set(sc["paired"])
    assert set(sc["paired"]["learned_minus_fifo"]["objective"]) >= {"mean", "ci95"}
    assert (out / "stage2.png").stat().st_size > 0 and "### burst" in (
        out / "stage2.md").read_text()
    # default learners: averaged subgradient for the constant, Adam for the conditioned map
    assert data["meta"]["constant_mode"] == "subgradient"
    cfgs = {k: json.loads((out / "dual" / "burst" / k / "config.json").read_text())["dual"]
            for k in ("constant", "conditioned")}
    assert (cfgs["constant"]["mode"], cfgs["constant"]["average_tail"],
            cfgs["constant"]["utilisation"]) == ("subgradient", 0.5, 1.0)
    assert cfgs["conditioned"]["mode"] == "differentiable" and cfgs["conditioned"]["conditioned"]


@pytest.mark.slow
def test_stage2_paired_matches_independent_evaluation(tiny_run):
    """FIFO-greedy and λ=µ=0 per seed recomputed with evals.evaluate.Evaluator; the paired
    difference and its CI recomputed with NumPy/SciPy."""
    out, res = tiny_run
    from evals import suite

    from prada_jax.traces import splits

    policy = suite.load_policy(str(out / "pol"))
    # The rows run on the test split of the policy's own trace set, with test-range seeds.
    traces = suite.load_traces("gsm8k", int(policy.config.env.problems),
                               int(policy.config.env.trace_seed) + suite.HELD_OUT_SEED_OFFSET,
                               split="test")
    meta = res["meta"]
    assert meta["split"] == "test" and meta["choice_split"] == "validation"
    assert meta["eval_seed_range"][0] == splits.TEST_SEED_BASE
    assert meta["choice_seed_range"][0] == splits.VALIDATION_SEED_BASE
    assert meta["traces"]["problems"] == traces.info["problems"] < traces.info["problems_total"]
    assert meta["env"]["hardware"] == policy.config.env.hardware
    params = edge.make_params(traces.traces, num_users=8, num_servers=1, bandwidth_hz=20e6,
                              arrival_rate_hz=12.0,
                              beta=float(policy.config.env.beta), tau_s=0.05,
                              hardware=meta["env"]["hardware"],   # the policy's clock
                              scenario=scenarios.preset("burst", 60))
    e = ev.Evaluator(params, 3, 60, 10, policy.apply_fn, policy.params,
                     seed0=splits.TEST_SEED_BASE)
    sched = res["scenarios"]["burst"]["multipliers"]["scheduler"]
    fifo = e.run(ev.PolicySpec("f", "policy", "fifo_greedy"))["objective"]
    zero = e.run(ev.PolicySpec("z", "policy", sched, 0.0, 0.0))["objective"]
    sc = res["scenarios"]["burst"]
    np.testing.assert_allclose(sc["per_seed"][stage2.ROW_FIFO]["objective"], fifo, rtol=1e-6)
    np.testing.assert_allclose(sc["per_seed"][stage2.ROW_ZERO]["objective"], zero, rtol=1e-6)
    lam = sc["multipliers"]["learned_constant"]
    learned = e.run(ev.PolicySpec("l", "policy", sched, lam["lambda_s"],
                                  lam["mu_per_mhz"] / 1e6))["objective"]
    for name, ref in (("learned_minus_fifo", fifo), ("learned_minus_zero", zero)):
        diff = np.asarray(learned) - np.asarray(ref)
        got = sc["paired"][name]["objective"]
        assert got["mean"] == pytest.approx(diff.mean(), abs=1e-6)
        if diff.std(ddof=1) > 0:
            half = sps.t.ppf(0.975, 2) * diff.std(ddof=1) / math.sqrt(3)
            assert got["ci95"] == pytest.approx(half, rel=1e-4)
    # Power: headroom = no limits − λ=µ=0; MDE of learned − λ=µ=0 by scipy's t quantiles.
    pw = sc["power"]
    nolim = np.asarray(sc["per_seed"][stage2.ROW_NOLIM]["objective"])
    assert pw["headroom"] == pytest.approx(float(np.mean(nolim - np.asarray(zero))), abs=1e-6)
    sd = max((np.asarray(learned) - np.asarray(zero)).std(ddof=1),
             (nolim - np.asarray(zero)).std(ddof=1))
    mde = (sps.t.ppf(0.975, 2) + sps.t.ppf(0.8, 2)) * sd / math.sqrt(3)
    assert pw["mde"] == pytest.approx(mde, rel=1e-4, abs=1e-9)
    assert pw["resolvable"] == (pw["headroom"] >= 0.02 and pw["mde"] <= pw["headroom"] / 2)
    assert pw["note"]
    # The ablation row: the value filter with a first-come repair, per seed by evals.evaluate;
    # the two ablation pairs add up to PRADA (λ=µ=0) − FIFO.
    filt = e.run(ev.PolicySpec("v", "policy", "threshold_fifo"))["objective"]
    np.testing.assert_allclose(sc["per_seed"][stage2.ROW_FILTER]["objective"], filt, rtol=1e-6)
    p = sc["paired"]
    assert p["filter_minus_fifo"]["objective"]["mean"] + p["zero_minus_filter"]["objective"][
        "mean"] == pytest.approx(float(np.mean(np.asarray(zero) - np.asarray(fifo))), abs=1e-6)
    # The reference pair was chosen on validation; the hindsight row on these seeds.
    assert sc["grid"]["chosen_on"] == "validation" and "hindsight" in sc["grid"]


@pytest.mark.parametrize("args,needle", [
    (["--scenarios=nominal,rush"], "--scenarios"), (["--seeds=1"], "--seeds"),
    (["--policy=/nonexistent/x"], "--policy"),
    (["--dual_overrides=utilisation=2"], "--dual_overrides"), (["--split=tset"], "--split"),
    (["--split=validation"], "--split"), (["--budget=0"], "--budget"),
    (["--budget=1.5"], "--budget"), (["--budget=nan"], "--budget"),
    (["--seed0=-1"], "--seed0")])
def test_bad_flags_exit_2_one_line(tmp_path, args, needle, run_command):
    """In-process (the conftest's ``run_command``, same ``__main__`` as ``python -m``; the real
    entry runs as a subprocess in tests/test_cli_errors.py)."""
    out = tmp_path / "o"
    code, _, err = run_command("studies.stage2_verdict", f"--out={out}", *args, cwd=REPO)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert not out.exists()


class _FakeRunner:
    """Stands in for ``stage2.Runner``: per-seed metrics from a closed form in λ_s (objective
    peaks at λ_s = 0.1; utilisation falls with λ_s), so the row logic runs without an env."""
    screen = "policy"

    def __init__(self, shift=0.0):
        self.shift = shift

    def _m(self, lam):
        seeds = np.arange(3.0)
        obj = 0.5 - (np.log10(max(lam, 1e-4)) + 1.0) ** 2 / 100 + self.shift + 0.001 * seeds
        util = np.full(3, 0.6 / (1.0 + 10 * lam))
        return {k: obj if k == "objective" else (util if k == "server_util" else obj * 0)
                for k in stage2.METRICS}

    def run_prada(self, sched, lam, mu):
        return self._m(float(lam))

    def run(self, spec):
        return self._m(0.0)

    def run_grid(self, sched, lams, mus, budget=None):
        out = np.array([self._m(float(la))["objective"] for la in lams])
        if budget is not None:
            util = np.array([self._m(float(la))["server_util"].mean() for la in lams])
            out[util > budget] = np.nan
        return out


def test_evaluate_scenario_rows_hindsight_and_budget_flags():
    grid_kw = dict(lam=(0.0, 0.01, 0.1, 1.0), mu_per_mhz=(0.0,), fine=False)
    res = stage2.evaluate_scenario(_FakeRunner(), 4, (0.05, 0.0), None, None, grid_kw,
                                   log=lambda *a: None, choice_runner=_FakeRunner(0.01),
                                   hindsight=False)
    assert stage2.ROW_HINDSIGHT not in res["per_seed"] and "hindsight" not in res["grid"]
    assert res["grid"]["chosen_on"] == "validation" and res["grid"]["best"]["lambda_s"] == 0.1
    # A cap only λ_s = 1 meets (util 0.6/11 ≈ 0.055): the best feasible pair is λ_s = 1.
    res = stage2.evaluate_scenario(_FakeRunner(), 4, (0.05, 0.0), None, None, grid_kw,
                                   log=lambda *a: None, choice_runner=_FakeRunner(),
                                   hindsight=True, budget=0.06)
    assert res["grid"]["best"]["lambda_s"] == 1.0 and res["grid"]["budget_feasible"]
    assert res["grid"]["hindsight"]["best"]["lambda_s"] == 1.0
    # No pair meets it: said so.
    res = stage2.evaluate_scenario(_FakeRunner(), 4, (0.05, 0.0), None, None, grid_kw,
                                   log=lambda *a: None, choice_runner=_FakeRunner(),
                                   budget=0.01)
    assert res["grid"]["budget_feasible"] is False
    rep = stage2.budget_report(res["per_seed"], 0.01)
    assert stage2.ROW_NOLIM not in rep["occupancy"] and not any(rep["meets"].values())
