"""Seeds as a batch axis (``config.train.num_seeds``): N students in one vmapped step equal N
separate runs with seeds ``config.seed + i`` (offline, on-policy, adaptive ``auto``), a
multi-seed run resumes exactly, and results.json's CI matches SciPy's Student t."""
import json
import shutil

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")

from prada_jax import config_utils as cu  # noqa: E402
from tests.helpers.distill import cache  # noqa: E402,F401 (the module-scoped fixture)
from tests.helpers.distill import smoke_config, tb_scalars as _scalars  # noqa: E402


def _config(cache, *variants, **overrides):
    return smoke_config(cache, *variants, **{"sampler.refresh_every": 2, **overrides})


def _weights(d):
    from safetensors.numpy import load_file
    return load_file(str(d / "model.safetensors"))


def _assert_equals_separate(cache, tmp_path, variants, n, seed0, **ov):
    from prada_jax.distill.trainer import train_and_evaluate
    vm = tmp_path / "vmapped"
    res = train_and_evaluate(_config(cache, *variants, seed=seed0,
                                     **{"train.num_seeds": n}, **ov), vm)
    assert res["num_seeds"] == n and res["seeds"] == [seed0 + i for i in range(n)]
    assert len(res["per_seed"]) == n and res["env_calls_during_training"] == 0
    for i, r in enumerate(res["per_seed"]):
        s = seed0 + i
        sep = train_and_evaluate(_config(cache, *variants, seed=s, **ov), tmp_path / f"s{s}")
        assert r["seed"] == s == sep["seed"]
        # task success (before and after) and the sampled turns: equal
        assert r["before"] == sep["before"] and r["after"] == sep["after"]
        assert r["turn_histogram"] == sep["turn_histogram"]
        assert r.get("curve") == sep.get("curve")
        wa = _weights(vm / f"seed_{s}" / "student_hf")
        wb = _weights(tmp_path / f"s{s}" / "student_hf")
        assert wa.keys() == wb.keys()
        for k in wa:   # vmapped kernels reassociate sums: equal up to rounding
            np.testing.assert_allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5, err_msg=k)
        assert [x["step"] for x in r["ratio"]] == [x["step"] for x in sep["ratio"]]
        for x, y in zip(r["ratio"], sep["ratio"]):
            assert x["mean_gap"] == pytest.approx(y["mean_gap"], rel=1e-4, abs=1e-5)
            if "kappa_used" in y:
                assert x.get("kappa_held") == y.get("kappa_held")
                assert x["kappa_used"] == pytest.approx(y["kappa_used"], rel=1e-3)
        a, b = _scalars(vm / "tb" / f"seed_{s}"), _scalars(tmp_path / f"s{s}" / "tb")
        assert set(a) == set(b)
        for t in ("distill/loss", "distill/kl", "distill/turn_frac_0"):
            assert [p[0] for p in a[t]] == [p[0] for p in b[t]]
            np.testing.assert_allclose([p[1] for p in a[t]], [p[1] for p in b[t]], rtol=1e-4)
    return res


def test_offline_vmapped_seeds_equal_separate_runs_and_ci(cache, tmp_path):
    # 2 seeds (not more): each extra seed costs a separate run and guards nothing new
    res = _assert_equals_separate(cache, tmp_path, (), 2, 5, **{"eval.every": 2})
    for r in res["per_seed"]:   # an eval point every 2 updates (the 4th is "after")
        assert [c["step"] for c in r["curve"]] == [2]
    after = [r["after"]["success_rate"] for r in res["per_seed"]]
    ci = res["success_after"]
    assert ci["n"] == 2 and ci["mean"] == pytest.approx(np.mean(after))
    half = stats.t.ppf(0.975, 1) * np.std(after, ddof=1) / np.sqrt(2)   # 0 if all equal
    assert ci["ci_half_width"] == pytest.approx(half, abs=1e-12)
    stored = json.loads((tmp_path / "vmapped" / "results.json").read_text())
    assert stored["per_seed"] == res["per_seed"]


def test_seeds_summary_ci_matches_scipy_on_spread_values():
    """results.json's success CI over seeds, on per-seed rates that differ (the smoke students
    above all score the same, so their CI has zero width): SciPy's Student-t interval."""
    from types import SimpleNamespace

    from prada_jax.distill.results import seeds_summary
    after = [0.25, 0.5, 0.375, 0.75, 0.0]
    before = [0.0, 0.125, 0.0, 0.0, 0.0]
    per = [{"before": {"success_rate": b}, "after": {"success_rate": a}, "update_s_median": 0.1,
            "cost": {}}
           for a, b in zip(after, before)]
    setup = SimpleNamespace(seeds=tuple(range(5)), schedule="kappa",
                            config=SimpleNamespace(mode="offline",
                                                   loss=SimpleNamespace(kind="fkl")))
    out = seeds_summary(setup, per, env_calls=0)
    for tag, vals in (("after", after), ("before", before)):
        lo, hi = stats.t.interval(0.95, len(vals) - 1, loc=np.mean(vals), scale=stats.sem(vals))
        ci = out[f"success_{tag}"]
        assert ci["n"] == 5 and ci["mean"] == pytest.approx(np.mean(vals))
        assert ci["ci_half_width"] == pytest.approx((hi - lo) / 2, rel=1e-9)
        assert ci["ci_half_width"] > 0.05


@pytest.mark.slow  # ≈ 20 s; default: the offline form (docs/claims.md) and the stacked resume
def test_onpolicy_vmapped_seeds_equal_separate_runs(cache, tmp_path):
    _assert_equals_separate(cache, tmp_path, ("onpolicy",), 2, 0,
                            **{"eval.n_problems": 2, "eval.batch_size": 2})


def test_auto_per_seed_sampler_state_and_stacked_resume(cache, tmp_path):
    """``auto`` keeps one sampler state per seed (equal to separate runs, with the gap test
    switched on so κ moves); a multi-seed run interrupted after update 2 and resumed from its
    stacked checkpoint ends with the same students, results and curves."""
    from prada_jax.distill.trainer import train_and_evaluate
    ov = {"sampler.auto_gap_max": 1e9, "eval.n_problems": 0}
    _assert_equals_separate(cache, tmp_path / "eq", ("auto",), 2, 1, **ov)
    cfg = _config(cache, "auto", **ov, **{"train.num_seeds": 2})
    a, b = tmp_path / "a", tmp_path / "b"
    ra = train_and_evaluate(cfg, a)
    part = train_and_evaluate(cfg, b, max_steps=3)
    assert part["finished"] is False
    shutil.rmtree(b / "checkpoints" / "3")
    rb = train_and_evaluate(cfg, b)
    from prada_jax.distill.opd import untimed_results
    assert untimed_results(ra) == untimed_results(rb)
    for s in (0, 1):
        wa, wb = _weights(a / f"seed_{s}" / "student_hf"), _weights(b / f"seed_{s}" / "student_hf")
        for k in wa:
            np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)
        sa, sb = _scalars(a / "tb" / f"seed_{s}"), _scalars(b / "tb" / f"seed_{s}")
        for t in sa:
            if t not in ("distill/tokens_per_s", "distill/update_s") and not (
                    t.startswith("cost/") and t.endswith("_s")):   # wall-clock times
                assert sa[t] == sb[t], t
    again = train_and_evaluate(cfg, b)
    assert again["already_finished"]
    with pytest.raises(cu.ConfigError, match="config.train.num_seeds"):
        train_and_evaluate(_config(cache, **{"train.num_seeds": 0}), tmp_path / "bad")
