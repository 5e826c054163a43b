"""The ReOPD-vs-OPD addendum (studies/reopd_vs_opd/addendum.py): its timing statistics,
speed ratios, equal-wall budget and verdicts against NumPy / SciPy / hand arithmetic, its bad
input, and (slow) the ``--quick`` path end to end."""
import json

import numpy as np
import pytest
from scipy import stats as sps

from studies import reopd_vs_opd as st
from studies.reopd_vs_opd import addendum as ad


def _costs(rng, n, turns_lo=5, turns_hi=30):
    out = []
    for i in range(n):
        out.append({"supervised_turns": int(rng.integers(turns_lo, turns_hi)),
                    "tool_calls": int(rng.integers(0, 9)),
                    "rollout_s": float(rng.uniform(0.01, 2.0)),
                    "scoring_s": float(rng.uniform(0.0, 0.5)),
                    "update_s": float(rng.uniform(0.0, 0.5)), "timed": i > 0})
    return out


def test_timing_stats_match_numpy_over_timed_updates_only():
    rng = np.random.default_rng(3)
    costs = _costs(rng, 12)
    costs[5]["timed"] = False                     # a second compiling update
    costs[7]["supervised_turns"] = 0              # an update with nothing supervised
    got = ad.timing_stats(costs)
    keep = [c for c in costs if c["timed"] and c["supervised_turns"] > 0]
    roll = np.array([c["rollout_s"] for c in keep])
    turns = np.array([c["supervised_turns"] for c in keep], float)
    tot = roll + np.array([c["scoring_s"] + c["update_s"] for c in keep])
    assert got["timed_updates"] == len(keep) == 9 and got["untimed_updates"] == 3
    assert got["rollout_s_per_turn_median"] == pytest.approx(np.median(roll / turns))
    assert got["rollout_s_per_turn_sum"] == pytest.approx(roll.sum() / turns.sum())
    assert got["update_total_s_median"] == pytest.approx(np.median(tot))
    assert got["turns_per_update_mean"] == pytest.approx(turns.mean())
    assert got["tool_calls"] == sum(c["tool_calls"] for c in costs)   # every update's calls
    none = ad.timing_stats([dict(costs[0])])   # only a compiling update: no statistic
    assert none["timed_updates"] == 0 and none["rollout_s_per_turn_median"] is None


def test_interleaved_speed_ratios_by_hand():
    def run(med, s, turns):
        return {"rollout_s_per_turn_median": med, "rollout_s_per_turn_sum": s,
                "turns_per_update_mean": turns}
    runs = {"opd": run(0.010, 0.011, 230.0), "opd_lat0": run(0.004, 0.005, 231.0),
            "reopd_k0.6": run(0.0008, 0.001, 230.0)}
    b = ad.speed_interleaved(runs, [30.0, 10.0, 20.0], n_updates=20, n_seeds=10)
    assert b["C_s"] == 20.0                                    # median of the three
    assert b["ratio_latency"] == pytest.approx(12.5)
    assert b["ratio_lat0"] == pytest.approx(5.0)
    assert b["verdict_rollout"] == "pass"
    # 20 updates × 230 turns = 4600 turns carry C = 20 s: 0.0008 + 20/4600 s per turn
    assert b["ratio_with_pool"] == pytest.approx(0.010 / (0.0008 + 20 / 4600))
    assert b["verdict_with_pool"] == "fail"                   # 0.010 / 0.005148 = 1.94 ≤ 2
    assert b["ratio_with_pool_per_seed"] == pytest.approx(0.010 / (0.0008 + 200 / 4600))
    s = ad.speed_interleaved(runs, [30.0, 10.0, 20.0], 20, 10, stat="sum")
    runs["opd_lat0"]["rollout_s_per_turn_median"] = None      # a run without timed updates
    n = ad.speed_interleaved(runs, [30.0], 20, 10)
    assert n["ratio_latency"] is None and n["verdict_rollout"] == "no timed update"
    assert s["ratio_lat0"] == pytest.approx(5.0) and s["ratio_latency"] == pytest.approx(11.0)


def test_n_wall_reproduces_the_studys_far_budget():
    # the study's far timings (studies/reopd_vs_opd/results/study.json) gave N_w = 261
    assert ad.n_wall(20, 6.311496451000494, 0.4835354360002384) == 261
    assert ad.n_wall(20, 12.190088651999758, 5.968942862999029) == 41   # near
    assert ad.n_wall(20, 1.0, 100.0) == 1                                # at least one update
    assert ad.n_wall(20, None, 1.0) is None


def test_near_verdicts_and_mde_match_scipy():
    rng = np.random.default_rng(7)
    seeds = list(range(10))
    runs = {k: {"seeds": seeds, "success": list(rng.uniform(0.6, 0.8, 10)), "tool_calls": 0}
            for k in ad.NEAR_METHODS}
    runs["opd"]["tool_calls"] = 120
    v = ad.near_verdicts(runs)
    for key, b in (("a_equal_turns", "opd"), ("c_vs_sft", "sft_cont"), ("d_kappa", "reopd_k1")):
        diff = np.array(runs["reopd_k0.6"]["success"]) - np.array(runs[b]["success"])
        lo, hi = sps.t.interval(0.95, 9, loc=diff.mean(), scale=sps.sem(diff))
        assert (v[key]["ci_low"], v[key]["ci_high"]) == pytest.approx((lo, hi), rel=1e-6)
        mde = (sps.t.ppf(0.975, 9) + sps.t.ppf(0.8, 9)) * diff.std(ddof=1) / np.sqrt(10)
        assert v[key]["mde"] == pytest.approx(mde, rel=1e-6)
        want = (st.superior({"ci_low": lo, "ci_high": hi}) if key == "c_vs_sft"
                else st.noninferior({"ci_low": lo, "ci_high": hi}, 0.02))
        assert v[key]["verdict"] == want
    assert v["e_tool_calls"]["verdict"] == "pass"
    runs["reopd_k1"]["tool_calls"] = 1
    assert ad.near_verdicts(runs)["e_tool_calls"]["verdict"] == "fail"


def test_moved_is_the_change_from_the_cold_start():
    runs = {"x": {"success": [0.70, 0.72, 0.69, 0.75]}, "y": {"success": []}}
    m = ad.moved(runs, 0.684)
    d = np.array(runs["x"]["success"]) - 0.684
    lo, hi = sps.t.interval(0.95, 3, loc=d.mean(), scale=sps.sem(d))
    assert set(m) == {"x"}
    assert m["x"]["mean"] == pytest.approx(d.mean())
    assert (m["x"]["ci_low"], m["x"]["ci_high"]) == pytest.approx((lo, hi), rel=1e-6)


def test_addendum_bad_input_is_refused_before_writing(tmp_path):
    from prada_jax.errors import BadInput
    out = tmp_path / "o"
    bad_json = tmp_path / "bad.json"
    bad_json.write_text(json.dumps({"cold_starts": []}))
    for argv in (["--out", str(out), "--parts=nope"],
                 ["--out", str(out), "--parts=wall", "--quick"],
                 ["--out", str(out), "--parts=timing"],
                 ["--out", str(out), f"--study_json={bad_json}",
                  "--parts=timing"],
                 ["--out", str(out), f"--study_json={tmp_path / 'none.json'}"]):
        with pytest.raises(BadInput):
            ad.main(argv)
    assert not out.exists()


@pytest.mark.slow
def test_addendum_quick_end_to_end(tmp_path):
    """``--quick`` (≈ 2–3 min on the shared CPU): every part runs on the tiny
    cache; the timing rounds alternate run by run with C measured after the stated rounds; the
    wall run has N_w updates from the stored medians; ReOPD makes no tool call."""
    out = tmp_path / "q"
    assert ad.main(["--quick", "--out", str(out)]) == 0
    res = json.loads((out / "addendum.json").read_text())
    a = ad.ADD_QUICK
    assert res["synthetic"] is True and set(res) >= {"near_long", "timing", "wall"}
    for name, c in res["timing"]["cold"].items():
        runs = [e for e in c["events"] if e[1] != "C"]
        assert [e[1] for e in runs] == list(ad.TIMED_RUNS) * a.rounds       # alternated
        assert [e[0] for e in c["events"] if e[1] == "C"] == list(a.coll_after)
        assert len(c["collections"]) == len(a.coll_after)
        for k in ad.TIMED_RUNS:
            assert len(c["runs"][k]["per_update"]) == a.rounds
            assert c["runs"][k]["timed_updates"] >= 1
        assert c["runs"]["reopd_k0.6"]["tool_calls"] == 0
        assert c["N_wall"] == ad.n_wall(a.wall_base, c["t_opd_s"], c["t_reopd_s"])
    w = res["wall"]
    assert w["N_wall"] == res["timing"]["cold"]["far"]["N_wall"]
    assert w["run"]["updates"] == w["N_wall"] and w["run"]["tool_calls"] == 0
    n = res["near_long"]
    assert set(n["runs"]) == set(ad.NEAR_METHODS)
    assert all(r["updates"] == a.near_updates for r in n["runs"].values())
    assert set(n["verdicts"]) == {"a_equal_turns", "c_vs_sft", "d_kappa", "e_tool_calls"}
    assert "(C) Near cold start" in (out / "addendum.md").read_text()
