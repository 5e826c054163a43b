"""Tree expansion, terminal/correct flags and fallbacks of the trace builder, with scripted
step generators (no models): checked against an exhaustive enumeration of paths."""
import itertools

import numpy as np
import pytest

from prada_jax.traces.builder import assembly as assembly_lib
from prada_jax.traces.builder import generation as generation_lib
from prada_jax.traces.builder import settings as settings_lib
from prada_jax.traces.builder import staging as staging_lib
from prada_jax.traces.builder import tree as tree_lib
from prada_jax.traces import format as fmt
from prada_jax.traces.datasets import Problem


class ScriptedGenerator:
    """Step text encodes the path: "<role><depth>|" where the path is the roles of the
    previous steps; ``finals`` maps a path string (e.g. "01") to a final step text."""

    def __init__(self, role, finals=None, hidden=4):
        self.role, self.finals, self.hidden_size = role, finals or {}, hidden
        self.name = f"scripted{role}"
        self.calls = 0

    def generate(self, questions, steps, seeds):
        self.calls += 1
        out = []
        for q, s in zip(questions, steps):
            path = "".join(x[0] for x in s) + str(self.role)
            text = self.finals.get((q, path), f"{self.role}{len(s)}|\n\n")
            n = len(s) + 2
            out.append(generation_lib.Step(text=text, n_tokens=n, logprobs=-np.arange(1.0, n + 1),
                              entropies=np.full(n, 0.5), hidden=np.ones(self.hidden_size,
                                                                       np.float32) * len(s),
                              eos=False, ctx_tokens=10 + 3 * len(s)))
        return out


class CountingPRM:
    """Score of a prefix = 0.5 + 0.05 × (LLM steps) - 0.05 × (SLM steps), clipped."""
    name = "counting"

    def score(self, questions, steps):
        out = []
        for s in steps:
            vals = [0.5]
            for x in s:
                vals.append(vals[-1] + (0.05 if x.startswith("1") else -0.05))
            out.append(np.clip(np.array(vals, np.float32), 0, 1))
        return out


def _settings(**kw):
    base = dict(benchmark="gsm8k", node_budget=6, full_depth=1, max_steps=6, behaviour="const",
                behaviour_llm_prob=0.3, behaviour_threshold=0.7, behaviour_temp=0.1,
                behaviour_eps=0.05, step_delimiter="\n\n", max_step_tokens=8, temperature=0.0,
                system_prompt="", feature_dim=8, seed=0, batch_size=2, prm_style="value-head",
                device="cpu", dtype="fp32", check_timeout=1.0)
    base.update(kw)
    return settings_lib.Settings(**base)


def _paths(tree):
    return {"".join(s[0] for s in n.steps) for n in tree.nodes}


def _reference_expansion(budget, full_depth, max_steps, p_llm):
    """Exhaustive: all 0/1 paths below max_steps; every path up to full_depth, then the most
    likely deeper ones (parents are always likelier than children, so the set is a tree)."""
    paths = [""] + ["".join(b) for d in range(1, max_steps) for b in
                    itertools.product("01", repeat=d)]
    prob = {p: float(np.prod([p_llm if c == "1" else 1 - p_llm for c in p])) for p in paths}
    full = [p for p in paths if len(p) <= full_depth]
    rest = sorted((p for p in paths if len(p) > full_depth), key=lambda p: -prob[p])
    return set(full) | set(rest[:budget - len(full)])


@pytest.mark.parametrize("budget,full_depth", [(6, 1), (9, 2), (3, 0), (1, 0)])
def test_expansion_matches_exhaustive_reference(budget, full_depth):
    st = _settings(node_budget=budget, full_depth=full_depth, max_steps=6)
    probs = [Problem(0, "q0", "7", "math"), Problem(1, "q1", "8", "math")]
    proj = tree_lib.make_projection(4, st.feature_dim, st.seed)
    trees = tree_lib.build_trees(probs, ScriptedGenerator(0), ScriptedGenerator(1), CountingPRM(), st,
                          proj)
    want = _reference_expansion(budget, full_depth, st.max_steps, 0.3)
    for tree in trees:
        budgeted = {"".join(s[0] for s in n.steps) for n in tree.nodes if not n.completion}
        assert budgeted == want
        # Completion nodes continue the likeliest (SLM) branch of the deepest node, one per
        # depth, until the forced terminal step.
        deepest = max(len(p) for p in want)
        assert tree.n_completion == st.max_steps - 1 - deepest
        for n in tree.nodes:
            if n.depth == st.max_steps - 1:
                assert n.terminal == (1, 1)


def test_terminal_correct_prm_and_features():
    st = _settings(node_budget=7, full_depth=2, max_steps=8)
    # q0: the SLM finishes right after one LLM step ("10"), correctly; the LLM finishes at the
    # root, wrongly. q1 (multiple choice): SLM at the root answers B (right).
    slm = ScriptedGenerator(0, {("q0", "10"): "so \\boxed{7}.\n\n",
                                ("q1", "0"): "The answer is \\boxed{B}\n\n"})
    llm = ScriptedGenerator(1, {("q0", "1"): "\\boxed{8}\n\n"})
    probs = [Problem(0, "q0", "7", "math"), Problem(5, "q1", "B", "choice")]
    proj = tree_lib.make_projection(4, st.feature_dim, st.seed)
    trees = tree_lib.build_trees(probs, slm, llm, CountingPRM(), st, proj)
    t0 = trees[0]
    root = t0.nodes[0]
    assert root.terminal == (0, 1) and root.correct == (0, 0)
    assert root.child[1] == -1 and root.child[0] >= 0
    n0 = t0.nodes[root.child[0]]
    assert n0.steps == ("00|\n\n",)
    # "1" (the LLM child of the root) is terminal, so "10" is never reached in q0.
    assert not any(n.steps[:1] == ("\\boxed{8}\n\n",) for n in t0.nodes)
    t1 = trees[1]
    assert t1.nodes[0].terminal == (1, 0) and t1.nodes[0].correct == (1, 0)
    # PRM fields: node prm = its parent's candidate score; CountingPRM closed form.
    for tree in trees:
        for n in tree.nodes:
            n_llm = sum(s.startswith("1") for s in n.steps)
            assert n.prm == pytest.approx(0.5 + 0.05 * (2 * n_llm - len(n.steps)), abs=1e-6)
            assert n.cand_prm[0] == pytest.approx(n.prm - 0.05, abs=1e-6)
            for c in (0, 1):
                if n.child[c] >= 0:
                    assert tree.nodes[n.child[c]].prm == pytest.approx(n.cand_prm[c], abs=1e-6)
            # features: projection of the scripted hidden state, then the statistics
            k = n.depth
            n_tok = k + 2
            want = np.concatenate([np.ones(4, np.float32) * k @ proj,
                                   [-(n_tok + 1) / 2, -n_tok, 0.5, k, 10 + 3 * k]])
            np.testing.assert_allclose(n.feat, want, rtol=1e-6)


def test_prm_behaviour_policy_and_fallbacks():
    st = _settings(behaviour="prm", node_budget=5, full_depth=0, max_steps=4)
    assert tree_lib.behaviour_llm_prob(0.7, st) == pytest.approx(0.5)
    assert tree_lib.behaviour_llm_prob(0.0, st) == pytest.approx(1 - st.behaviour_eps, abs=1e-3)
    # 0.8 is one temperature above the threshold: eps + (1 - 2 eps) / (1 + e)
    assert tree_lib.behaviour_llm_prob(0.8, st) == pytest.approx(0.05 + 0.9 / (1 + np.e), rel=1e-9)
    proj = tree_lib.make_projection(4, st.feature_dim, st.seed)
    trees = tree_lib.build_trees([Problem(0, "q", "1", "math")], ScriptedGenerator(0),
                          ScriptedGenerator(1), CountingPRM(), st, proj)
    tree = trees[0]
    by_depth = {}
    for i, n in enumerate(tree.nodes):
        by_depth.setdefault(n.depth, []).append(i)
    for i, n in enumerate(tree.nodes):
        open_ = [c for c in (0, 1) if not n.terminal[c] and n.child[c] < 0]
        if not open_:
            assert n.fallback == -1
            continue
        kids = [ch for ch in n.child if ch >= 0]
        if kids:
            assert n.fallback == kids[0]
        else:
            best = max(by_depth[n.depth + 1], key=lambda j: (tree.nodes[j].prob, -j))
            assert n.fallback == best


def test_assembled_batches_pass_validator(tmp_path):
    st = _settings(node_budget=5, full_depth=1, max_steps=4)
    probs = [Problem(i, f"q{i}", "7", "math") for i in range(3)]
    proj = tree_lib.make_projection(4, st.feature_dim, st.seed)
    staging = tmp_path / staging_lib.STAGING
    staging.mkdir()
    for s, e in [(0, 2), (2, 3)]:
        trees = tree_lib.build_trees(probs[s:e], ScriptedGenerator(0), ScriptedGenerator(1),
                              CountingPRM(), st, proj)
        staging_lib.write_batch(staging, s, e, trees, {"seconds": 0.0})
    meta = assembly_lib.assemble(tmp_path, probs, [(0, 2), (2, 3)],
                      {"benchmark": "gsm8k", "synthetic": False,
                       "models": {"slm": "a", "llm": "b", "prm": "c"},
                       "feature_names": tree_lib.feature_names(st.feature_dim)})
    traces = fmt.load(tmp_path)
    assert meta["counts"]["problems"] == 3
    assert traces.answer_id.tolist() == [0, 1, 2]
    assert meta["feature_names"][-5:] == list(settings_lib.STATS_FEATURES)
    assert meta["generator"]["nodes_with_fallback"] == int((traces.fallback >= 0).sum())


def test_context_full_makes_candidates_terminal():
    # ctx = 10 + 3k tokens, a step has k + 2 tokens, room needed for 8 more: at k = 3,
    # 19 + 3 + 8 = 32 > 30, so both candidates at depth 3 end the solution.
    st = _settings(node_budget=40, full_depth=5, max_steps=6, max_step_tokens=8)
    slm, llm = ScriptedGenerator(0), ScriptedGenerator(1)
    slm.max_context = 30
    proj = tree_lib.make_projection(4, st.feature_dim, st.seed)
    tree = tree_lib.build_trees([Problem(0, "q", "1", "math")], slm, llm, CountingPRM(), st, proj)[0]
    assert max(n.depth for n in tree.nodes) == 3
    assert all(n.terminal == ((1, 1) if n.depth == 3 else (0, 0)) for n in tree.nodes)
    assert len(tree.nodes) == 15  # the full tree down to depth 3


def test_importing_the_builder_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, prada_jax.traces.builder.cli, prada_jax.traces.prm, "
            "prada_jax.traces.answers, prada_jax.traces.datasets; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
