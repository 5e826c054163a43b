"""studies.reopd_regime (issue 44): its decision rules (plateau, lr-grid extension, the gate)
against hand-worked cases, the TensorBoard-to-JSON curves, the declared count mapping, the
command's bad-input contract, and (slow) a tiny end-to-end run that resumes."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prada_jax.errors import BadInput
from studies import reopd_regime as S
from studies.reopd_regime import curves
from studies.reopd_regime.__main__ import main

REPO = Path(__file__).resolve().parents[3]


def test_plateau_is_the_first_check_not_above_the_best_of_the_three_before_by_tol():
    c = [(100, 0.10), (200, 0.20), (300, 0.30), (400, 0.35), (500, 0.355), (600, 0.40)]
    assert S.plateau(c, 0.01, 3, 400) == 500          # 0.355 <= 0.35 + 0.01
    assert S.plateau(c, 0.001, 3, 400) is None        # every check rises by more than 0.001
    assert S.plateau(c[:3] + [(400, 0.30)], 0.01, 3, 400) == 400
    assert S.plateau(c[:3] + [(400, 0.30)], 0.01, 3, 500) is None   # not before min_step


def test_lr_grid_extends_past_an_edge_at_most_twice_per_side():
    assert S.snap13(1e-4 / 10 ** 0.5) == pytest.approx(3e-5)
    assert S.snap13(3e-3 * 10 ** 0.5) == pytest.approx(1e-2)
    g = (1e-4, 3e-4, 1e-3)
    assert S.extend_grid(g, {1e-4: 0.1, 3e-4: 0.2, 1e-3: 0.3}, 2) == pytest.approx(3e-3)
    assert S.extend_grid(g, {1e-4: 0.3, 3e-4: 0.2, 1e-3: 0.1}, 2) == pytest.approx(3e-5)
    assert S.extend_grid(g, {1e-4: 0.1, 3e-4: 0.3, 1e-3: 0.1}, 2) is None
    g2 = g + (3e-3, 1e-2)
    m = {1e-4: 0.1, 3e-4: 0.1, 1e-3: 0.1, 3e-3: 0.2, 1e-2: 0.3}
    assert S.extend_grid(g2, m, 2) is None            # two extensions above already
    assert S.choose_lr({1e-4: 0.3, 3e-4: 0.3, 1e-3: 0.1}) == 1e-4   # ties: the smaller


def _rows(rates, P, rng):
    return np.array([(rng.random(P) < r).astype(float) for r in rates])


def test_gate_passes_only_when_all_three_checks_hold():
    rng = np.random.default_rng(0)
    P = 256
    cold = (rng.random(P) < 0.3).astype(float)
    teacher = np.maximum(cold, (rng.random(P) < 0.9).astype(float))
    # OPD: every seed adds 40 solved problems to the cold start's (gain 40/256 = +0.156)
    opd = np.repeat(cold[None], 3, 0)
    for s in range(3):
        idx = np.flatnonzero(opd[s] == 0)[s * 3: s * 3 + 40]
        opd[s, idx] = 1
    sft = np.repeat(cold[None], 3, 0)
    sft[0, np.flatnonzero(cold == 0)[:2]] = 1           # +2/768: below 0.01
    g = S.gate(opd, sft, cold, teacher, n_boot=500)
    assert g["opd_gain"]["mean"] == pytest.approx(40 / 256)
    assert g["sft_gain"]["mean"] == pytest.approx(2 / 768)
    assert g["headroom"] == pytest.approx(teacher.mean() - cold.mean())
    assert g["passed"] and g["checks"] == {"opd_gain": True, "sft_plateau": True,
                                           "headroom": True}
    # SFT continuation still learning: +0.02 -> no regime
    sft2 = np.repeat(cold[None], 3, 0)
    for s in range(3):
        sft2[s, np.flatnonzero(cold == 0)[:6]] = 1      # +6/256 = 0.023
    g2 = S.gate(opd, sft2, cold, teacher, n_boot=500)
    assert not g2["passed"] and g2["outcome"] == S.NO_REGIME
    assert g2["checks"]["sft_plateau"] is False
    # an OPD gain of +0.05 on average whose seeds disagree: CI not above 0 -> no regime
    opd3 = np.repeat(cold[None], 3, 0)
    opd3[0, np.flatnonzero(cold == 0)[:80]] = 1         # +0.31 on one seed
    opd3[1, np.flatnonzero(cold == 1)[:20]] = 0         # −0.08
    opd3[2, np.flatnonzero(cold == 1)[:22]] = 0         # −0.09
    g3 = S.gate(opd3, sft, cold, teacher, n_boot=500)
    assert g3["opd_gain"]["mean"] == pytest.approx((80 - 20 - 22) / 768)
    assert g3["opd_gain"]["ci_low"] < 0 and not g3["passed"]
    # no headroom
    g4 = S.gate(opd, sft, cold, cold, n_boot=500)
    assert g4["checks"]["headroom"] is False and not g4["passed"]


def test_curves_read_back_what_the_writer_wrote_and_a_restart_keeps_the_last_points(tmp_path):
    from prada_jax.metric_writer import MetricWriter
    w = MetricWriter(tmp_path / "tb", enabled=True)
    for s in range(1, 6):
        w.write_scalars(s, {"distill/loss": 1.0 / s, "distill/kl": 2.0 / s,
                            "distill/grad_norm": 3.0, "other": 0.0})
    w.write_scalars(5, {"eval/success_rate": 0.25})
    w.close()
    got = curves.read(tmp_path / "tb")
    assert set(got) == {"distill/loss", "distill/kl", "distill/grad_norm", "eval/success_rate"}
    assert got["distill/loss"] == [[s, pytest.approx(1.0 / s)] for s in range(1, 6)]
    assert got["eval/success_rate"] == [[5, 0.25]]
    assert curves.read(tmp_path / "none") == {}


def test_record_counts_follow_the_declared_mapping():
    per = [{"supervised_turns": 40, "student_tokens": 200, "teacher_tokens_forwarded": 600,
            "tool_calls": 30, "tool_rounds": 5, "episodes": 8},
           {"supervised_turns": 44, "student_tokens": 220, "teacher_tokens_forwarded": 640,
            "tool_calls": 34, "tool_rounds": 7, "episodes": 8}]
    c = S.record_counts(per, "opd", 7)
    assert c.supervised_turns == 42 and c.gen_rounds == 7 and c.decode_steps == 49
    assert c.parallel == 8 and c.tool_rounds == 6 and c.teacher_prefill_tokens == 620
    assert c.student_prefill_tokens == 620 - 210 and c.teacher_seq_len == 620 / 8
    r = S.record_counts(per, "reopd", 7)
    assert r.gen_rounds == 1 and r.decode_steps == 7 and r.parallel == 42 and r.tool_rounds == 0
    f = S.record_counts(per, "sft", 7)
    assert f.gen_rounds == 0 and f.decode_steps == 0 and f.tool_rounds == 0


@pytest.mark.parametrize("argv,flag", [
    (["--inject_rate=1.5"], "--inject_rate"),
    (["--parts=bogus"], "--parts"),
    (["--parts=gate"], "--parts"),
    (["--quick", "--cache=/tmp/x"], "--cache"),
])
def test_bad_input_is_one_named_error_and_writes_nothing(tmp_path, argv, flag):
    out = tmp_path / "out"
    with pytest.raises(BadInput, match=flag):
        main([f"--out={out}"] + argv)
    assert not out.exists()


def test_bad_input_exits_2_with_one_stderr_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "studies.reopd_regime", f"--out={tmp_path}/o",
                        "--inject_rate=-0.1"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "--inject_rate" in p.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_quick_study_runs_end_to_end_and_resumes(tmp_path):
    out = tmp_path / "q"
    assert main(["--quick", f"--out={out}"]) == 0
    res = json.loads((out / "study.json").read_text())
    assert set(S.PARTS[:6]) <= set(res)     # the default: every part up to the gate
    kl = res["depth"]["students"]["cold"]["exact_kl"]["depth"]
    assert kl and all(r["mean"] >= 0 for r in kl)      # a KL is never negative
    assert res["gate"]["outcome"] in (S.NO_REGIME, "pass: the comparison runs")
    rec = json.loads((out / "runs/pilot/opd_lr0.001_seed100.json").read_text())
    assert rec["estimator"] == "exact" and rec["synthetic"]
    assert {"distill/loss", "distill/kl", "distill/grad_norm"} <= set(rec["curves"])
    assert len(rec["curves"]["distill/loss"]) == rec["updates"]
    # a restart reuses every finished record and the cold start unchanged
    before = {p.name: p.read_text() for p in (out / "runs/pilot").glob("*.json")}
    assert main(["--quick", f"--out={out}", "--parts=cold,pilot,gate"]) == 0
    after = {p.name: p.read_text() for p in (out / "runs/pilot").glob("*.json")}
    assert before == after
    res2 = json.loads((out / "study.json").read_text())
    assert res2["gate"]["opd_gain"] == res["gate"]["opd_gain"]
    # after a failed gate nothing runs; with the gate forced open (a test of the wiring only)
    # the ReOPD pilot, the secondary arm and the comparison run and give every claim
    if not res2["gate"]["passed"]:
        with pytest.raises(BadInput, match="gate did not pass"):
            main(["--quick", f"--out={out}", "--parts=reopd_pilot"])
        res2["gate"]["passed"] = True
        (out / "study.json").write_text(json.dumps(res2))
    assert main(["--quick", f"--out={out}", "--parts=reopd_pilot,secondary,compare"]) == 0
    res3 = json.loads((out / "study.json").read_text())
    v = res3["compare"]["verdicts"]
    for key in ("a_equal_turns", "b_equal_cost", "c_time_to_80", "d_kappa", "e_vs_sft",
                "f_tool_calls"):
        assert "verdict" in v[key]
    assert v["f_tool_calls"]["verdict"] == "pass" or v["f_tool_calls"]["opd"] == 0
    rec = json.loads((out / "runs/compare/reopd_k0.8_seed1.json").read_text())
    assert rec["kappa"] == 0.8 and rec["tool_calls"] == 0 and "tau1:v11" in rec["outcomes"]
    assert set(res3["compare"]["success"]) == {"opd", "reopd_k0.6", "reopd_k0.8", "reopd_k1",
                                               "sft_cont", "opd_cost"}
    # another injection rate is another config: refused, nothing written
    with pytest.raises(BadInput, match="inject_rate"):
        main(["--quick", f"--out={out}", "--parts=pilot", "--inject_rate=0.2"])
