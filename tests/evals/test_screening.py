"""``evals.screening`` on the crafted set whose answers are known (evals.testing): one step per
problem, the SLM's draft right on even problems, the LLM always right, feature 0 (= the test
policy's ΔQ) +1 exactly where the draft is wrong. So the oracle offloads exactly the wrong
drafts (accuracy 1, share ½, the whole SLM→LLM gap), and PRADA at θ = 0 is that oracle, which
random screening at the same share cannot match.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge
from evals import evaluate as ev
from evals import knobs, screening
from evals.testing import crafted_traces, oracle_apply


@pytest.fixture(scope="module")
def comparison():
    params = edge.make_params(crafted_traces(16), num_users=8, num_servers=8, bandwidth_hz=1e9,
                              arrival_rate_hz=8.0, snr_threshold_db=-np.inf)
    e = ev.Evaluator(params, seeds=4, num_slots=120, warmup_slots=10, apply_fn=oracle_apply,
                     net_params=jnp.zeros(()), drain_slots=60)
    scores = {m: knobs.node_scores(oracle_apply, None, params, m)
              for m in ("prada", "prada_actor")}
    comp = screening.compare(e, scores, shares=(0.05, 0.5, 0.8))
    return comp, screening.summarize(comp)


def test_exact_pool_values(comparison):
    comp, _ = comparison
    ex = comp.exact
    assert ex["slm_accuracy"] == 0.5 and ex["llm_accuracy"] == 1.0
    assert ex["oracle_curve"]["accuracy"] == [0.5, 1.0]          # k = 0, k = K = 1
    assert ex["oracle_curve"]["offload_share"] == [0.0, 0.5]
    assert [k for k, _ in comp.oracle_rows] == [None]            # k = 1 is already unlimited


def test_rows_and_pairs(comparison):
    comp, summ = comparison
    ps = comp.per_seed
    orc = ps["Oracle k=∞"]
    np.testing.assert_allclose(orc["accuracy"], 1 - orc["blocked_rate"] - orc["timeout_rate"])
    np.testing.assert_array_equal(ps[screening.SLM]["offload_rate"], 0.0)
    assert comp.pairs[0]["theta"] is None                         # the actor's point first
    assert {p["method"] for p in comp.pairs} == {"actor", "prada", "prada_actor"}
    critic = [p for p in summ["pairs"] if p["method"] == "prada"]
    assert len(critic) >= 2
    zero = [p for p in critic if -1.0 <= p["theta"] < 1.0]
    assert zero, critic                                           # a θ that picks the wrong drafts
    pr = zero[0]
    np.testing.assert_array_equal(ps[pr["prada"]]["accuracy"], orc["accuracy"])
    assert pr["accuracy_diff"]["ci_low"] > 0                      # beats random at equal share
    assert abs(pr["share_diff"]["mean"]) < 0.1
    assert summ["rows"][pr["prada"]]["gap_recovered"]["mean"] > 0.9
    text = screening.format_report(summ, "SYNTHETIC test")
    assert "Oracle screening" in text and "actor" in text and "SYNTHETIC" in text


def test_gap_recovered_is_the_ratio_of_seed_means():
    rng = np.random.default_rng(0)
    s = rng.uniform(0.7, 0.8, 16)
    l = s + 0.1 + rng.normal(0, 0.01, 16)
    a = s + 0.06
    ps = {screening.SLM: {"accuracy": s}, screening.LLM: {"accuracy": l}, "x": {"accuracy": a}}
    g = screening.gap_recovered(ps, "x", resamples=500)
    assert g["mean"] == pytest.approx(0.06 / (l.mean() - s.mean()))
    assert g["ci_low"] < g["mean"] < g["ci_high"]
