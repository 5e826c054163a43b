"""``python -m studies.reopd_kg`` (issue 35): its verdict arithmetic against a direct
computation, and (slow) the ``--quick`` study end to end on a tiny kg cache."""
import json

import numpy as np
import pytest

from prada_jax.distill import paired as pr


def test_two_way_bootstrap_count_form_equals_indexing():
    """Each replicate's count-vector mean equals the mean of the explicitly indexed draw."""
    rng = np.random.default_rng(3)
    d = rng.integers(-1, 2, size=(5, 12)).astype(float)
    S, P = d.shape
    for _ in range(20):
        si, pi = rng.integers(0, S, S), rng.integers(0, P, P)
        ws, wp = np.bincount(si, minlength=S), np.bincount(pi, minlength=P)
        assert ws @ d @ wp / (S * P) == pytest.approx(pr.explicit_replicate(d, si, pi))


def test_two_way_bootstrap_covers_problem_sampling():
    """Seeds that agree but problems that vary: the seeds-only CI collapses, the two-way one
    does not; its SE matches the problems' standard error; the MDE is 2.80 SE."""
    rng = np.random.default_rng(0)
    per_problem = rng.choice([-1.0, 0.0, 1.0], size=400, p=[0.2, 0.5, 0.3])
    d = np.repeat(per_problem[None, :], 10, 0)
    out = pr.two_way_bootstrap(d, [200, 200], n_boot=3000, seed=1)
    assert out["mean"] == pytest.approx(per_problem.mean())
    assert out["seed_only_ci_high"] - out["seed_only_ci_low"] == pytest.approx(0.0, abs=1e-12)
    # stratified mean of two sets of 200: SE² = (var₁/200 + var₂/200) / 4
    se = np.sqrt((per_problem[:200].var() / 200 + per_problem[200:].var() / 200) / 4)
    assert out["se"] == pytest.approx(se, rel=0.15)
    assert out["ci_low"] < out["mean"] < out["ci_high"]
    assert out["mde"] == pytest.approx(2.8015852 * out["se"], rel=1e-6)
    assert pr.superior(out) == "pass" and pr.noninferior(out, 0.02) == "pass"
    with pytest.raises(ValueError):
        pr.two_way_bootstrap(d, [100, 100])


def test_verdicts_against_direct_counts():
    from studies import reopd_kg as S
    sz = S.Sizes(seeds=(0, 1, 2), n_eval=4, eval_sets=(1, 5), n_boot=500)
    # per seed, per set: 4 problems; reopd solves everything, opd half, sft nothing
    mk = lambda bits: {str(s): {"1": bits, "5": bits} for s in range(3)}   # noqa: E731
    runs = {"opd": {"outcomes": mk("1100"), "tool_calls": 30},
            "reopd_k0.6": {"outcomes": mk("1111"), "tool_calls": 0},
            "reopd_k1": {"outcomes": mk("1110"), "tool_calls": 0},
            "sft_cont": {"outcomes": mk("0000"), "tool_calls": 0}}
    cold = {"outcomes": {"1": "1000", "5": "1000"}}
    v = S.verdicts(runs, cold, sz)
    p = v["pooled"]
    assert p["a_equal_turns"]["mean"] == pytest.approx(0.5)
    assert p["c_vs_sft"]["mean"] == pytest.approx(1.0) and p["c_vs_sft"]["verdict"] == "pass"
    assert p["d_kappa"]["mean"] == pytest.approx(0.25)
    assert p["moved"]["sft_cont"]["mean"] == pytest.approx(-0.25)
    assert p["moved"]["reopd_k0.6"]["success"] == 1.0 and p["cold_success"] == 0.25
    assert v["e_tool_calls"]["verdict"] == "pass" and v["budget_moved"] is True
    runs["reopd_k1"]["tool_calls"] = 1
    assert S.verdicts(runs, cold, sz)["e_tool_calls"]["verdict"] == "fail"


@pytest.mark.slow
def test_quick_study_end_to_end(tmp_path):
    """Every part at tiny sizes (a tiny kg cache built under --out): study.json holds each part,
    per-seed per-problem outcomes of every method, verdicts, curves and the clock."""
    from studies.reopd_kg.__main__ import main
    out = tmp_path / "q"
    assert main(["--quick", f"--out={out}"]) == 0
    res = json.loads((out / "study.json").read_text())
    assert res["synthetic"] is True
    for part in ("paths", "cold", "pilot", "compare", "reliability", "clock"):
        assert part in res
    runs = res["compare"]["runs"]
    assert set(runs) == {"opd", "reopd_k0.6", "reopd_k1", "sft_cont"}
    for r in runs.values():
        assert set(r["outcomes"]) == {"0", "1"}
        assert all(len(v) == 4 for o in r["outcomes"].values() for v in o.values())
    assert all(runs[k]["tool_calls"] == 0 for k in ("reopd_k0.6", "reopd_k1", "sft_cont"))
    assert res["clock"]["timed_updates"]["opd"] >= 1
    assert (out / "report.md").read_text().startswith("# ReOPD on the knowledge-graph task")


def test_one_seed_gives_no_verdict():
    from studies import reopd_kg as S
    sz = S.Sizes(seeds=(0,), n_eval=4, eval_sets=(1, 5), n_boot=100)
    mk = lambda bits: {"0": {"1": bits, "5": bits}}   # noqa: E731
    runs = {"opd": {"outcomes": mk("0000"), "tool_calls": 3},
            "reopd_k0.6": {"outcomes": mk("1111"), "tool_calls": 0},
            "reopd_k1": {"outcomes": mk("1110"), "tool_calls": 0},
            "sft_cont": {"outcomes": mk("0000"), "tool_calls": 0}}
    v = S.verdicts(runs, {"outcomes": {"1": "0000", "5": "0000"}}, sz)
    assert v["pooled"]["c_vs_sft"]["verdict"] == "no verdict (1 seed)"
    assert v["pooled"]["c_vs_sft"]["mean"] == 1.0
