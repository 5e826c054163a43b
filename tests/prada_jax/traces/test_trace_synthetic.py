"""Synthetic generator (SYNTHETIC data): calibration against a plain-Python tree walk, structure."""
import numpy as np
import pytest

from prada_jax.traces import format as fmt
from prada_jax.traces import synthetic
from prada_jax.traces.stats import trace_stats

PUBLISHED = {  # docs/design.md §2: problems, all-SLM %, all-LLM %
    "gsm8k": (1319, 84.8, 95.2),
    "gaokao2023en": (385, 65.5, 66.8),
    "mmlu_stem": (3018, 57.5, 71.9),
}


def _reference_walk(traces, action):
    """Plain-Python walk, one problem at a time: the accuracy (%) of always taking ``action``."""
    child = traces.child.tolist()
    fallback = traces.fallback.tolist()
    terminal = traces.terminal.tolist()
    correct = traces.correct.tolist()
    hits = 0
    for r in traces.root.tolist():
        node = r
        for _ in range(10_000):
            if terminal[node][action]:
                hits += correct[node][action]
                break
            nxt = child[node][action]
            node = nxt if nxt != -1 else fallback[node]
        else:
            raise AssertionError("walk did not end")
    return 100.0 * hits / len(traces.root)


def _meta_for_validation(traces, meta):
    return {**meta, "feature_dim": traces.feature_dim, "max_depth": int(traces.depth.max()),
            "counts": {"problems": traces.num_problems, "nodes": traces.num_nodes}}


@pytest.fixture(scope="module")
def full():
    return {name: synthetic.generate(name) for name in PUBLISHED}


@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_full_preset_accuracy_matches_published(full, preset):
    traces, meta = full[preset]
    n, slm, llm = PUBLISHED[preset]
    assert traces.num_problems == n
    fmt.validate_arrays(traces.to_dict(), _meta_for_validation(traces, meta), "mem")
    acc_slm, acc_llm = _reference_walk(traces, 0), _reference_walk(traces, 1)
    assert abs(acc_slm - slm) <= 1.0, acc_slm
    assert abs(acc_llm - llm) <= 1.0, acc_llm
    st = trace_stats(traces, meta)
    assert st["acc_slm"] * 100 == pytest.approx(acc_slm, abs=1e-9)
    assert st["acc_llm"] * 100 == pytest.approx(acc_llm, abs=1e-9)
    lo, hi = min(acc_slm, acc_llm), max(acc_slm, acc_llm)
    assert lo - 1.0 <= 100 * st["acc_random"] <= hi + 1.0   # mixed paths land in between
    assert 0.7 <= st["probe_auc"] <= 0.9, st["probe_auc"]
    assert st["fallback_random"] > 0.0                         # budgeted trees use fallback
    assert meta["synthetic"] is True and meta["models"]["slm"].startswith("synthetic-")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_other_seeds_also_calibrated(preset, seed):
    traces, _ = synthetic.generate(preset, seed=seed)
    _, slm, llm = PUBLISHED[preset]
    assert abs(_reference_walk(traces, 0) - slm) <= 1.0
    assert abs(_reference_walk(traces, 1) - llm) <= 1.0


def test_expected_accuracy_equals_target_by_construction():
    """With a noiseless, calibrated PRM the root PRM is the prior success probability of the
    all-SLM path, so its mean equals the target up to the [0.02, 0.98] clip."""
    traces, _ = synthetic.generate("gsm8k", prm_noise=0.0, prm_miss=0.0)
    root_prm = traces.prm[traces.root].astype(np.float64)
    assert abs(root_prm.mean() - 0.848) < 0.01


def test_miscalibration_scales_the_logit():
    kw = dict(problems=30, seed=5, prm_noise=0.0)
    t0, _ = synthetic.generate("mmlu_stem", prm_miscalibration=0.0, **kw)
    t1, _ = synthetic.generate("mmlu_stem", prm_miscalibration=0.5, **kw)
    logit = lambda p: np.log(p.astype(np.float64)) - np.log1p(-p.astype(np.float64))  # noqa: E731
    np.testing.assert_allclose(logit(t1.cand_prm), 1.5 * logit(t0.cand_prm), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(t0.correct, t1.correct)


def test_deterministic_from_seed():
    a, ma = synthetic.generate("gaokao2023en", seed=7, problems=20)
    b, mb = synthetic.generate("gaokao2023en", seed=7, problems=20)
    c, _ = synthetic.generate("gaokao2023en", seed=8, problems=20)
    for k, v in a.to_dict().items():
        np.testing.assert_array_equal(v, getattr(b, k), err_msg=k)
    assert ma == mb
    assert a.feat.shape != c.feat.shape or not np.array_equal(a.feat, c.feat)


def test_structure_tokens_prm_and_budget():
    budget = 40
    traces, meta = synthetic.generate("gsm8k", seed=2, problems=60, node_budget=budget,
                                      full_depth=3)
    child, fb, depth = traces.child, traces.fallback, traces.depth
    # prm of a child is the parent's candidate score; context grows by the chosen step
    for c in (0, 1):
        has = child[:, c] >= 0
        np.testing.assert_array_equal(traces.prm[child[has, c]], traces.cand_prm[has, c])
        np.testing.assert_array_equal(traces.ctx_tokens[child[has, c]],
                                      traces.ctx_tokens[has] + traces.cand_tokens[has, c])
    # complete above full_depth: every non-terminal candidate there is expanded
    shallow = depth < 3
    assert np.all((child[shallow] >= 0) | (traces.terminal[shallow] == 1))
    # the budget caps optional branches: problems whose sticky chains fit stay within it
    steps = np.array([depth[traces.problem == p].max() + 1 for p in range(60)])
    mandatory = 2 ** np.minimum(steps, 4) - 1 + 8 * np.maximum(steps - 4, 0)   # sticky chains
    assert np.all(traces.n_nodes >= mandatory)
    fits = mandatory <= budget
    assert np.all(traces.n_nodes[fits] <= budget)
    # fallback points at the sibling's child
    one = (fb >= 0)
    assert np.all((fb[one] == child[one, 0]) | (fb[one] == child[one, 1]))
    # benchmark-like steps (gsm8k 3..10) and every terminal at the last step
    assert steps.min() >= 3 and steps.max() <= 10
    assert meta["feature_names"] == list(synthetic.FEATURE_NAMES)


def test_llm_helps_where_slm_draft_is_weak():
    """Nodes whose features look worst (low draft log-prob) gain more from the LLM step."""
    traces, meta = synthetic.generate("mmlu_stem", seed=0, problems=800)
    gain = traces.cand_prm[:, 1].astype(float) - traces.cand_prm[:, 0]
    lp = traces.feat[:, synthetic.FEATURE_NAMES.index("logp_mean")]
    low = lp < np.quantile(lp, 0.25)
    high = lp > np.quantile(lp, 0.75)
    assert gain[low].mean() > gain[high].mean() + 0.05


@pytest.mark.parametrize("kwargs, word", [
    (dict(preset="nope"), "preset"),
    (dict(preset="gsm8k", problems=0), "problems"),
    (dict(preset="gsm8k", prm_noise=-1.0), "prm_noise"),
    (dict(preset="gsm8k", prm_miscalibration=-1.0), "prm_miscalibration"),
    (dict(preset="gsm8k", prm_miss=1.5), "prm_miss"),
    (dict(preset="gsm8k", full_depth=-1), "full_depth"),
])
def test_bad_settings_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        synthetic.generate(**kwargs)


def test_get_or_make_caches_and_repairs(tmp_path):
    p = synthetic.get_or_make("gaokao2023en", tmp_path, seed=1, problems=5)
    assert fmt.validate(p)["generator"]["seed"] == 1
    mtime = (p / fmt.NODES_FILE).stat().st_mtime_ns
    assert synthetic.get_or_make("gaokao2023en", tmp_path, seed=1, problems=5) == p
    assert (p / fmt.NODES_FILE).stat().st_mtime_ns == mtime
    (p / fmt.NODES_FILE).write_bytes(b"garbage")
    synthetic.get_or_make("gaokao2023en", tmp_path, seed=1, problems=5)
    fmt.validate(p)


def test_systematic_sampling_marginals_and_total():
    rng = np.random.default_rng(0)
    pi = rng.uniform(size=12)
    draws = np.array([synthetic._systematic(pi, np.random.default_rng(s)) for s in range(4000)])
    assert np.all(np.abs(draws.sum(axis=1) - pi.sum()) < 1.0 + 1e-12)
    np.testing.assert_allclose(draws.mean(axis=0), pi, atol=0.03)   # 4000 draws: sd <= 0.008


def test_first_occurrence_matches_enumerated_conditional():
    """Against exact enumeration of all 2^K flag patterns given at least one flag set."""
    import itertools
    x = np.array([[0.1, 0.5, 0.3, 0.2]])
    mask = np.array([[True, True, True, False]])
    rng = np.random.default_rng(1)
    draws = synthetic._first_occurrence(np.repeat(x, 20000, 0), np.repeat(mask, 20000, 0), rng)
    assert not draws[:, 3].any() and draws.any(axis=1).all()
    probs = {}
    for pat in itertools.product((0, 1), repeat=3):
        if any(pat):
            probs[pat] = np.prod([x[0, i] if b else 1 - x[0, i] for i, b in enumerate(pat)])
    z = sum(probs.values())
    keys, counts = np.unique(draws[:, :3].astype(int), axis=0, return_counts=True)
    freq = {tuple(k): c / draws.shape[0] for k, c in zip(keys.tolist(), counts)}
    for pat, p in probs.items():
        assert abs(freq.get(pat, 0.0) - p / z) < 0.012, (pat, freq.get(pat), p / z)


def _prefix_llm_accuracy(traces, j):
    """Plain-Python walk: LLM for the first j steps, then SLM drafts (with fallbacks), in %."""
    hits = 0
    for r in traces.root.tolist():
        node, k = r, 0
        while True:
            a = 1 if k < j else 0
            if traces.terminal[node, a]:
                hits += int(traces.correct[node, a])
                break
            nxt = int(traces.child[node, a])
            node, k = (nxt if nxt >= 0 else int(traces.fallback[node])), k + 1
    return 100.0 * hits / traces.num_problems


def test_mixed_paths_monotone_between_endpoints(full):
    traces, _ = full["gsm8k"]
    acc = [_prefix_llm_accuracy(traces, j) for j in range(0, 7)]
    assert all(b >= a - 0.2 for a, b in zip(acc, acc[1:])), acc
    assert acc[0] < acc[3] < acc[-1] <= _reference_walk(traces, 1) + 0.2
