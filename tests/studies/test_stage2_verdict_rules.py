"""studies.stage2_verdict.verdict: the pre-registered rules of studies/stage2_verdict/registration.md applied to
per-seed objectives, checked against scipy's Student-t interval and hand-built cases."""
import numpy as np
import pytest
from scipy import stats as sps

from studies import stage2_verdict as stage2
from studies.stage2_verdict import verdict
from prada_jax import stats

ROWS = (stage2.ROW_CONST, stage2.ROW_COND, stage2.ROW_BEST, stage2.ROW_ZERO, stage2.ROW_FIFO,
        stage2.ROW_NOLIM, stage2.ROW_FILTER)


def _report(shift: dict, n=10, noise=0.002, seed=0, util=None):
    """Per-seed objectives: a common per-seed level + a row's shift + small noise."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0.7, 0.05, n)
    ps = {r: {"objective": list(base + shift.get(r, 0.0) + rng.normal(0, noise, n)),
              "server_util": list(np.full(n, (util or {}).get(r, 0.3)))} for r in ROWS}
    h = float(np.mean(np.subtract(ps[stage2.ROW_NOLIM]["objective"],
                                  ps[stage2.ROW_ZERO]["objective"])))
    mde = max(stats.paired_mde(ps[r]["objective"], ps[stage2.ROW_ZERO]["objective"])
              for r in (stage2.ROW_CONST, stage2.ROW_NOLIM))
    return {"per_seed": ps, "power": {"headroom": h, "mde": mde}}


def test_paired_ci_matches_scipy():
    rep = _report({stage2.ROW_CONST: 0.01}, n=9, noise=0.01)
    ps = rep["per_seed"]
    d = np.subtract(ps[stage2.ROW_CONST]["objective"], ps[stage2.ROW_ZERO]["objective"])
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    got = verdict.paired_ci(ps, stage2.ROW_CONST, stage2.ROW_ZERO)
    assert got["mean"] == pytest.approx(d.mean()) and got["n"] == 9
    assert got["lo"] == pytest.approx(lo) and got["hi"] == pytest.approx(hi)


def test_gate_and_pass_fail():
    # headroom 0.05, learned takes 0.04 of it: resolvable, beats zero, conditioned better
    good = _report({stage2.ROW_NOLIM: 0.05, stage2.ROW_CONST: 0.04, stage2.ROW_BEST: 0.04,
                    stage2.ROW_COND: 0.048})
    j = verdict.judge(good, outage=True)
    assert j["resolvable"]
    assert j["targets"] == {"learned_beats_zero": "pass", "learned_near_reference": "pass",
                            "conditioned_beats_constant": "pass"}
    # learned = zero, reference 0.04 better: both fail
    bad = _report({stage2.ROW_NOLIM: 0.05, stage2.ROW_BEST: 0.04, stage2.ROW_COND: -0.01})
    j = verdict.judge(bad, outage=True)
    assert j["targets"] == {"learned_beats_zero": "fail", "learned_near_reference": "fail",
                            "conditioned_beats_constant": "fail"}
    # headroom below 0.02: nothing is judged, whatever the learned row does
    small = _report({stage2.ROW_NOLIM: 0.01, stage2.ROW_CONST: 0.04})
    j = verdict.judge(small)
    assert not j["resolvable"] and "no room" in j["gate"]
    assert set(j["targets"].values()) == {"cannot resolve"}
    # headroom 0.03 but noisy seeds: MDE > headroom/2
    noisy = _report({stage2.ROW_NOLIM: 0.03}, n=4, noise=0.05)
    ok, why = verdict.gate(noisy["power"]["headroom"], noisy["power"]["mde"])
    assert noisy["power"]["mde"] > noisy["power"]["headroom"] / 2
    assert not ok and ("too few seeds" in why or "no room" in why)


def test_budget_parts():
    util = {stage2.ROW_CONST: 0.305, stage2.ROW_ZERO: 0.40, stage2.ROW_BEST: 0.29,
            stage2.ROW_FIFO: 0.7}
    rep = _report({stage2.ROW_CONST: -0.001}, util=util)
    rep["budget"] = {"cap": 0.30, "tolerance": 0.02}
    rep["grid"] = {"budget_feasible": True}
    b = verdict.judge(rep)["budget"]
    # 0.305 <= 0.30 * 1.02 = 0.306: met within 2 %; λ=0 at 0.40 violates
    assert b["parts"] == {"learned_meets_cap": "pass", "zero_violates_cap": "pass",
                          "learned_near_best_feasible": "pass"} and b["verdict"] == "pass"
    util[stage2.ROW_CONST] = 0.307
    rep = _report({stage2.ROW_CONST: -0.001}, util=util)
    rep["budget"], rep["grid"] = {"cap": 0.30, "tolerance": 0.02}, {"budget_feasible": False}
    b = verdict.judge(rep)["budget"]
    assert b["parts"]["learned_meets_cap"] == "fail" and b["verdict"] == "fail"
    assert b["parts"]["learned_near_best_feasible"] == "cannot resolve"
    # the objective part: learned 0.05 below the feasible reference with a tiny MDE fails
    util[stage2.ROW_CONST] = 0.28
    rep = _report({stage2.ROW_CONST: -0.05}, util=util)
    rep["budget"], rep["grid"] = {"cap": 0.30, "tolerance": 0.02}, {"budget_feasible": True}
    b = verdict.judge(rep)["budget"]
    assert b["parts"]["learned_near_best_feasible"] == "fail"


def test_the_committed_tables_and_verdicts_recompute_from_the_records(tmp_path, run_command):
    """``--report_only`` on the committed runs: the tables byte-identical, and the verdicts
    as registration.md's verdict table states them (transcribed here by hand)."""
    from pathlib import Path

    res = Path(__file__).resolve().parents[2] / "studies" / "stage2_verdict" / "results"
    for run in verdict.REGISTERED_RUNS:
        f = verdict.run_file(res, run)
        (tmp_path / f.name).write_text(f.read_text())
    code, out, err = run_command("studies.stage2_verdict", "--report_only", f"--out={tmp_path}")
    assert code == 0, err
    assert ((tmp_path / verdict.TABLES_FILE).read_text()
            == (res / verdict.TABLES_FILE).read_text())
    got = {(run, name): j["targets"]
           for run, scs in verdict.judge_runs(verdict.read_runs(res)).items()
           for name, j in scs.items()}
    U, P, F = verdict.UNRESOLVED, verdict.PASS, verdict.FAIL
    assert got[("presets", "slow_server")] == {"learned_beats_zero": P,
                                               "learned_near_reference": F}
    assert got[("variants", "outage_burst_m2")] == {"learned_beats_zero": F,
                                                    "learned_near_reference": P,
                                                    "conditioned_beats_constant": F}
    assert got[("budget", "nominal")]["budget"] == F
    for key in (("nominal", "nominal"), ("presets", "outage_burst"),
                ("presets", "bandwidth_bound"), ("variants", "bandwidth_bound_dense")):
        assert set(got[key].values()) == {U}, key
    assert "presets/slow_server: resolvable" in out
