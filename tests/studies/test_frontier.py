"""studies.frontier (issue 52): the registered selection rule against a hand computation, each
registered reading on a case built for it, the gate, and the quick size end to end: every part
written, ``--report_only`` regenerating the report byte for byte from the parts alone, and a
rerun reusing every part."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from evals import capacity as cap
from studies.frontier import analysis as fa
from studies.frontier import measure as fm


def _rec(acc, server_s, n=100, seeds=4, rho=0.5, p90=2.0, share=0.2):
    return {"record": {"accuracy": [acc] * seeds, "arrivals": [n] * seeds,
                       "server_s_per_user": [server_s] * seeds, "rho": [rho] * seeds,
                       "latency_p90_s": [p90] * seeds, "offload_rate": [share] * seeds,
                       "blocked_rate": [0.0] * seeds}}


def test_selection_is_the_cheapest_setting_reaching_r_by_hand():
    """Anchor 0.90: retentions are acc / 0.90. At r = 0.95 (acc ≥ 0.855) the settings that
    qualify are p=0.4 (0.0200 s) and p=0.8 (0.0300 s) → p=0.4; at r = 0.90 also p=0.2
    (0.81 ≥ 0.81, 0.0100 s) → p=0.2; at r = 0.98 (acc ≥ 0.882) only p=0.8; at r = 1.0 none.
    PRADA groups by sample, θ and m rows together."""
    rows = {"Random p=0.2": _rec(0.81, 0.0100), "Random p=0.4": _rec(0.86, 0.0200),
            "Random p=0.8": _rec(0.89, 0.0300),
            "PRADA θ=+0.1 #0": _rec(0.87, 0.015), "PRADA m=+1 #0": _rec(0.87, 0.012),
            "PRADA θ=+0.1 #1": _rec(0.80, 0.001)}
    sel = fa.select({"rows": rows}, 0.90, (0.90, 0.95, 0.98, 1.0))
    assert [sel["Random"][r]["row"] for r in ("0.9", "0.95", "0.98", "1")] == \
        ["Random p=0.2", "Random p=0.4", "Random p=0.8", None]
    assert sel["Random"]["1"]["reading"] == fa.NOT_REACHED
    assert sel["PRADA #0"]["0.95"]["row"] == "PRADA m=+1 #0"       # the cheaper of θ and m
    assert sel["PRADA #1"]["0.9"]["row"] is None                    # 0.80 / 0.90 < 0.90
    assert sel["Random"]["0.95"]["retention"] == pytest.approx(0.86 / 0.90)


def test_selection_pools_arrivals_over_seeds():
    """Pooled, not a mean of seed accuracies: seeds (0.80, 100 arrivals), (1.0, 300) pool to
    0.95 (the seed mean would be 0.90)."""
    rows = {"Random p=0.5": {"record": {"accuracy": [0.8, 1.0], "arrivals": [100, 300],
                                        "server_s_per_user": [0.01, 0.01]}}}
    assert fa.choose(rows, list(rows), 1.0, 0.95)["row"] == "Random p=0.5"
    assert fa.choose(rows, list(rows), 1.0, 0.951)["row"] is None


def test_server_seconds_per_user_is_rho_times_window_over_arrivals():
    assert fm.server_seconds({"rho": [0.5, 0.25], "arrivals": [100, 0]}, 40.0)[0] == \
        pytest.approx(0.2)
    assert np.isnan(fm.server_seconds({"rho": [0.5, 0.25], "arrivals": [100, 0]}, 40.0)[1])


def _caps(num_per_seed, ref_per_seed, extra=None):
    c = {fa.LLM_ALONE: {"row": fa.LLM_ALONE, "per_seed": ref_per_seed},
         "PRADA #0": {"row": "x", "per_seed": num_per_seed[0]},
         "PRADA #1": {"row": "y", "per_seed": num_per_seed[1]}}
    c.update(extra or {})
    return c


def test_ratio_readings_each_case():
    ref = [20.0] * 8
    up = fa.ratio(_caps([[30.0] * 8, [31.0] * 8], ref), ["PRADA #0", "PRADA #1"],
                  fa.LLM_ALONE, 8)
    assert up["reading"] == "above 1" and up["lo"] > 1
    down = fa.ratio(_caps([[10.0] * 8, [11.0] * 8], ref), ["PRADA #0", "PRADA #1"],
                    fa.LLM_ALONE, 8)
    assert down["reading"] == "below 1" and down["hi"] < 1
    mixed = fa.ratio(_caps([[10.0, 30.0] * 4, [30.0, 10.0] * 4], ref),
                     ["PRADA #0", "PRADA #1"], fa.LLM_ALONE, 8)
    assert mixed["reading"] == "unresolved"
    none = _caps([[0.0] * 8, [0.0] * 8], ref)
    none["PRADA #0"] = {"row": None, "reading": fa.NOT_REACHED}
    none["PRADA #1"] = {"row": None, "reading": fa.NOT_REACHED}
    assert fa.ratio(none, ["PRADA #0", "PRADA #1"], fa.LLM_ALONE, 8)["reading"] == \
        fa.NOT_REACHED
    rsd_none = _caps([[30.0] * 8, [31.0] * 8], ref, {fa.RSD: {"row": None}})
    assert fa.ratio(rsd_none, ["PRADA #0", "PRADA #1"], fa.RSD, 8)["reading"] == \
        f"{fa.RSD} {fa.NOT_REACHED}"
    # a sample that does not reach r enters the pool as 0 per seed: halves the mean here
    half = _caps([[40.0] * 8, [0.0] * 8], ref)
    half["PRADA #1"] = {"row": None}
    assert fa.ratio(half, ["PRADA #0", "PRADA #1"], fa.LLM_ALONE, 8)["mean"] == \
        pytest.approx(1.0)


def _screen_case(diff):
    rng = np.random.default_rng(0)
    rows, matched, sel = {}, {}, {}
    for k in (0, 1):
        row = f"PRADA θ=+0.1 #{k}"
        base = 0.8 + 0.01 * rng.standard_normal(8)
        rows[row] = {"record": {"accuracy": list(base + diff), "offload_rate": [0.2] * 8}}
        matched[row] = {"p": 0.2, "record": {"accuracy": list(base),
                                             "offload_rate": [0.2] * 8}}
        sel[f"PRADA #{k}"] = {"0.95": {"row": row}}
    return {"rows": rows}, matched, sel


@pytest.mark.parametrize("diff,reading", [(0.05, "better"), (-0.05, "worse"),
                                          (0.0, "no better")])
def test_screening_reading_each_case(diff, reading):
    b, m, s = _screen_case(diff)
    if diff == 0.0:   # noise around 0
        for k, row in enumerate(m):
            m[row]["record"]["accuracy"] = list(np.asarray(b["rows"][row]["record"]
                                                           ["accuracy"]) +
                                                0.02 * np.array([1, -1] * 4))
    assert fa.screening(b, m, s)["reading"] == reading


def test_latency_readings_each_case():
    llm = {"latency_p90_s": [3.0] * 8, "rho": [0.5] * 8, "blocked_rate": [0.0] * 8}
    fast = {"latency_p90_s": [2.0, 2.1] * 4, "rho": [0.5] * 8, "blocked_rate": [0.0] * 8}
    slow = {"latency_p90_s": [4.0, 4.1] * 4, "rho": [0.5] * 8, "blocked_rate": [0.0] * 8}
    bad = dict(slow, rho=[1.2] * 8)
    probes = {fa.LLM_ALONE: {"4": llm, "8": llm, "16": llm},
              "A #0": {"4": fast, "8": slow, "16": bad}}
    sel = {"PRADA #0": {"0.95": {"row": "A #0"}}}
    out = fa.latency(probes, sel, (4, 8, 16, 32))
    assert [out[k]["reading"] for k in ("4", "8", "16", "32")] == \
        ["lower", "higher", "not both stable", "not measured"]


def test_gate_g1_and_g2():
    caps = {"0.95": {fa.LLM_ALONE: {"per_seed": [30.0] * 8, "binds": ["unstable"] * 8}}}
    sel = {"Oracle": {"0.95": {"row": "Oracle k=1"}}, fa.LLM_ALONE: {"0.95": {"row": "x"}}}
    rng = np.random.default_rng(1)
    b = {"rows": {fa.LLM_ALONE: {"record": {"server_s_per_user":
                                            list(0.03 + 0.001 * rng.standard_normal(8))}},
                  "Oracle k=1": {"record": {"server_s_per_user":
                                            list(0.01 + 0.001 * rng.standard_normal(8))}}}}
    g = fa.gate(b, sel, caps, 64.0, 0.05)
    assert g["G1"]["passed"] and g["G2"]["passed"] and g["passed"]
    assert g["G2"]["best"] == "Oracle k=1"
    censored = {"0.95": {fa.LLM_ALONE: {"per_seed": [64.0] * 8, "binds": [None] * 8}}}
    assert not fa.gate(b, sel, censored, 64.0, 0.05)["G1"]["passed"]
    small = {"rows": {fa.LLM_ALONE: b["rows"][fa.LLM_ALONE],
                      "Oracle k=1": {"record": {"server_s_per_user": list(
                          np.asarray(b["rows"][fa.LLM_ALONE]["record"]["server_s_per_user"])
                          * 0.95)}}}}
    assert not fa.gate(small, sel, caps, 64.0, 0.05)["G2"]["passed"]   # 5 % < 2 × 5 %


def test_row_capacity_follows_evals_capacity_on_the_probes():
    slo = cap.SLO(4.0, 0.5, 0.95, 0.9)
    ok = {"accuracy": [0.9] * 2, "arrivals": [100] * 2, "rho": [0.5] * 2,
          "blocked_rate": [0.0] * 2, "latency_p90_s": [2.0] * 2}
    late = dict(ok, latency_p90_s=[2.0, 5.0])
    probes = {"r": {"4": ok, "64": dict(ok, rho=[1.5] * 2), "16": late}}
    bis = {"probed": ["4", "64", "16"], "capacity": 4.0, "censored": False,
           "bracket": [4.0, 16.0]}
    c = fa.row_capacity(probes, bis, "r", slo)
    assert c["per_seed"] == [16.0, 4.0] and c["capacity"] == 4.0
    assert c["binds"] == ["unstable", "latency"]


# ------------------------------------------------------------------ the quick size, end to end
# (slow: the fixture trains two quick policy samples first, ≈ 4 min of CPU; the measurement
# itself takes seconds)

@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    import studies.frontier as fr
    out = tmp_path_factory.mktemp("frontier")
    res = fr.run_study(out, ["a100_orin_int4"], "quick", log=lambda m: None)
    return out, res


@pytest.mark.slow
def test_quick_study_writes_every_part_and_reads(quick):
    out, res = quick
    for f in ("report.md", "study.json", "frontier_a100_orin_int4.png"):
        assert (out / f).is_file(), f
    for p in ("thetas", "pools", "phase_a", "phase_b", "matched", "phase_c", "ablation"):
        assert (out / "a100_orin_int4" / f"{p}.json").is_file(), p
    a = res["results"]["a100_orin_int4"]
    assert "SYNTHETIC" in res["report"]
    assert "no verdict at this size" in res["report"]          # only the study size reads
    from studies.frontier import SIZES
    assert set(a["readings"]) == {fa.rkey(r) for r in SIZES["quick"].retentions}
    for rd in a["readings"].values():
        assert set(rd) == {"PRADA / LLM alone", "PRADA / RSD", "PRADA / oracle"}
    assert [p["sample"] for p in a["policies"]] == [0, 1]
    assert all(len(p["params_sha256"]) == 64 for p in a["policies"])


@pytest.mark.slow
def test_report_only_regenerates_byte_for_byte_from_the_parts(quick, tmp_path):
    import studies.frontier as fr
    out, _ = quick
    copy = tmp_path / "results"
    shutil.copytree(out / "a100_orin_int4", copy / "a100_orin_int4")
    fr.write_report(copy, ["a100_orin_int4"], "quick")
    for f in ("report.md", "study.json", "frontier_a100_orin_int4.png"):
        assert (copy / f).read_bytes() == (out / f).read_bytes(), f


@pytest.mark.slow
def test_a_rerun_reuses_every_part(quick):
    import studies.frontier as fr
    out, _ = quick
    before = {p: p.stat().st_mtime_ns for p in (out / "a100_orin_int4").glob("*.json")}
    fr.run_study(out, ["a100_orin_int4"], "quick", log=lambda m: None)
    after = {p: p.stat().st_mtime_ns for p in (out / "a100_orin_int4").glob("*.json")}
    assert before == after


@pytest.mark.slow
def test_a_killed_phase_c_resumes_to_the_same_records(quick, tmp_path):
    """What a kill -9 leaves (phase C's file with the first half of its probes, complete
    False; no ablation yet) resumes to the uninterrupted run's files byte for byte,
    re-measuring only the missing probes."""
    import json
    import studies.frontier as fr
    out, _ = quick
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    p = copy / "a100_orin_int4" / "phase_c.json"
    d = json.loads(p.read_text())
    probes = d["data"]["probes"]
    flat = [(r, k) for r in probes for k in probes[r]]
    kept: dict = {}
    for r, k in flat[: len(flat) // 2]:
        kept.setdefault(r, {})[k] = probes[r][k]
    p.write_text(json.dumps({"key": d["key"], "complete": False, "data": {"probes": kept}}))
    (copy / "a100_orin_int4" / "ablation.json").unlink()
    said = []
    fr.run_study(copy, ["a100_orin_int4"], "quick", policies_root=out / "policies",
                 log=said.append)
    assert sum("probe" in m for m in said) >= len(flat) - len(flat) // 2
    for f in ("a100_orin_int4/phase_c.json", "a100_orin_int4/ablation.json", "report.md",
              "study.json"):
        assert (copy / f).read_bytes() == (out / f).read_bytes(), f


def test_report_only_regenerates_the_committed_results(tmp_path):
    """The committed report.md, study.json and plots are what ``--report_only`` writes from
    the committed per-pair JSON alone (no policy, no evaluation)."""
    import studies.frontier as fr
    from pathlib import Path
    results = Path(fr.__file__).parent / "results"
    pairs = [p for p in fr.PAIRS if (results / p / "phase_a.json").is_file()]
    assert pairs, "no committed pair"
    out = tmp_path / "results"
    for pair in pairs:
        shutil.copytree(results / pair, out / pair)
    fr.write_report(out, pairs, "study")
    for f in ["report.md", "study.json"] + [f"frontier_{p}.png" for p in pairs]:
        assert (out / f).read_bytes() == (results / f).read_bytes(), f


def test_strict_capacity_judges_the_ratio_estimator():
    """A row whose seeds' arrivals spread widely: the registered interval (cells acc·n/mean n)
    is wide enough to pass a target the ratio estimator shows it misses (and so does
    ``evals.capacity``'s default since the fix)."""
    acc = [0.83] * 8
    n = [120, 200, 130, 190, 140, 180, 150, 170]
    rec = {"accuracy": acc, "arrivals": n, "rho": [0.1] * 8, "blocked_rate": [0.0] * 8,
           "latency_p90_s": [2.0] * 8}
    slo = cap.SLO(4.0, 0.845, 0.9, 0.939)
    assert not cap.accuracy_missed(rec, slo, cap.SHARES)       # registered: passes
    assert cap.accuracy_missed(rec, slo)                       # evals.capacity's default: misses
    assert fa.ratio_upper(rec) == pytest.approx(0.83)          # every seed 0.83
    bis = {"probed": ["4"], "capacity": 4.0, "censored": False, "bracket": [4.0, 4.0]}
    assert fa.strict_capacity({"r": {"4": rec}}, bis, "r", slo) == 0.0
