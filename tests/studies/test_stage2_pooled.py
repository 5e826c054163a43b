"""studies.stage2_pooled: disjoint test seeds per cell, pooled claims against a direct
computation, the rules, the budget report; studies.stage2_verdict.choose_margin's rule."""
import numpy as np
import pytest

from studies import stage2_verdict as stage2
import studies.stage2_pooled as pooled
from prada_jax import stats
from studies.stage2_verdict import runner
from prada_jax.errors import BadInput

S2 = stage2


def _cells(P, L, S, rows, seed=0, name="slow_server"):
    """Fabricated stage2.json dicts: rows = {row: (objective offset, policy sd, util)}."""
    rng = np.random.default_rng(seed)
    pol = rng.normal(0, 1, P)
    cells = []
    for i in range(P):
        per = []
        for j in range(L):
            ps = {}
            for r, (off, sd, util) in rows.items():
                ps[r] = {"objective": list(0.6 + off + sd * pol[i] + rng.normal(0, 0.01, S)),
                         "server_util": list(util + 0.01 * pol[i] + rng.normal(0, 0.005, S))}
            per.append({"meta": {"learner_seed": j}, "scenarios": {name: {
                "per_seed": ps, "grid": {"best": {"lambda_s": 0.1}},
                "multipliers": {"learned_constant": {"lambda_s": 0.09 + j / 100,
                                                     "mu_per_mhz": 0.0}}}}})
        cells.append(per)
    return cells


def test_cells_get_disjoint_test_seed_blocks():
    P, L, S = 3, 2, 8
    blocks = [set(range(pooled.cell_seed0(64, i, j, L, S), pooled.cell_seed0(64, i, j, L, S) + S))
              for i in range(P) for j in range(L)]
    assert sum(len(b) for b in blocks) == len(set().union(*blocks)) == P * L * S
    assert min(min(b) for b in blocks) == 64


ROWS = {S2.ROW_CONST: (0.03, 0.004, 0.25), S2.ROW_ZERO: (0.0, 0.004, 0.40),
        S2.ROW_BEST: (0.031, 0.004, 0.26), S2.ROW_NOLIM: (0.06, 0.004, 0.1),
        S2.ROW_COND: (0.03, 0.004, 0.25)}


def test_pooled_claims_match_a_direct_computation_and_the_rules():
    cells = _cells(3, 2, 8, ROWS)
    rep = pooled.judge_scenario(cells, "slow_server", None, resamples=2000)
    x = (pooled.stack(cells, "slow_server", S2.ROW_CONST, "objective")
         - pooled.stack(cells, "slow_server", S2.ROW_ZERO, "objective"))
    assert x.shape == (3, 2, 8)
    c = rep["claims"]["learned_minus_zero"]
    assert c["mean"] == pytest.approx(x.mean())
    assert c["policy_means"] == pytest.approx(list(x.mean(axis=(1, 2))))
    assert c["lo"] <= min(c["bootstrap"]["lo"], c["cluster_t"]["lo"]) + 1e-12
    # per policy: its own learner seeds and eval seeds only
    assert rep["per_policy"][1]["claims"]["learned_minus_zero"]["mean"] == pytest.approx(
        x[1].mean())
    # headroom 0.06, learned − zero 0.03 with a small policy spread: resolvable, passes
    assert rep["power"]["resolvable"]
    assert rep["power"]["mde"] == pytest.approx(pooled.pooled_mde([
        x, pooled.stack(cells, "slow_server", S2.ROW_NOLIM, "objective")
        - pooled.stack(cells, "slow_server", S2.ROW_ZERO, "objective")]))
    assert rep["verdict"] == {"learned_beats_zero": "pass", "learned_near_reference": "pass"}
    # an outage scenario also judges the conditioned map (equal to the constant here: fail)
    rep = pooled.judge_scenario(_cells(3, 2, 8, ROWS, name="outage_burst_m2"),
                                "outage_burst_m2", None, resamples=500)
    assert rep["verdict"]["conditioned_beats_constant"] == "fail"


def test_large_policy_spread_fails_the_gate():
    rows = dict(ROWS)
    rows[S2.ROW_NOLIM] = (0.06, 0.05, 0.1)     # headroom varies a lot between policies
    rep = pooled.judge_scenario(_cells(3, 2, 8, rows, seed=1), "slow_server", None,
                                resamples=500)
    assert not rep["power"]["resolvable"]
    assert set(rep["verdict"].values()) == {"cannot resolve"}


def test_budget_report_per_policy_sample():
    cells = _cells(3, 2, 8, ROWS, seed=2)
    rep = pooled.judge_scenario(cells, "slow_server", 0.25, resamples=200)
    occ = pooled.stack(cells, "slow_server", S2.ROW_CONST, "server_util")
    bd = rep["budget"]
    assert bd["learned_mean_per_policy"] == pytest.approx(list(occ.mean(axis=(1, 2))))
    assert bd["exceed_share_all_seeds"] == pytest.approx(float(np.mean(occ > 0.25 * 1.02)))
    assert rep["verdict"]["budget"] == ("pass" if np.all(occ.mean(axis=(1, 2)) <= 0.255)
                                        else "fail")
    assert rep["per_policy"][0]["occupancy"]["exceed_share"] == pytest.approx(
        float(np.mean(occ[0] > 0.255)))


class _Result(dict):
    pass


def test_choose_margin_takes_the_smallest_margin_that_holds_on_validation(monkeypatch):
    """The learned occupancy falls with the margin (learner: util = cap·(1 − δ) + 0.02);
    per-seed spread ±0.01 around it. With cap 0.3 (limit 0.306) δ = 0 gives 0.32 (fails),
    δ = 0.05 gives 0.305 (half the seeds within), δ = 0.1 gives 0.29 (all within)."""
    class M:
        def __init__(self, lam):
            self.lambda_s, self.mu = lam, 0.0

    learned = []

    def fake_learn(out, scenario, policy_dir, env_kw, size, conditioned, seed=0,
                   nominate_by="actor", dual_overrides=None, tag=""):
        rho = dual_overrides["dual.utilisation"]
        learned.append((rho, tag))
        env = type("E", (), {"scheduler": 4})()
        return None, {"multipliers": M(rho)}, None, env

    class Runner:
        params = None

        def run_prada(self, sched, lam, mu):
            return {"server_util": lam + 0.02 + np.linspace(-0.01, 0.01, 10)}

    monkeypatch.setattr(runner, "learn_multipliers", fake_learn)
    monkeypatch.setattr(runner, "_value_accounting", lambda *a: None)
    m = stage2.choose_margin(None, "nominal", None, {}, {}, 0.3,
                             {"confidence": 0.9, "margins": (0.2, 0.0, 0.1, 0.05)},
                             Runner(), Runner(), log=lambda *a: None)
    assert m["met"] and m["margin"] == 0.1
    assert [t["margin"] for t in m["tried"]] == [0.0, 0.05, 0.1]   # ascending, stops at 0.1
    assert learned[-1] == (pytest.approx(0.27), "_margin0.1")
    util = 0.3 * 0.95 + 0.02 + np.linspace(-0.01, 0.01, 10)
    assert m["tried"][1]["share_within"] == pytest.approx(np.mean(util <= 0.3 * 1.02))
    # none holds: the largest margin, said so
    m = stage2.choose_margin(None, "nominal", None, {}, {}, 0.3,
                             {"confidence": 1.0, "margins": (0.0, 0.02)}, Runner(), Runner(),
                             log=lambda *a: None)
    assert not m["met"] and m["margin"] == 0.02
    with pytest.raises(BadInput, match="margins"):
        stage2.choose_margin(None, "nominal", None, {}, {}, 0.3, {"margins": (1.5,)},
                             Runner(), Runner(), log=lambda *a: None)


@pytest.mark.slow
def test_pooled_end_to_end_at_a_tiny_size(tmp_path, monkeypatch):
    """Two smoke policies × 2 learner seeds × 2 test seeds, with a budget and tightening:
    pooled.json holds every cell, disjoint seed ranges, one validation grid per policy."""
    import json

    import studies.stage2_pooled as pl
    from prada_jax.configs import ppo as ppo_cfg
    from envs import stage1
    from prada_jax.rl import trainer
    tiny = dict(seeds=2, slots=60, warmup=10, scenario_length=60, num_users=8, eval_problems=60,
                env={"num_servers": 1, "arrival_rate_hz": 12.0}, ppo_variant="smoke",
                ppo_overrides={}, hindsight=True,
                dual={"train.num_envs": 2, "train.rollout_len": 10, "train.num_chunks": 1,
                      "train.sgd_steps": 2, "dual.anneal_steps": 2},
                grid=dict(lam=(0.0, 0.1), mu_per_mhz=(0.0,), fine=False))
    monkeypatch.setitem(stage2.SIZES, "quick", tiny)
    pols = []
    for k in (0, 1):
        c = ppo_cfg.get_config("smoke,gsm8k")
        c.ppo.total_env_steps = 256
        c.log.progress = False
        c.seed = k
        trainer.train_and_evaluate(c, tmp_path / f"pol{k}", stage1.build_setup(c))
        pols.append(str(tmp_path / f"pol{k}"))
    lines = []
    res = pl.run_pooled(tmp_path / "v", pols, ["burst"], learner_seeds=2, seeds=2,
                        size="quick", budget=0.3,
                        tighten={"confidence": 0.9, "margins": (0.0, 0.1)}, problems=300,
                        resamples=500, log=lines.append)
    data = json.loads((tmp_path / "v" / "pooled.json").read_text())
    ranges = [tuple(c["eval_seed_range"]) for c in data["meta"]["cells"]]
    assert len(set(ranges)) == 4 and all(b - a == 2 for a, b in ranges)
    assert sum("grid (Best constant (grid, validation)): reused" in ln for ln in lines) == 2
    sc = res["scenarios"]["burst"]
    assert np.asarray(sc["per_seed"][S2.ROW_CONST]["objective"]).shape == (2, 2, 2)
    assert len(sc["budget"]["learned_mean_per_policy"]) == 2
    assert all(m in (0.0, 0.1) for pp in sc["per_policy"] for m in pp["occupancy"]["margins"])
    assert stats.grand_mean(np.asarray(sc["per_seed"][S2.ROW_CONST]["objective"])
                           - np.asarray(sc["per_seed"][S2.ROW_ZERO]["objective"])) == \
        pytest.approx(sc["claims"]["learned_minus_zero"]["mean"])


def test_a_finished_cell_is_reused_only_with_the_same_settings(tmp_path):
    """run_pooled's reuse (issue 33 item 5: cells of one policy run while others train)."""
    import json
    key = pooled.cell_key(tmp_path, 1, 72, 8, "full", 0.27,
                          {"confidence": 0.9, "margins": (0.0, 0.1)}, "a100_orin_int4",
                          "actor", ["nominal"])
    d = tmp_path / "cells" / "p0_l1"
    assert pooled.reuse_cell(d, key) is None                   # nothing there
    d.mkdir(parents=True)
    (d / "stage2.json").write_text(json.dumps({"scenarios": {"nominal": {"x": 1}}}))
    assert pooled.reuse_cell(d, key) is None                   # no cell.json: unfinished
    (d / pooled.CELL_FILE).write_text(json.dumps(key))
    assert pooled.reuse_cell(d, key)["scenarios"]["nominal"] == {"x": 1}
    for change in ({"seed0": 80}, {"hardware": "paper"}, {"learner_seed": 0},
                   {"scenarios": ["nominal", "slow_server"]}, {"budget": 0.3}):
        assert pooled.reuse_cell(d, dict(key, **change)) is None, change
    (d / pooled.CELL_FILE).write_text("{not json")
    assert pooled.reuse_cell(d, key) is None


def test_per_policy_learned_occupancy_without_a_budget():
    """Item 2's report per policy sample (the learned constant's test occupancy) is there
    with or without a cap, and equals a direct mean; the table prints λ_s and µ."""
    cells = _cells(3, 2, 8, ROWS)
    rep = pooled.judge_scenario(cells, "slow_server", None, resamples=200)
    occ = pooled.stack(cells, "slow_server", S2.ROW_CONST, "server_util")
    for i, pp in enumerate(rep["per_policy"]):
        assert pp["learned_occupancy"]["mean"] == pytest.approx(occ[i].mean())
        assert pp["learned_occupancy"]["per_cell"] == pytest.approx(list(occ[i].mean(axis=1)))
    md = pooled.to_markdown({"meta": {"policies": ["a", "b", "c"], "learner_seeds": 2,
                                      "eval_seeds_per_cell": 8, "size": "full",
                                      "interval": "x"},
                             "scenarios": {"slow_server": rep}})
    assert "µ=0/MHz" in md and "test occupancy" in md


def test_report_only_recomputes_the_committed_pooled_verdict(tmp_path, run_command):
    """``--report_only`` on the committed ``contended`` run: pooled.json and pooled.md
    byte-identical from its cells' stage2.json."""
    import shutil
    from pathlib import Path

    src = (Path(__file__).resolve().parents[2] / "studies" / "stage2_pooled" / "results"
           / "contended")
    shutil.copytree(src, tmp_path / "contended")
    (tmp_path / "contended" / "pooled.json").write_text(
        (src / "pooled.json").read_text().replace('"learned_beats_zero": "cannot resolve"',
                                                  '"learned_beats_zero": "pass"'))
    code, _, err = run_command("studies.stage2_pooled", "--report_only",
                               f"--out={tmp_path / 'contended'}")
    assert code == 0, err
    for f in ("pooled.json", "pooled.md"):
        assert (tmp_path / "contended" / f).read_text() == (src / f).read_text(), f
