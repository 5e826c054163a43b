"""Capacity under an SLO (``evals.capacity``) against plain-loop references, the per-seed
flags of ``evals.report`` and the p90 of ``evals.evaluate``."""
from __future__ import annotations

import math

import numpy as np
import pytest

from evals import capacity as cap
from evals import curve, report
from evals import evaluate as ev


def _row(rng, s, *, rho=None, blocked=None, p90=None, acc=None):
    return {"rho": rng.uniform(0.1, 1.3, s) if rho is None else np.asarray(rho, float),
            "blocked_rate": (rng.choice([0.0, 0.0, 0.01], s) if blocked is None
                             else np.asarray(blocked, float)),
            "latency_p90_s": rng.uniform(1, 6, s) if p90 is None else np.asarray(p90, float),
            "accuracy": rng.uniform(0.7, 1.0, s) if acc is None else np.asarray(acc, float)}


def _ref_capacity(results, row, slo):
    """Plain loops: per seed walk the rates upward until the first miss."""
    rates = sorted(results)
    s_n = len(results[rates[0]][row]["rho"])
    caps = []
    for s in range(s_n):
        c = 0.0
        for r in rates:
            m = results[r][row]
            ok = (m["rho"][s] < 1 and m["blocked_rate"][s] <= report.BLOCKED_TOL
                  and m["latency_p90_s"][s] <= slo.latency_p90_s
                  and m["accuracy"][s] >= slo.accuracy)
            if not ok:
                break
            c = r
        caps.append(c)
    return caps


@pytest.mark.parametrize("seed", range(20))
def test_capacity_matches_a_plain_loop(seed):
    rng = np.random.default_rng(seed)
    rates = np.sort(rng.choice(np.arange(1, 40), size=rng.integers(2, 9), replace=False))
    results = {float(r): {"x": _row(rng, 5)} for r in rates}
    slo = cap.SLO(float(rng.uniform(2, 6)), float(rng.uniform(0.7, 0.95)))
    got = cap.capacity(results, "x", slo)
    want = _ref_capacity(results, "x", slo)
    assert got["per_seed"] == want
    assert got["capacity"] == min(want)
    assert got["censored"] == (min(want) == max(rates))


def test_capacity_is_monotone_and_names_what_binds():
    """A seed that misses the SLO at a middle rate has capacity below it even if a higher
    rate passes again; the first failing term is named."""
    ok = {"rho": [0.5], "blocked_rate": [0.0], "latency_p90_s": [1.0], "accuracy": [0.95]}
    slow = dict(ok, latency_p90_s=[9.0])
    unstable = dict(ok, rho=[1.2])
    results = {1.0: {"x": ok}, 2.0: {"x": slow}, 4.0: {"x": ok}, 8.0: {"x": unstable}}
    slo = cap.SLO(2.0, 0.9)
    c = cap.capacity(results, "x", slo)
    assert c["per_seed"] == [1.0] and c["binds"] == ["latency"]
    results[2.0]["x"] = ok
    c = cap.capacity(results, "x", slo)
    assert c["per_seed"] == [4.0] and c["binds"] == [report.UNSTABLE]
    results[1.0]["x"] = dict(ok, accuracy=[0.5])
    assert cap.capacity(results, "x", slo)["per_seed"] == [0.0]
    results[1.0]["x"] = dict(ok, blocked_rate=[0.01])
    assert cap.capacity(results, "x", slo)["binds"] == [report.U_BINDS]
    results[1.0]["x"] = dict(ok, rho=[float("nan")])   # no ρ measured: not stable
    assert cap.capacity(results, "x", slo)["per_seed"] == [0.0]


def test_slo_from_reference_and_sweep():
    ref = {"latency_p90_s": [2.0, 4.0], "accuracy": [0.9, 1.0]}
    slo = cap.slo_from_reference(ref, 2.0, 0.95)
    assert slo.latency_p90_s == pytest.approx(6.0) and slo.accuracy == pytest.approx(0.9025)
    with pytest.raises(ValueError):
        cap.slo_from_reference(ref, 2.0, 1.5)
    row = {"rho": [0.5, 0.5], "blocked_rate": [0, 0], "latency_p90_s": [5.0, 5.0],
           "accuracy": [0.92, 0.92]}
    results = {1.0: {"x": row}}
    sw = cap.sweep(results, "x", ref, (1.0, 2.0), (0.9, 1.0), 2.0, 0.95)
    # scale 1: L = 3 s < 5 s -> 0; scale 2: L = 6 s -> 1. retention 1.0: A = 0.95 > 0.92.
    assert sw["latency_scale"] == {"1": 0.0, "2": 1.0}
    assert sw["retention"] == {"0.9": 1.0, "1": 0.0}


def test_ratio_cells_and_reading():
    num = np.array([[2.0, 4.0, 0.0], [4.0, 4.0, 4.0]])
    ref = np.array([2.0, 0.0, 4.0])
    x, dropped = cap.ratio_cells(num, ref)
    assert x.shape == (2, 1, 3) and dropped == 1
    np.testing.assert_array_equal(x[:, 0, 0], [1.0, 2.0])
    assert np.all(np.isnan(x[:, 0, 1]))
    np.testing.assert_array_equal(x[:, 0, 2], [0.0, 1.0])
    assert cap.reading({"lo": 1.1, "hi": 2}) == "above 1"
    assert cap.reading({"lo": 0.2, "hi": 0.9}) == "below 1"
    assert cap.reading({"lo": 0.9, "hi": 1.1}) == "unresolved"
    assert cap.reading({"lo": float("nan"), "hi": 0.5}) == "below 1"


# ----------------------------------------------------------------------------- flags per seed

def _summ(**metrics):
    return report.summarize({"r": metrics})["r"]


def test_one_unstable_seed_flags_the_row_though_the_mean_is_below_one():
    """Issue 42, item 3: 4 of 8 seeds at ρ ≥ 1 while the mean reads 0.99."""
    rho = [1.05, 1.02, 1.01, 1.0, 0.95, 0.96, 0.97, 0.96]
    assert np.mean(rho) < 1.0
    row = _summ(rho=rho, latency_mean_s=[1.0] * 8)
    assert report.UNSTABLE in report.row_flags(row)
    assert not report.stable(row) and report.withheld(row, "latency_mean_s")
    assert report.stable(_summ(rho=[0.9] * 8))
    blocked = _summ(rho=[0.5] * 4, blocked_rate=[0, 0, 0, 0.002])
    assert report.U_BINDS in report.row_flags(blocked) and not report.stable(blocked)


def test_one_large_drift_flags_the_row_though_the_ci_includes_zero():
    drift = [-0.63, 0.73, 0.05, -0.02, 0.01, 0.0, 0.03, -0.1]
    row = _summ(steady_drift=drift)
    assert row["steady_drift"].low < 0 < row["steady_drift"].high
    assert report.row_flags(row) == [report.NOT_STEADY]
    assert report.row_flags(_summ(steady_drift=[0.3, -0.3, 0.1, 0.0])) == []


def test_summaries_without_seed_indicators_use_the_means():
    """An older summary (no per-seed indicator) is judged by its mean, as before."""
    from prada_jax import stats
    row = {"rho": stats.mean_ci([0.99, 1.0, 0.98]), "blocked_rate": stats.mean_ci([0.0] * 3)}
    assert report.row_flags(row) == []
    row["rho"] = stats.mean_ci([1.01, 1.0, 1.02])
    assert report.row_flags(row) == [report.UNSTABLE]


def test_crossover_skips_loads_where_a_row_is_unstable_on_a_seed():
    s = 8
    good = {"objective": np.full(s, 0.5), "rho": np.full(s, 0.5)}
    better = {"objective": np.linspace(0.6, 0.7, s), "rho": np.full(s, 0.5)}
    shaky = dict(better, rho=np.r_[np.full(s - 1, 0.5), 1.01])
    res = {1.0: {"P": shaky, "L": good}, 2.0: {"P": better, "L": good}}
    cx = curve.crossover(res, policy="P", reference="L")
    assert cx["load"] == 2.0 and cx["unstable_loads"] == [1.0]


# ----------------------------------------------------------------------------- p90

@pytest.mark.parametrize("seed", range(5))
def test_quantile_from_hist_is_the_lower_empirical_quantile(seed):
    rng = np.random.default_rng(seed)
    lat = rng.integers(0, 50, size=int(rng.integers(1, 300)))
    hist = np.bincount(lat, minlength=51).astype(float)
    for q in (0.5, 0.9, 0.95):
        want = np.sort(lat)[math.ceil(q * lat.size) - 1] * 0.05
        assert ev.quantile_from_hist(hist, 0.05, q) == pytest.approx(want)
    assert math.isnan(ev.quantile_from_hist(np.zeros(5), 0.05, 0.9))


# ----------------------------------------------------------------------------- the gate

def test_gate_needs_the_llm_alone_limited_by_load_not_by_accuracy():
    """A capacity of 0 from the accuracy target is below the grid's top, but it is not
    contention: the gate fails (deviation 1 of studies/capacity/README.md)."""
    from evals.capacity import analysis
    from evals.capacity.measure import ALL_SLM, LLM_ALONE, ZERO, sample_row

    def pt(acc, rho, p90=1.0):
        return {"rho": [rho] * 2, "blocked_rate": [0.0] * 2, "latency_p90_s": [p90] * 2,
                "accuracy": [acc] * 2, "objective": [acc] * 2}

    def grid(llm_acc):
        return {str(r): {LLM_ALONE: pt(llm_acc, rho), ALL_SLM: pt(0.8, 0.0),
                         sample_row(ZERO, 0): pt(0.85, rho / 2)}
                for r, rho in ((1.0, 0.3), (2.0, 0.6), (4.0, 1.2))}

    slo = cap.SLO(2.0, 0.9)
    for llm_acc, by_load in ((0.95, True), (0.85, False)):
        test = grid(llm_acc)
        caps = analysis.capacities(test, slo)
        g = analysis.gate(test, caps, [0])
        assert g["contended"] is True
        assert g["contended_by_load"] is by_load and g["passed"] is by_load
