"""Trace statistics against independent plain-Python references."""
import itertools

import numpy as np
import pytest

from prada_jax.traces import stats
from prada_jax.traces.synthetic import generate
from prada_jax.traces.testing import random_traces


def _auc_pairs(scores, labels):
    """O(n^2) pair count: P(score_pos > score_neg) + 0.5 P(tie)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    won = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg))
    return won / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_pair_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, size=80).astype(float)   # many ties
    labels = rng.uniform(size=80) < 0.3
    assert stats.auc(scores, labels) == pytest.approx(_auc_pairs(scores, labels), abs=1e-12)
    assert np.isnan(stats.auc(scores, np.zeros(80, bool)))


def _python_walk(traces, action):
    """Per problem: (correct, steps, fallback steps, tokens) of always taking ``action``."""
    out = []
    for r in traces.root.tolist():
        node, steps, fbs, tokens = r, 0, 0, int(traces.ctx_tokens[r])
        while True:
            steps += 1
            tokens += int(traces.cand_tokens[node, action])
            if traces.terminal[node, action]:
                out.append((int(traces.correct[node, action]), steps, fbs, tokens))
                break
            nxt = int(traces.child[node, action])
            if nxt < 0:
                fbs += 1
                nxt = int(traces.fallback[node])
            node = nxt
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("policy, action", [("slm", 0), ("llm", 1)])
def test_walk_matches_python_reference_with_fallbacks(seed, policy, action):
    traces = random_traces(seed=seed, problems=25, depth=5, p_expand=0.6)
    ref = _python_walk(traces, action)
    got = stats.walk(traces, policy)
    assert ref[:, 2].sum() > 0   # the random test traces really use fallbacks
    for i, key in enumerate(("correct", "steps", "fallback_steps", "tokens")):
        np.testing.assert_array_equal(got[key], ref[:, i], err_msg=key)


def test_random_walk_is_seeded_and_uses_both_candidates():
    traces = random_traces(seed=4, problems=30, depth=5)
    a, b = stats.walk(traces, "random", seed=1), stats.walk(traces, "random", seed=1)
    np.testing.assert_array_equal(a["correct"], b["correct"])
    assert 0 < a["llm_steps"].sum() < a["steps"].sum()
    with pytest.raises(ValueError, match="policy"):
        stats.walk(traces, "greedy")


def test_continuation_value_matches_recursion():
    traces = random_traces(seed=2, problems=10, depth=5, p_expand=0.6)

    def value(n, c):   # take c at n, then always candidate 0
        while True:
            if traces.terminal[n, c]:
                return int(traces.correct[n, c])
            nxt = int(traces.child[n, c])
            n, c = (nxt if nxt >= 0 else int(traces.fallback[n])), 0

    v = stats.continuation_value(traces)
    ref = np.array([[value(n, c) for c in (0, 1)] for n in range(traces.num_nodes)])
    np.testing.assert_array_equal(v, ref)


def test_probe_separable_vs_noise():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 5))
    y = x[:, 0] + 0.1 * rng.normal(size=2000) > 0.5
    s = stats._logistic_probe(x[:1000], y[:1000], x[1000:])
    assert stats.auc(s, y[1000:]) > 0.97
    y_noise = rng.uniform(size=2000) < 0.3
    s = stats._logistic_probe(x[:1000], y_noise[:1000], x[1000:])
    assert abs(stats.auc(s, y_noise[1000:]) - 0.5) < 0.06


def test_trace_stats_and_summary_table():
    traces, meta = generate("gaokao2023en", seed=0, problems=60)
    st = stats.trace_stats(traces, meta)
    ref0, ref1 = _python_walk(traces, 0), _python_walk(traces, 1)
    assert st["acc_slm"] == pytest.approx(ref0[:, 0].mean())
    assert st["acc_llm"] == pytest.approx(ref1[:, 0].mean())
    assert st["steps_mean"] == pytest.approx(ref0[:, 1].mean())
    assert st["path_tokens_slm"] == pytest.approx(ref0[:, 3].mean())
    assert st["problems"] == 60 and st["nodes"] == traces.num_nodes and st["synthetic"]
    term = traces.terminal.astype(bool)
    assert st["prm_final_auc"] == pytest.approx(
        _auc_pairs(traces.cand_prm[term].tolist(), traces.correct[term].tolist()))
    for key in ("prm_delta_auc", "probe_auc"):
        assert 0.0 <= st[key] <= 1.0
    table = stats.summary_table([st, {**st, "benchmark": "other", "synthetic": False}])
    assert "gaokao2023en [synthetic]" in table and "other" in table
    assert f"{100 * st['acc_slm']:.1f}" in table
    assert len({len(line) for line in table.splitlines() if not line.startswith("-")}) == 1
