"""The oracle screening's DP against brute force on small random trees.

Brute force: every action string (keep / offload per step) from each root, moved through the
tree as the env moves (child, else the fallback; a terminal candidate ends the solution). The
DP must give the fewest offloads of any string that ends correct, following its table must end
correct with exactly that many (the SLM path where no string ends correct), and at budget k it
must be correct exactly where some string with ≤ k offloads is. Reachability at unlimited budget
is checked against a plain graph search as well.
"""
import itertools

import numpy as np
import pytest

from prada_jax.traces import oracle
from prada_jax.traces.format import TraceSet, validate_arrays
from prada_jax.traces.testing import random_meta, random_traces


def _walk(traces, root, actions):
    """(ended, correct, offloads, used_fallback) of an action string from ``root``; ended is
    False if the string is too short to finish."""
    n, offl, fb = int(root), 0, False
    for a in actions:
        offl += a
        if traces.terminal[n, a]:
            return True, bool(traces.correct[n, a]), offl, fb
        ch = int(traces.child[n, a])
        fb |= ch < 0
        n = ch if ch >= 0 else int(traces.fallback[n])
    return False, False, offl, fb


def _brute(traces, root, depth):
    """Every distinct ending of every action string: [(correct, offloads, actions taken)]."""
    outs = set()
    for acts in itertools.product((0, 1), repeat=depth + 1):
        for length in range(1, depth + 2):
            ended, corr, offl, _ = _walk(traces, root, acts[:length])
            if ended:
                outs.add((corr, offl, acts[:length]))
                break
    return outs


def _reachable(traces, root):
    """Whether any correct terminal candidate is reachable from ``root`` (graph search)."""
    seen, stack = set(), [int(root)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for c in (0, 1):
            if traces.terminal[n, c]:
                if traces.correct[n, c]:
                    return True
                continue
            stack.append(int(traces.child[n, c]) if traces.child[n, c] >= 0
                         else int(traces.fallback[n]))
    return False


TREES = [dict(seed=s, problems=10, depth=d, p_terminal=pt, p_expand=pe, hard=h)
         for s, (d, pt, pe, h) in enumerate([(3, 0.2, 0.8, 0), (4, 0.3, 0.6, 0),
                                             (5, 0.15, 0.5, 0), (4, 0.1, 0.9, 1),
                                             (6, 0.25, 0.4, 1), (2, 0.0, 1.0, 0),
                                             (5, 0.1, 0.8, 1), (6, 0.05, 0.7, 1)])]


def _hard(t: TraceSet, seed: int) -> TraceSet:
    """Most SLM leaves wrong and a third of the LLM's: minimum offloads of 2 and more, and
    problems with no correct leaf."""
    rng = np.random.default_rng(seed)
    keep = np.stack([rng.uniform(size=t.num_nodes) < 0.15,
                     rng.uniform(size=t.num_nodes) < 0.65], 1)
    return t.replace(correct=(t.correct.astype(bool) & keep).astype(np.uint8))


@pytest.fixture(scope="module", params=TREES,
                ids=lambda t: f"seed{t['seed']}-d{t['depth']}{'-hard' if t['hard'] else ''}")
def tree(request):
    kw = dict(request.param)
    hard = kw.pop("hard")
    t = random_traces(**kw)
    if hard:
        t = _hard(t, kw["seed"])
    validate_arrays(t.to_dict(), random_meta(t), "random")
    return t, request.param["depth"]


def test_the_trees_exercise_every_case():
    """The cases the brute force must see: costs 0, 1, ≥ 2 and no path; missing children."""
    costs, fallbacks = set(), 0
    for kw in TREES:
        kw = dict(kw)
        hard = kw.pop("hard")
        t = random_traces(**kw)
        t = _hard(t, kw["seed"]) if hard else t
        costs |= set(oracle.problem_min_offloads(t, oracle.oracle_tables(t)).tolist())
        fallbacks += int(((t.child < 0) & (t.terminal == 0)).sum())
    assert {0, 1, 2, oracle.NO_PATH} <= costs and fallbacks > 0


def test_min_offloads_and_following_the_table_match_brute_force(tree):
    traces, depth = tree
    tables = oracle.oracle_tables(traces)
    for p, root in enumerate(traces.root):
        outs = _brute(traces, root, depth)
        right = [o for c, o, _ in outs if c]
        want = min(right) if right else oracle.NO_PATH
        assert oracle.problem_min_offloads(traces, tables)[p] == want, p
        corr, offl, steps = oracle.follow(traces, tables, root, tables.max_budget)
        if right:
            assert corr and offl == want, p
        else:   # no correct leaf: the SLM path (every draft kept)
            slm = [o for o in outs if set(o[2]) <= {0}]
            assert len(slm) == 1 and not corr and offl == 0 and steps == len(slm[0][2]), p


def test_budget_k_solves_exactly_the_problems_brute_force_solves_within_k(tree):
    traces, depth = tree
    tables = oracle.oracle_tables(traces)
    for root in traces.root:
        outs = _brute(traces, root, depth)
        for k in range(depth + 2):
            can = any(c and o <= k for c, o, _ in outs)
            corr, offl, _ = oracle.follow(traces, tables, root, k)
            assert corr == can and offl <= k, (int(root), k)
            if not can:
                assert offl == 0   # the SLM path: no offload is wasted


def test_unlimited_accuracy_is_the_share_of_problems_with_a_reachable_correct_leaf(tree):
    traces, _ = tree
    tables = oracle.oracle_tables(traces)
    want = np.mean([_reachable(traces, r) for r in traces.root])
    curve = oracle.budget_curve(traces, tables)
    np.testing.assert_allclose(curve["accuracy"][-1], want, rtol=0, atol=1e-12)
    assert np.all(np.diff(curve["accuracy"]) >= 0)          # more budget never hurts
    assert curve["accuracy"][0] == np.mean(
        [oracle.follow(traces, tables, r, 0)[0] for r in traces.root])
    assert curve["offload_share"][0] == 0.0


def test_vectorised_walk_matches_the_single_path_follower(tree):
    traces, depth = tree
    tables = oracle.oracle_tables(traces)
    for k in list(range(depth + 2)) + [None]:
        w = oracle.walk(traces, tables.nominate, k)
        one = [oracle.follow(traces, tables, r, tables.max_budget if k is None else k)
               for r in traces.root]
        assert [tuple(x) for x in zip(w["correct"].astype(bool), w["offloads"], w["steps"])] \
            == one, k
    # A fixed screen: all-keep walks the SLM path, brute force's all-zero string.
    w0 = oracle.walk(traces, np.zeros(traces.num_nodes, np.int8))
    for p, r in enumerate(traces.root):
        slm = [o for o in _brute(traces, r, depth) if set(o[2]) <= {0}][0]
        assert (bool(w0["correct"][p]), int(w0["offloads"][p]), int(w0["steps"][p])) == \
            (slm[0], 0, len(slm[2]))


def test_the_table_column_rule_is_the_budgeted_dp():
    """Column b: offload iff the LLM branch is strictly cheaper and within b (ties keep)."""
    traces = random_traces(seed=3, problems=20, depth=5, p_terminal=0.2, p_expand=0.7)
    t = oracle.oracle_tables(traces)
    big = 1 << 20
    c = np.where(t.branch_cost < 0, big, t.branch_cost)
    for b in range(t.max_budget + 1):
        np.testing.assert_array_equal(t.nominate[:, b], (c[:, 1] < c[:, 0]) & (c[:, 1] <= b))
    assert t.max_budget == int(traces.depth.max()) + 1
    np.testing.assert_array_equal(t.nominate[:, 0], 0)      # budget 0: never offload
    np.testing.assert_array_equal(
        t.min_offloads, np.where(np.minimum(c[:, 0], c[:, 1]) >= big, -1,
                                 np.minimum(c[:, 0], c[:, 1])))


def _chain(correct_slm, correct_llm, use_fallback):
    """Two-level tree: root's SLM child missing (fallback to node 1) or present (node 1)."""
    child = np.array([[-1 if use_fallback else 1, 2], [-1, -1], [-1, -1]], np.int32)
    fb = np.array([1 if use_fallback else -1, -1, -1], np.int32)
    arrays = dict(
        feat=np.zeros((3, 2), np.float32), prm=np.full(3, 0.5, np.float32),
        cand_prm=np.full((3, 2), 0.5, np.float32), cand_tokens=np.full((3, 2), 5, np.int32),
        ctx_tokens=np.full(3, 10, np.int32), child=child,
        terminal=np.array([[0, 0], [1, 1], [1, 1]], np.uint8),
        correct=np.array([[0, 0], [correct_slm, correct_llm], [0, 0]], np.uint8),
        fallback=fb, depth=np.array([0, 1, 1], np.int32), problem=np.zeros(3, np.int32),
        root=np.zeros(1, np.int32), n_nodes=np.full(1, 3, np.int32),
        answer_id=np.zeros(1, np.int32))
    return TraceSet(**arrays)


@pytest.mark.parametrize("use_fallback", [False, True], ids=["child", "fallback"])
def test_fallback_is_followed(use_fallback):
    """Keeping the root's draft moves to node 1 (its child, or the fallback where that child is
    missing); there only the LLM's step is right: one offload, at node 1, not at the root."""
    t = _chain(0, 1, use_fallback)
    tab = oracle.oracle_tables(t)
    assert tab.min_offloads[0] == 1 and tab.branch_cost[0, 0] == 1
    assert tab.nominate[0].tolist() == [0, 0, 0] and tab.nominate[1].tolist() == [0, 1, 1]
    assert oracle.follow(t, tab, 0, 5) == (True, 1, 2)
    # nothing reachable through node 2 either: no path at all when node 1's LLM step is wrong
    t2 = _chain(0, 0, use_fallback)
    tab2 = oracle.oracle_tables(t2)
    assert tab2.min_offloads[0] == oracle.NO_PATH
    assert oracle.follow(t2, tab2, 0, 5) == (False, 0, 2)


def test_budget_cap_column():
    traces = random_traces(seed=1, problems=5, depth=4)
    t = oracle.oracle_tables(traces, max_budget=1)
    assert t.nominate.shape == (traces.num_nodes, 2) and t.max_budget == 1
    with pytest.raises(ValueError, match="max_budget"):
        oracle.oracle_tables(traces, max_budget=-1)
