"""studies.distill_claims.summarize / to_markdown on hand-made run records: means, paired
differences to fkl_k0.6 and the ratio-diagnostic rows against NumPy/SciPy."""
import numpy as np
import pytest
from scipy import stats

from studies.distill_claims import summarize, to_markdown


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
    entry = importlib.import_module("studies.distill_claims.__main__")
    out = tmp_path / "rep"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "runs.json").write_text("[" * 100000 + "]" * 100000)
    for argv, msg in (([f"--out={out}", "--methods=fkl_k0.6,nope"], "--methods: unknown"),
                      ([f"--out={out}", "--seeds=0,x"], "--seeds=0,x"),
                      ([f"--out={out}", "--seeds=0,2"], "consecutive"),
                      ([f"--out={out}", f"--merge_from={bad}"], "runs.json: not valid JSON"),
                      ([f"--out={out}", "--warm-steps=0"], "warm_steps"),
                      ([f"--out={out}", "--steps=0"], "--steps"),
                      ([f"--out={out}", "--warm=warm_k3"], "warm")):
        with pytest.raises(BadInput, match=msg.replace(".", r"\.")) as ei:
            entry.main(argv)
        assert "\n" not in str(ei.value)
        assert not out.exists()


def test_claim_verdicts_seed_parsing_and_curves(tmp_path):
    """Verdicts follow the documented CI rules (checked against SciPy's t interval), seeds must
    be consecutive, and the success curves average the per-seed eval points."""
    from studies.distill_claims import (claims, claims_markdown, parse_seeds, plot_success,
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


def _rec(seed, success, **kw):
    return {"seed": seed, "after": {"success_rate": success}, "before": {"success_rate": 0.0},
            "env_calls_during_training": 0, "update_s_median": 0.1, "steps": 10,
            "warm_from": None, **kw}


def test_warm_start_choice_and_reuse_of_the_from_scratch_twin(tmp_path):
    """--warm resolves the continuations' warm start; a warm start with the same budget as its
    from-scratch twin reuses that run (a symlink and copied records) instead of training:
    ``run`` would fail without a cache if it tried to train."""
    from studies.distill_claims import PLAN, adaptive, plan_of, reference_of, run
    assert plan_of("cont_k0.6")[1] == "warm_k0.6"
    assert plan_of("cont_k0.6", "warm_k1")[1] == "warm_k1"
    assert plan_of("reopd_k0.6", "warm_k1") == ("onpolicy", "warm_k1", "onpolicy")
    assert plan_of("reopd_k1", "warm_k0.6")[1] == "warm_k1"       # fixed in the plan
    assert plan_of("fkl_k1", "warm_k1") == PLAN["fkl_k1"]
    with pytest.raises(ValueError, match="--warm"):
        plan_of("cont_k0.6", "warm_k3")
    assert [adaptive(v) for v in ("auto", "onpolicy,auto", "exact", "", "uniform",
                                  "sft,uniform", "onpolicy")] == [True] * 3 + [False] * 4
    out = tmp_path / "rep"
    (out / "fkl_k1" / "seed_0").mkdir(parents=True)
    runs = {f"fkl_k1/seed{s}": _rec(s, 0.3 + 0.1 * s, budget="steps") for s in (0, 1)}
    (out / "runs.json").write_text(__import__("json").dumps(runs))
    budgets = {"steps": 10, "warm": 10, "cont": 5, "onpolicy": 5, "wall": 0}
    got = run(out, str(tmp_path / "no_cache"), [0, 1], budgets, 4, ["fkl_k1", "warm_k1"])
    assert (out / "warm_k1").is_symlink() and (out / "warm_k1" / "seed_0").is_dir()
    for s in (0, 1):
        w = got[f"warm_k1/seed{s}"]
        assert w["after"] == runs[f"fkl_k1/seed{s}"]["after"]
        assert w["reused_from"] == "fkl_k1" and w["budget"] == "warm"
    # a different warm budget is a different run: it is trained (and fails here: no cache)
    with pytest.raises(Exception):
        run(tmp_path / "rep2", str(tmp_path / "no_cache"), [0, 1],
            dict(budgets, warm=7), 4, ["warm_k0.6"])
    # on-policy runs are paired with the warm start their records name
    runs2 = {"reopd_k0.6/seed0": _rec(0, 0.5, warm_from="warm_k1")}
    assert reference_of("reopd_k0.6", runs2) == "warm_k1"
    assert reference_of("reopd_k0.6") == "warm_k0.6"
    assert reference_of("cont_k0.6_wall", runs2) == "cont_k0.6"


def _wilson(k, n, z=1.96):
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h


def test_task_label_teacher_rows_and_plain_sft_claims(tmp_path):
    """The report names its task from the pool metadata, reads both teacher_eval.json layouts
    (Wilson intervals against the closed form) and computes a4/a5 (plain SFT) like a1."""
    import json

    from studies.distill_claims import claims, summarize, task_label
    cache = tmp_path / "cache"
    (cache / "pool").mkdir(parents=True)
    assert task_label(str(cache)) == "synthetic task"
    (cache / "pool" / "pool.json").write_text(json.dumps({"task": "kg_lookup_v1"}))
    assert "knowledge-graph" in task_label(str(cache))
    (cache / "teacher_eval.json").write_text(json.dumps({
        "temperature": 1.0, "sampled": {"success_rate": 104 / 256, "n": 256},
        "greedy": {"success_rate": 191 / 256, "n": 256}}))
    k06, k1, sft1 = [0.0, 0.01, 0.0], [0.3, 0.45, 0.35], [0.28, 0.4, 0.36]
    runs = {}
    for s in range(3):
        for name, v in (("fkl_k0.6", k06), ("fkl_k1", k1), ("sft_k1", sft1)):
            runs[f"{name}/seed{s}"] = _rec(s, v[s])
    t = summarize(runs, str(cache))
    for key, k in (("teacher", 104), ("teacher_greedy", 191)):
        assert t[key]["n"] == 256
        assert t[key]["wilson95"] == pytest.approx(_wilson(k, 256), abs=1e-9)
    assert t["teacher"]["label"] == "sampled τ = 1" and t["teacher_greedy"]["label"] == "greedy"
    md = to_markdown(t)
    assert "sampled τ = 1, n=256" in md and "greedy, n=256" in md
    assert "knowledge-graph task" in md
    assert t["sft_k1"]["paired"]["ref"] == "fkl_k0.6"
    cl = {c["id"]: c for c in claims(runs)}
    for cid, a, b in (("a4", k06, sft1), ("a5", k1, sft1)):
        d = np.subtract(a, b)
        lo, hi = stats.t.interval(0.95, 2, loc=d.mean(), scale=d.std(ddof=1) / np.sqrt(3))
        assert cl[cid]["ci95"] == pytest.approx([lo, hi])
    assert cl["a4"]["verdict"] == "refuted"      # κ = 0.6 far below plain SFT on every seed
    assert cl["a5"]["verdict"].startswith("unresolved")
    # the arithmetic layout (one decoding rule) still reads as one teacher row
    (cache / "teacher_eval.json").write_text(json.dumps({"success_rate": 1.0, "n": 256}))
    t = summarize(runs, str(cache))
    assert t["teacher"]["success_rate"] == 1.0 and "teacher_greedy" not in t


@pytest.mark.slow
def test_report_run_end_to_end_on_a_tiny_cache(tmp_path):
    """``run`` on a tiny cache: the warm start is the from-scratch twin (linked), the
    continuation starts from it with its "before" taken from the warm start's final evaluation
    (not re-evaluated), fixed samplers take the ratio diagnostic at start and end only."""
    import json

    from studies.distill_claims import claims, run, summarize
    from prada_jax.distill.task.teacher import tiny_cache
    cache = tiny_cache(tmp_path / "cache")
    out = tmp_path / "rep"
    budgets = {"steps": 3, "warm": 3, "cont": 2, "onpolicy": 2, "wall": 0}
    runs = run(out, str(cache), [0, 1], budgets, 2, ["fkl_k1", "warm_k1", "cont_k0.6"],
               batch_size=4, warm="warm_k1")
    assert (out / "warm_k1").is_symlink()
    cfg = json.loads((out / "cont_k0.6" / "config.json").read_text())
    assert cfg["eval"]["before"] is False and cfg["student"]["init"] == str(out / "warm_k1")
    assert json.loads((out / "fkl_k1" / "config.json").read_text())["sampler"][
        "refresh_every"] == 0
    for s in (0, 1):
        c, w = runs[f"cont_k0.6/seed{s}"], runs[f"fkl_k1/seed{s}"]
        assert c["warm_from"] == "warm_k1" and c["steps"] == 2
        assert c["before"]["success_rate"] == w["after"]["success_rate"]
        assert c["before"]["from_warm_start"] == "warm_k1"
        assert [r["step"] for r in w["ratio"]] == [0, 3]
        assert runs[f"warm_k1/seed{s}"]["after"] == w["after"]
    t = summarize(runs, str(cache))
    assert t["task"] == "synthetic arithmetic task" and t["cont_k0.6"]["success"]["n"] == 2
    assert {c["id"] for c in claims(runs)} == set()     # no claim has both of its methods
