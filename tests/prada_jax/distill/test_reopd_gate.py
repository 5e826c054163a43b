"""studies.reopd_gate (issue 53): the restated gate, the mini-pilot's extension, OPD's updates
at equal cost, the endpoints' readings, the feasibility script on the committed records, the
command's bad input, and (slow) a tiny end-to-end run that resumes to the same records."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prada_jax.errors import BadInput
from studies.reopd_gate import rules

ROOT = Path(__file__).resolve().parents[3]


def _rows(p_success, S, P, seed):
    rng = np.random.default_rng(seed)
    return (rng.random((S, P)) < p_success).astype(np.float64)


def test_gate_needs_all_three_checks():
    S, P = 8, 400
    cold = (np.arange(P) % 10 < 7).astype(np.float64)           # 0.70: headroom 0.30
    opd = np.tile((np.arange(P) % 20 < 19).astype(np.float64), (S, 1))   # 0.95
    sft = np.tile((np.arange(P) % 10 < 9).astype(np.float64), (S, 1))    # 0.90
    g = rules.gate(opd, sft, cold, [200, 200], n_boot=300)
    assert g["passed"] and all(g["checks"].values())
    # OPD no better than SFT: G2 fails
    g = rules.gate(opd, opd, cold, [200, 200], n_boot=300)
    assert not g["passed"] and not g["checks"]["G2_opd_vs_sft"] and g["outcome"] == rules.NO_GATE
    # a cold start at 0.95: headroom 0.05 fails G3 (and G1: no gain)
    hot = (np.arange(P) % 20 < 19).astype(np.float64)
    g = rules.gate(opd, sft, hot, [200, 200], n_boot=300)
    assert not g["checks"]["G3_headroom"] and not g["checks"]["G1_opd_gain"]
    assert g["G3"]["mean"] == pytest.approx(0.05)


def test_mini_pilot_extends_only_past_a_clear_edge():
    assert rules.extension({1e-3: 0.90, 3e-3: 0.95}, (1e-3, 3e-3)) == pytest.approx(1e-2)
    assert rules.extension({1e-3: 0.95, 3e-3: 0.90}, (1e-3, 3e-3)) == pytest.approx(3e-4)
    assert rules.extension({1e-3: 0.95, 3e-3: 0.955}, (1e-3, 3e-3)) is None
    assert rules.choose_lr({1e-3: 0.95, 3e-3: 0.95}) == 1e-3       # ties: the smaller


def test_opd_updates_at_equal_cost_are_a_multiple_of_25_at_least_25():
    assert rules.n_cost(400, 25, 0.01, 3.0) == 25
    assert rules.n_cost(400, 25, 1.0, 2.0) == 200
    assert rules.n_cost(400, 25, 1.0, 1.1) == 375


def test_endpoints_read_noninferiority_superiority_and_time():
    S, P = 8, 300
    cold = (np.arange(P) % 10 < 7).astype(np.float64)
    opd = np.tile((np.arange(P) % 20 < 19).astype(np.float64), (S, 1))
    X = {"opd": opd, "reopd": opd.copy(), "sft_cont": opd * (np.arange(P) % 10 < 9),
         "opd_cost": np.tile(cold, (S, 1))}
    steps = [0, 25, 50, 75]
    oc = np.tile([0.7, 0.8, 0.9, 0.95], (S, 1))
    rc = np.tile([0.7, 0.93, 0.95, 0.95], (S, 1))
    curve = {"steps": steps, "opd": oc, "reopd": rc, "cold": 0.7,
             "rollout": {"opd": 3.0, "reopd": 0.03}, "total": {"opd": 3.0, "reopd": 0.05},
             "rollout_l0": {"opd": 0.06, "reopd": 0.03}}
    e = rules.endpoints(X, cold, [150, 150], curve, n_boot=300)
    assert e["a_reopd_vs_opd"]["verdict"] == "pass"          # identical: non-inferior
    assert e["e1_reopd_vs_sft"]["verdict"] == "pass"
    assert e["e2_reopd_vs_opd_equal_cost"]["verdict"] == "pass"
    c = e["c_time_to_80"]
    # level 0.7 + 0.8 * 0.25 = 0.90: OPD at 50, ReOPD at 25
    assert c["updates_only"]["opd_step"] == 50 and c["updates_only"]["reopd_step"] == 25
    assert c["rollout"]["ratio"] == pytest.approx(25 * 0.03 / (50 * 3.0))
    assert c["verdict"] == "pass" and c["paper_4x"]
    # ReOPD below OPD by 0.05 everywhere: (a) fails
    X["reopd"] = X["opd"] * (np.arange(P) % 20 != 0)   # 0.90 vs 0.95
    e = rules.endpoints(X, cold, [150, 150], curve, n_boot=300)
    assert e["a_reopd_vs_opd"]["verdict"] == "fail"


def test_feasibility_recomputes_from_the_committed_regime_records():
    from studies.reopd_gate import feasibility
    res = feasibility.compute()
    g = res["checks"]["gate"]
    assert g["G1_opd_minus_cold"]["value"] == pytest.approx(0.21875)   # the regime's gate
    assert g["G2_opd_minus_sft"]["value"] == pytest.approx(0.0716145833, abs=1e-6)
    assert g["G3_headroom"]["value"] == pytest.approx(1 - 0.77734375)
    stored = json.loads((ROOT / "studies/reopd_gate/results/feasibility.json").read_text())
    assert stored["checks"]["gate"]["G2_opd_minus_sft"]["8_seeds"]["se"] == pytest.approx(
        g["G2_opd_minus_sft"]["8_seeds"]["se"])


@pytest.mark.parametrize("argv,flag", [
    (["--parts=nope"], "--parts"),
    (["--seeds=0-9"], "--seeds"),
    (["--parts=seeds"], "--parts"),
])
def test_bad_input_is_one_named_error(tmp_path, argv, flag):
    from studies.reopd_gate.__main__ import main
    with pytest.raises(BadInput, match=flag):
        main([f"--out={tmp_path / 'o'}", f"--regime={tmp_path / 'r'}"] + argv)
    assert not (tmp_path / "o" / "study.json").exists()


def test_missing_regime_folder_exits_2_with_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "studies.reopd_gate", f"--out={tmp_path / 'o'}",
                        f"--regime={tmp_path / 'none'}", "--parts=reopd_pilot"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "--regime" in p.stderr


@pytest.mark.slow
def test_quick_study_runs_and_a_rerun_gives_the_same_records(tmp_path):
    pytest.importorskip("torch")
    from studies.reopd_gate.__main__ import main
    from studies.reopd_kg import resume
    from studies.reopd_regime.__main__ import main as regime
    reg, out = tmp_path / "regime", tmp_path / "gate"
    assert regime(["--quick", f"--out={reg}", "--parts=teacher,cold"]) == 0
    assert main(["--quick", f"--regime={reg}", f"--out={out}"]) == 0
    res = json.loads((out / "study.json").read_text())
    assert res["analysis"]["seeds"] == [0, 1] and res["analysis"]["complete"]
    recs = sorted((out / "runs").rglob("*.json"))
    first = {p.relative_to(out): resume.comparable(json.loads(p.read_text())) for p in recs}
    # a seed's records and workdirs removed and rerun (as after a kill before its record):
    # the same records
    for p in (out / "runs" / "compare").glob("*_seed1.json"):
        p.unlink()
    import shutil
    for d in (out / "compare").glob("*/seed_1"):
        shutil.rmtree(d)
    assert main(["--quick", f"--regime={reg}", f"--out={out}", "--parts=seeds,analysis"]) == 0
    again = {p.relative_to(out): resume.comparable(json.loads(p.read_text()))
             for p in sorted((out / "runs").rglob("*.json"))}
    assert again == first
