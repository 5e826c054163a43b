"""studies.stage2_price_target: the summary against a direct computation (scipy's t interval,
the argmax and nearest grid point by hand), the committed summary.json recomputed from the
committed records, and the flatness grid at a tiny size against per-price evaluations."""
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from studies import stage2_price_target as pt
from studies import stage2_verdict as s2

RESULTS = Path(__file__).resolve().parents[2] / "studies" / "stage2_price_target" / "results"


def _records(rng, lams=(0.0, 0.1, 0.2, 0.3), n=6, samples=3):
    """Synthetic records: sample k's objective peaks at a price of its own; clearing prices
    near 0.1 + 0.02·k."""
    recs = {}
    for k in range(samples):
        peak = lams[1 + k % (len(lams) - 1)]
        sets = {}
        for split in ("validation", "test"):
            base = rng.normal(0.6, 0.05, n)
            sets[split] = {"rows": {str(x): {"per_seed": list(
                base - (x - peak) ** 2 + rng.normal(0, 0.01, n))} for x in lams}}
        le = {"learned": {"0": {"lambda_s": 0.1 + 0.02 * k}, "1": {"lambda_s": 0.11 + 0.02 * k}}}
        recs[k] = ({"sets": sets}, le)
    return recs


def test_summary_matches_a_direct_computation():
    recs = _records(np.random.default_rng(0))
    res = pt.summarize(recs, resamples=500, log=lambda m: None)
    diffs = []
    for row, (k, (fl, le)) in zip(res["rows"], sorted(recs.items())):
        lams = [float(x) for x in fl["sets"]["validation"]["rows"]]
        clear = np.mean([v["lambda_s"] for v in le["learned"].values()])
        lam_c = lams[int(np.argmin([abs(x - clear) for x in lams]))]
        val = [np.mean(fl["sets"]["validation"]["rows"][str(x)]["per_seed"]) for x in lams]
        lam_v = lams[int(np.argmax(val))]
        d = (np.asarray(fl["sets"]["test"]["rows"][str(lam_v)]["per_seed"])
             - np.asarray(fl["sets"]["test"]["rows"][str(lam_c)]["per_seed"]))
        lo, hi = (sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
                  if d.std() > 0 else (0.0, 0.0))
        assert row["policy_sample"] == k and row["lambda_c"] == lam_c
        assert row["validation_argmax"] == lam_v
        ci = row["test_vchosen_minus_clearing"]
        assert ci["mean"] == pytest.approx(d.mean()) and ci["n"] == len(d)
        assert ci["lo"] == pytest.approx(lo, abs=1e-12) and ci["hi"] == pytest.approx(hi, abs=1e-12)
        diffs.append(d)
    pooled = res["pooled_test_vchosen_minus_clearing"]
    means = np.mean(diffs, axis=1)
    lo, hi = sps.t.interval(0.95, len(means) - 1, loc=means.mean(), scale=sps.sem(means))
    assert pooled["mean"] == pytest.approx(np.mean(diffs))
    assert pooled["cluster_t"]["lo"] == pytest.approx(lo) and pooled["cluster_t"]["hi"] == pytest.approx(hi)
    assert pooled["lo"] == pytest.approx(min(lo, pooled["bootstrap"]["lo"]))
    assert pooled["hi"] == pytest.approx(max(hi, pooled["bootstrap"]["hi"]))


def test_one_sample_has_no_pooled_interval():
    recs = _records(np.random.default_rng(1), samples=1)
    assert pt.summarize(recs, resamples=200, log=lambda m: None)[
        "pooled_test_vchosen_minus_clearing"] is None


def test_the_committed_summary_recomputes_from_the_committed_records(tmp_path):
    recs = pt.read_records(RESULTS)
    assert sorted(recs) == [0, 1, 2]
    pt.write_json(tmp_path / "summary.json", pt.summarize(recs, log=lambda m: None))
    assert (tmp_path / "summary.json").read_text() == (RESULTS / "summary.json").read_text()


def test_report_only_command(tmp_path, run_command):
    for f in RESULTS.glob("*_seed0.json"):
        (tmp_path / f.name).write_text(f.read_text())
    code, _, err = run_command("studies.stage2_price_target", "--report_only",
                               f"--out={tmp_path}")
    assert code == 0, err
    res = json.loads((tmp_path / "summary.json").read_text())
    ref = json.loads((RESULTS / "summary.json").read_text())
    assert res["rows"] == ref["rows"][:1] and res["pooled_test_vchosen_minus_clearing"] is None


def test_flatness_at_a_tiny_size(tmp_path, monkeypatch):
    """The grid's per-seed objectives equal one evaluation per price (the unbatched path),
    and each price's paired difference to the reference is scipy's t interval."""
    from evals import suite
    from evals.testing import oracle_apply
    from prada_jax.configs import ppo as ppo_cfg
    from prada_jax.rl.policy import LoadedPolicy
    from prada_jax.sched.registry import SCHEDULER_NAMES

    cfg = ppo_cfg.get_config("smoke")
    cfg.env.hardware = "paper"
    fake = LoadedPolicy(oracle_apply, None, {"seeds": []}, cfg, str(tmp_path))
    monkeypatch.setattr(suite, "load_policy", lambda *a, **k: fake)
    monkeypatch.setitem(s2.SIZES, "quick", dict(s2.SIZES["quick"], slots=40, warmup=5,
                                                scenario_length=40, num_users=4))
    seen = {}
    run_grid = s2.Runner.run_grid

    def spy(self, sched, lams, mus, **kw):
        seen["runner"], seen["sched"] = self, sched
        return run_grid(self, sched, lams, mus, **kw)

    monkeypatch.setattr(s2.Runner, "run_grid", spy)
    lams = (0.0, 0.1, 1.0)
    res = pt.flatness(tmp_path, seeds=3, test_seed0=0, size="quick", lams=lams, ref=0.1,
                      log=lambda m: None)
    assert seen["sched"] == SCHEDULER_NAMES.index("threshold")
    rows = res["sets"]["test"]["rows"]          # the last runner the spy saw: test
    ref = np.asarray(rows["0.1"]["per_seed"])
    assert rows["0.1"]["minus_ref"] == 0.0
    for lam in lams:
        one = np.asarray(seen["runner"].run_prada(seen["sched"], lam, 0.0)["objective"])
        np.testing.assert_allclose(rows[str(lam)]["per_seed"], one, rtol=1e-5, atol=1e-6)
        d = np.asarray(rows[str(lam)]["per_seed"]) - ref
        if lam != 0.1 and d.std() > 0:
            lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
            assert rows[str(lam)]["lo"] == pytest.approx(lo)
            assert rows[str(lam)]["hi"] == pytest.approx(hi)
    with pytest.raises(Exception, match="reference price"):
        pt.flatness(tmp_path, seeds=2, size="quick", lams=(0.0, 0.2), ref=0.1)
