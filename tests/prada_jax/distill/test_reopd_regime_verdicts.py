"""The registered claims of studies.reopd_regime on constructed outcomes whose answers are known
by hand: the share of OPD's gain, non-inferiority and superiority readings, the power note,
time to 80 % of OPD's gain in modelled cost, zero tool calls and the one-sided budget check."""
import math

import numpy as np
import pytest

from studies.reopd_regime import verdicts as V


def _world(seed=0, S=8, P=512):
    rng = np.random.default_rng(seed)
    cold = (rng.random(P) < 0.3).astype(float)
    gain_pool = np.flatnonzero(cold == 0)

    def plus(k):   # every seed solves k more problems than the cold start (different ones)
        x = np.repeat(cold[None], S, 0)
        for s in range(S):
            x[s, rng.choice(gain_pool, k, replace=False)] = 1
        return x
    return cold, plus


def test_share_of_gain_and_the_readings():
    cold, plus = _world()
    X = {"opd": plus(80), V.R: plus(40), "reopd_k1": plus(40), "reopd_k0.8": plus(40),
         "sft_cont": plus(2), "opd_cost": plus(40)}
    out = V.verdicts(X, cold, [512], {"opd": 100, V.R: 0, "reopd_k1": 0}, n_boot=400)
    sh = out["a_equal_turns"]["share"]
    assert sh["share"] == pytest.approx(0.5)               # 40 / 80 solved problems per seed
    assert sh["ci_low"] < 0.5 < sh["ci_high"]
    a = out["a_equal_turns"]
    assert a["mean"] == pytest.approx(-40 / 512) and a["verdict"] == "fail"   # < −0.02 surely
    assert out["b_equal_cost"]["share"]["share"] == pytest.approx(1.0)
    assert out["e_vs_sft"]["verdict"] == "pass"            # +38/512 with CI above 0
    assert out["f_tool_calls"]["verdict"] == "pass"
    assert out["budget_moved"] and out["moved"]["opd"]["ci_low"] > 0


def test_equal_methods_pass_noninferiority_and_leave_superiority_unresolved():
    cold, plus = _world(1)
    base = plus(60)
    X = {"opd": base, V.R: base.copy(), "reopd_k1": base.copy(), "sft_cont": base.copy()}
    out = V.verdicts(X, cold, [256, 256], {"opd": 5, V.R: 0, "reopd_k1": 0}, n_boot=200)
    assert out["a_equal_turns"]["verdict"] == "pass"       # d = 0 exactly, CI [0, 0]
    assert out["d_kappa"]["verdict"].startswith("unresolved")
    assert out["d_kappa"]["noninferior_reading"] == "pass"


def test_unresolved_with_a_large_mde_says_the_design_lacked_power():
    rng = np.random.default_rng(2)
    S, P = 3, 40
    cold = np.zeros(P)
    X = {k: (rng.random((S, P)) < 0.5).astype(float) for k in ("opd", V.R, "reopd_k1",
                                                               "sft_cont")}
    out = V.verdicts(X, cold, [P], {"opd": 1, V.R: 0, "reopd_k1": 0}, n_boot=300)
    e = out["e_vs_sft"]
    assert e["mde"] > 0.02 and not e["powered"]
    if e["ci_low"] <= 0 <= e["ci_high"]:
        assert "lacked power" in e["verdict"]


def test_tool_calls_and_one_sided_budget():
    cold, plus = _world(3)
    harm = np.repeat(cold[None], 8, 0)
    harm[:, np.flatnonzero(cold == 1)[:30]] = 0           # every method only harms
    X = {k: harm.copy() for k in ("opd", V.R, "reopd_k1", "sft_cont")}
    out = V.verdicts(X, cold, [512], {"opd": 10, V.R: 3, "reopd_k1": 0}, n_boot=200)
    assert out["f_tool_calls"]["verdict"] == "fail"        # a ReOPD run called the tool
    assert out["moved"]["opd"]["ci_high"] < 0
    assert out["budget_moved"] is False and "did not move" in out["budget_note"]


def test_time_to_80_percent_in_modelled_cost_by_hand():
    steps = [0, 25, 50, 75, 100]
    # OPD: 0.2 -> 0.4 (final gain 0.2; level 0.2 + 0.16 = 0.36 first reached at 75)
    opd = np.array([[0.2, 0.26, 0.32, 0.36, 0.40]] * 4)
    reo = np.array([[0.2, 0.30, 0.36, 0.38, 0.39]] * 4)  # reaches 0.36 at 50
    got = V.time_to_gain(steps, opd, reo, 0.2, cost_opd=4.0, cost_reopd=1.0, n_boot=100,
                         seed=0)
    assert got["level"] == pytest.approx(0.36)
    assert (got["opd_step"], got["reopd_step"]) == (75, 50)
    assert got["ratio"] == pytest.approx(50 * 1.0 / (75 * 4.0))
    assert got["verdict"] == "pass"                       # identical seeds: CI = the point
    never = np.array([[0.2, 0.25, 0.28, 0.30, 0.31]] * 4)
    got2 = V.time_to_gain(steps, opd, never, 0.2, 4.0, 1.0, n_boot=50, seed=0)
    assert got2["reopd_step"] is None and got2["verdict"].startswith("fail")
    assert math.isinf(got2["ratio"])
    assert V.first_reach(steps, [0.1, 0.2, 0.3], 0.25) == 50
