"""evals.distill_report.summarize / to_markdown on hand-made run records: means, paired
differences to fkl_k0.6 and the ratio-diagnostic rows against NumPy/SciPy."""
import numpy as np
import pytest
from scipy import stats

from evals.distill_report import summarize, to_markdown


def _run(seed, success, gap, slope, kappa=0.6):
    rec = {"step": 0, "mean_gap": gap + 1.0, "kappa_auto": float(np.exp(-gap - 1.0)),
           "slope": slope - 1.0, "r2": 0.5}
    end = {"step": 300, "mean_gap": gap, "kappa_auto": float(np.exp(-gap)), "slope": slope,
           "r2": 0.4}
    return {"seed": seed, "after": {"success_rate": success}, "before": {"success_rate": 0.0},
            "env_calls_during_training": 0, "update_s_median": 0.1, "kappa": kappa,
            "ratio": [rec, end]}


def test_summary_paired_differences_and_diagnostic_rows(tmp_path):
    a = [0.5, 0.7, 0.4]
    b = [0.6, 0.75, 0.55]
    runs = {}
    for s in range(3):
        runs[f"fkl_k0.6/seed{s}"] = _run(s, a[s], 0.4 + 0.1 * s, -0.8)
        runs[f"fkl_auto/seed{s}"] = _run(s, b[s], 0.3, -0.5 - 0.1 * s, kappa=0.7 + 0.01 * s)
        runs[f"warm_k0.6/seed{s}"] = _run(s, a[s] - 0.01, 0.5, -1.0)
        runs[f"reopd_k0.6/seed{s}"] = _run(s, a[s] + 0.01, 0.5, -1.0)
    for s in range(3):
        runs[f"fkl_auto/seed{s}"]["ratio_heldout"] = {"mean_gap": 0.5 + s, "kappa_auto": 0.5,
                                                      "slope": -0.4, "r2": 0.3}
    t = summarize(runs, str(tmp_path))
    assert np.isclose(t["fkl_auto"]["ratio_heldout"]["mean_gap"]["mean"], 1.5)
    assert "ratio_heldout" not in t["fkl_k0.6"]
    d = np.subtract(b, a)
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert t["fkl_auto"]["paired"]["ref"] == "fkl_k0.6"
    assert np.isclose(t["fkl_auto"]["paired"]["mean"], d.mean())
    assert np.isclose(t["fkl_auto"]["paired"]["ci_half_width"], half)
    assert "paired" not in t["fkl_k0.6"]
    # ReOPD is compared with its warm start, paired by seed
    assert t["reopd_k0.6"]["paired"]["ref"] == "warm_k0.6"
    assert np.isclose(t["reopd_k0.6"]["paired"]["mean"], 0.02)
    assert np.isclose(t["fkl_auto"]["ratio_end"]["slope"]["mean"], -0.6)
    assert np.isclose(t["fkl_auto"]["kappa_final"]["mean"], 0.71)
    assert np.isclose(t["reopd_k0.6"]["ratio_start"]["mean_gap"]["mean"], 1.5)
    assert "ratio_start" not in t["fkl_k0.6"]
    md = to_markdown(t)
    assert "| fkl_auto |" in md and "reopd_k0.6 (warm start)" in md and "synthetic" in md
    assert "held-out pool" in md and md.count("| fkl_auto |") == 3  # success, train, held-out
    assert f"{d.mean():+.3f} ± {half:.3f} vs fkl_k0.6" in md


def test_cli_bad_input_is_one_bad_input_line_and_writes_nothing(tmp_path):
    import importlib

    from prada_jax.errors import BadInput
    entry = importlib.import_module("evals.distill_report.__main__")
    out = tmp_path / "rep"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "runs.json").write_text("[" * 100000 + "]" * 100000)
    for argv, msg in (([f"--out={out}", "--methods=fkl_k0.6,nope"], "--methods: unknown"),
                      ([f"--out={out}", "--seeds=0,x"], "--seeds=0,x"),
                      ([f"--out={out}", "--seeds=0,2"], "consecutive"),
                      ([f"--out={out}", f"--merge_from={bad}"], "runs.json: not valid JSON"),
                      ([f"--out={out}", "--warm-steps=0"], "warm_steps"),
                      ([f"--out={out}", "--steps=0"], "--steps")):
        with pytest.raises(BadInput, match=msg.replace(".", r"\.")) as ei:
            entry.main(argv)
        assert "\n" not in str(ei.value)
        assert not out.exists()


def test_claim_verdicts_seed_parsing_and_curves(tmp_path):
    """Verdicts follow the documented CI rules (checked against SciPy's t interval), seeds must
    be consecutive, and the success curves average the per-seed eval points."""
    from evals.distill_report import (claims, claims_markdown, parse_seeds, plot_success,
                                      success_curves, verdict)
    assert parse_seeds("0-3") == [0, 1, 2, 3] and parse_seeds("5,6") == [5, 6]
    for bad in ("0,2", "3,2", "x", ""):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    assert verdict("beats", 0.01, 0.2, 0.02)[0] == "supported"
    assert verdict("beats", -0.05, 0.015, 0.02)[0] == "refuted"
    assert verdict("beats", -0.05, 0.1, 0.02)[0] == "unresolved at this power"
    assert verdict("noninferior", -0.01, 0.1, 0.02)[0] == "supported"
    assert verdict("noninferior", -0.2, -0.01, 0.02)[0] == "refuted"
    assert verdict("noninferior", -0.1, 0.1, 0.02)[0] == "unresolved at this power"
    ref = [0.5, 0.6, 0.55, 0.4]
    k1 = [0.4, 0.45, 0.5, 0.3]      # κ = 0.6 better on every seed
    sft = [0.52, 0.58, 0.6, 0.35]   # mixed
    runs = {}
    for s in range(4):
        for name, v in (("fkl_k0.6", ref), ("fkl_k1", k1), ("sft", sft), ("fkl_late", [0.0] * 4)):
            runs[f"{name}/seed{s}"] = {"seed": s, "after": {"success_rate": v[s]},
                                       "before": {"success_rate": 0.0}, "steps": 10,
                                       "curve": [{"step": 5, "success_rate": v[s] / 2}],
                                       "warm_from": None}
    cl = {c["id"]: c for c in claims(runs, 0.02)}
    for cid, other in (("a1", k1), ("a3", sft)):
        d = np.subtract(ref, other)
        lo, hi = stats.t.interval(0.95, 3, loc=d.mean(), scale=d.std(ddof=1) / 2)
        assert cl[cid]["ci95"] == pytest.approx([lo, hi])
        assert cl[cid]["diff_mean"] == pytest.approx(d.mean())
    assert cl["a1"]["verdict"] == "supported" and cl["a3"]["verdict"].startswith("unresolved")
    assert cl["a2"]["verdict"] == "supported"    # late-heavy at 0 on every seed
    assert "b1" not in cl                        # its methods did not run
    md = claims_markdown(list(cl.values()))
    assert "**supported**" in md and "a3:" in md
    cur = success_curves(runs)["fkl_k0.6"]
    assert cur["x"] == [0, 5, 10]
    assert cur["mean"] == pytest.approx([0.0, np.mean(ref) / 2, np.mean(ref)])
    assert plot_success(success_curves(runs), tmp_path / "c.png").stat().st_size > 1000
    # floor: both methods at 0 on every seed -> unresolved, not "refuted"
    for s in range(4):
        runs[f"fkl_k0.6/seed{s}"]["after"]["success_rate"] = 0.0
    assert claims(runs)[1]["verdict"] == "unresolved at this power"
