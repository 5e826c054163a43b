"""The ReOPD-vs-OPD study command (studies/reopd_vs_opd/__init__.py): its verdict arithmetic against
SciPy / plain Python, and (slow) the ``--quick`` study end to end."""
import json

import numpy as np
import pytest
from scipy import stats as sps

from studies import reopd_vs_opd as st


def _runs(a, b):
    seeds = list(range(len(a)))
    return {"x": {"seeds": seeds, "success": list(a)}, "y": {"seeds": seeds, "success": list(b)}}


def test_paired_difference_matches_scipy_t_interval():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.3, 0.7, 10), rng.uniform(0.3, 0.7, 10)
    d = st.paired(_runs(a, b), "x", "y")
    diff = a - b
    lo, hi = sps.t.interval(0.95, len(diff) - 1, loc=diff.mean(), scale=sps.sem(diff))
    assert d["n"] == 10
    assert d["mean"] == pytest.approx(diff.mean())
    assert (d["ci_low"], d["ci_high"]) == pytest.approx((lo, hi), rel=1e-6)
    assert d["mean_a"] == pytest.approx(a.mean()) and d["mean_b"] == pytest.approx(b.mean())


def test_speed_ratios_by_hand():
    reopd = {"rollout_s_per_turn": 0.002, "rollout_s_timed": 0.2, "turns_timed": 100,
             "totals": {"supervised_turns": 120}}
    opd = {"rollout_s_per_turn": 0.012}
    opd0 = {"rollout_s_per_turn": 0.006}
    out = st.speed({"runs": {"reopd_k0.6": reopd, "opd": opd, "opd_lat0": opd0}},
                   {"seconds": 0.6}, n_seeds=3)
    assert out["ratio_latency"] == pytest.approx(6.0)
    assert out["ratio_lat0"] == pytest.approx(3.0)
    assert out["verdict_rollout"] == "fail"          # 3× at latency 0 is below 4
    # with the pool: 0.2/100 + 0.6/120 = 0.007 s per turn; 0.012 / 0.007
    assert out["ratio_with_pool"] == pytest.approx(0.012 / 0.007)
    assert out["verdict_with_pool"] == "fail"        # 1.71 is not > 2
    assert out["ratio_with_pool_per_seed"] == pytest.approx(0.012 / (0.002 + 1.8 / 120))


def test_bad_input_is_refused_before_writing(tmp_path):
    from prada_jax.errors import BadInput
    for argv in (["--out", str(tmp_path / "o"), "--updates=0"],
                 ["--out", str(tmp_path / "o"), "--seeds=0-3", "--pilot_seeds=3-4"],
                 ["--out", str(tmp_path / "o"), "--cache", str(tmp_path)]):
        with pytest.raises(BadInput):
            st.main(argv)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_quick_study_end_to_end(tmp_path):
    """Every stage runs on the tiny cache; the ReOPD runs make no tool call; the report and the
    per-seed JSON are written."""
    assert st.main(["--quick", "--out", str(tmp_path / "q")]) == 0
    res = json.loads((tmp_path / "q" / "study.json").read_text())
    assert res["synthetic"] is True
    assert [c["name"] for c in res["cold_starts"]] == ["far", "near"]
    assert res["cold_starts"][1]["reached"] is False        # the quick near gate is unreachable
    for study in res["studies"]:
        runs = study["runs"]
        assert set(runs) == {"opd", "reopd_k0.6", "reopd_k0.8", "reopd_k1", "reopd_exact",
                             "sft_cont", "reopd_k0.6_wall", "opd_lat0"}
        for name, r in runs.items():
            if name.startswith("reopd"):
                assert r["tool_calls"] == 0
                assert 0 < r["totals"]["supervised_turns"] <= r["updates"] * 2 * study["B"]
            if name != "opd_lat0":
                assert len(r["success"]) == 2
        assert set(study["verdicts"]) >= {"a_equal_turns", "a_equal_wall", "b_speed",
                                          "c_vs_sft", "d_kappa", "e_tool_calls"}
    assert "Cold starts" in (tmp_path / "q" / "report.md").read_text()
