"""Growing the step trees of a batch of problems: node expansion, the behaviour policy,
node features, completion nodes and fallbacks (see the package docstring)."""
from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
from typing import Sequence

import numpy as np

from prada_jax.traces import answers as answers_lib
from prada_jax.traces import datasets as datasets_lib
from prada_jax.traces.builder.generation import Step, StepGenerator
from prada_jax.traces.builder.settings import STATS_FEATURES, Settings

__all__ = ["ProblemTree", "build_trees", "behaviour_llm_prob", "make_projection",
           "node_features", "feature_names"]


@dataclasses.dataclass
class _Node:
    depth: int
    steps: tuple[str, ...]
    prob: float
    parent: int
    branch: int
    feat: np.ndarray | None = None
    prm: float = 0.0
    cand_prm: tuple[float, float] = (0.0, 0.0)
    cand_tokens: tuple[int, int] = (1, 1)
    ctx_tokens: int = 1
    child: list[int] = dataclasses.field(default_factory=lambda: [-1, -1])
    terminal: tuple[int, int] = (0, 0)
    correct: tuple[int, int] = (0, 0)
    fallback: int = -1
    p_llm: float = 0.5
    texts: tuple[str, str] = ("", "")
    completion: bool = False


def behaviour_llm_prob(draft_prm: float, st: Settings) -> float:
    """P(the behaviour policy takes the LLM step) at a node (see the module docstring)."""
    if st.behaviour == "const":
        return st.behaviour_llm_prob
    z = (st.behaviour_threshold - draft_prm) / st.behaviour_temp
    sig = 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))
    return st.behaviour_eps + (1.0 - 2.0 * st.behaviour_eps) * sig


def make_projection(hidden_size: int, feature_dim: int, seed: int) -> np.ndarray:
    """Fixed seeded Gaussian projection [H, F - 5] / sqrt(H), float32."""
    rng = np.random.default_rng([seed, hidden_size, feature_dim, 0x7072])
    k = feature_dim - len(STATS_FEATURES)
    return (rng.standard_normal((hidden_size, k)) / math.sqrt(hidden_size)).astype(np.float32)


def node_features(draft: Step, depth: int, projection: np.ndarray) -> np.ndarray:
    """feat [F] float32 of a node from its SLM draft (see the module docstring)."""
    if draft.hidden is None:
        raise ValueError("the SLM draft carries no hidden state")
    proj = draft.hidden.astype(np.float32) @ projection
    stats = np.array([draft.logprobs.mean(), draft.logprobs.min(), draft.entropies.mean(),
                      depth, draft.ctx_tokens], np.float32)
    return np.concatenate([proj.astype(np.float32), stats])


def feature_names(feature_dim: int) -> list[str]:
    k = feature_dim - len(STATS_FEATURES)
    return [f"hidden_proj_{i}" for i in range(k)] + list(STATS_FEATURES)


@dataclasses.dataclass
class ProblemTree:
    problem: datasets_lib.Problem
    nodes: list[_Node]
    n_completion: int = 0
    n_fallback_other_branch: int = 0
    n_fallback_same_depth: int = 0
    max_prm_rescore_diff: float = 0.0


def _row_seed(seed: int, problem: int, node: int, role: int) -> int:
    h = hashlib.sha256(f"{seed}/{problem}/{node}/{role}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _expand(trees: list[ProblemTree], picks: list[tuple[int, _Node]], slm: StepGenerator,
            llm: StepGenerator, prm, st: Settings, projection: np.ndarray,
            stats: answers_lib.CheckStats) -> list[int]:
    """Expands one pending node per pick (batched); appends them; returns their node ids."""
    qs = [trees[t].problem.question for t, _ in picks]
    prev = [list(n.steps) for _, n in picks]
    ids = [len(trees[t].nodes) for t, _ in picks]
    pidx = [trees[t].problem.index for t, _ in picks]
    drafts = slm.generate(qs, prev, [_row_seed(st.seed, p, i, 0) for p, i in zip(pidx, ids)])
    llm_steps = llm.generate(qs, prev, [_row_seed(st.seed, p, i, 1) for p, i in zip(pidx, ids)])
    scores = prm.score(qs + qs, [s + [d.text] for s, d in zip(prev, drafts)]
                       + [s + [l.text] for s, l in zip(prev, llm_steps)])
    k = len(picks)
    context_limit = min(getattr(slm, "max_context", 1 << 30), getattr(llm, "max_context", 1 << 30))
    out = []
    for j, (t, node) in enumerate(picks):
        tree = trees[t]
        d = node.depth
        draft, lstep = drafts[j], llm_steps[j]
        sa, sb = scores[j], scores[k + j]
        node.prm = float(sa[d])
        if node.parent >= 0:
            # The same prefix was scored as the parent's candidate; keep one score (batched or
            # bf16 passes differ in the last bits) and record how far the rescoring was.
            parent_score = tree.nodes[node.parent].cand_prm[node.branch]
            tree.max_prm_rescore_diff = max(tree.max_prm_rescore_diff,
                                            abs(node.prm - parent_score))
            node.prm = parent_score
        node.cand_prm = (float(sa[d + 1]), float(sb[d + 1]))
        node.cand_tokens = (max(1, draft.n_tokens), max(1, lstep.n_tokens))
        node.ctx_tokens = max(1, draft.ctx_tokens)
        node.feat = node_features(draft, d, projection)
        node.texts = (draft.text, lstep.text)
        term, corr = [], []
        for cand in (draft, lstep):
            # "context full": the next step might not fit in a model's position range.
            full = max(g.ctx_tokens for g in (draft, lstep)) + cand.n_tokens \
                + st.max_step_tokens > context_limit
            is_term = (cand.eos or answers_lib.has_final_answer(cand.text)
                       or d + 1 >= st.max_steps or full)
            ok = False
            if is_term:
                ok = answers_lib.check_solution("".join(node.steps) + cand.text,
                                                tree.problem.answer, tree.problem.kind,
                                                st.check_timeout, stats)
            term.append(int(is_term))
            corr.append(int(ok))
        node.terminal, node.correct = tuple(term), tuple(corr)
        node.p_llm = behaviour_llm_prob(node.cand_prm[0], st)
        nid = len(tree.nodes)
        tree.nodes.append(node)
        if node.parent >= 0:
            tree.nodes[node.parent].child[node.branch] = nid
        out.append(nid)
    return out


def _children(node: _Node) -> list[_Node]:
    kids = []
    for c, p in ((0, 1.0 - node.p_llm), (1, node.p_llm)):
        if not node.terminal[c]:
            kids.append(_Node(depth=node.depth + 1, steps=node.steps + (node.texts[c],),
                              prob=node.prob * p, parent=-1, branch=c))
    return kids


def _needs_completion(tree: ProblemTree) -> int | None:
    """First node with an unexpanded non-terminal candidate, no expanded child and no node at
    the next depth (so no fallback exists), else None."""
    depths = {n.depth for n in tree.nodes}
    for i, n in enumerate(tree.nodes):
        open_ = [c for c in (0, 1) if not n.terminal[c] and n.child[c] < 0]
        if open_ and all(ch < 0 for ch in n.child) and (n.depth + 1) not in depths:
            return i
    return None


def _assign_fallbacks(tree: ProblemTree) -> None:
    best_at: dict[int, int] = {}
    for i, n in enumerate(tree.nodes):
        j = best_at.get(n.depth)
        if j is None or n.prob > tree.nodes[j].prob:
            best_at[n.depth] = i
    for n in tree.nodes:
        if not any(not n.terminal[c] and n.child[c] < 0 for c in (0, 1)):
            continue
        kids = [ch for ch in n.child if ch >= 0]
        if kids:
            n.fallback = kids[0]
            tree.n_fallback_other_branch += 1
        else:
            n.fallback = best_at[n.depth + 1]
            tree.n_fallback_same_depth += 1


def build_trees(problems: Sequence[datasets_lib.Problem], slm: StepGenerator, llm: StepGenerator,
                prm, st: Settings, projection: np.ndarray,
                stats: answers_lib.CheckStats | None = None) -> list[ProblemTree]:
    """Grows the step trees of a batch of problems (see the module docstring).

    Each round expands at most one node per problem, so a problem's tree does not depend on
    which other problems share its batch (up to the numerics of padded batched passes).
    """
    stats = stats if stats is not None else answers_lib.CheckStats()
    trees = [ProblemTree(p, []) for p in problems]
    queues: list[list] = []
    for _ in problems:
        root = _Node(depth=0, steps=(), prob=1.0, parent=-1, branch=-1)
        queues.append([((0, 0, 0.0), 0, root)])
    counters = [1] * len(problems)

    def key(n: _Node):
        if n.depth <= st.full_depth:
            return (0, n.depth, 0.0)
        return (1, 0, -n.prob)

    while True:
        picks = []
        for t, q in enumerate(queues):
            if q and len(trees[t].nodes) < st.node_budget:
                picks.append((t, heapq.heappop(q)[2]))
        if not picks:
            break
        new_ids = _expand(trees, picks, slm, llm, prm, st, projection, stats)
        for (t, _), nid in zip(picks, new_ids):
            for kid in _children(trees[t].nodes[nid]):
                kid.parent = nid
                heapq.heappush(queues[t], (key(kid), counters[t], kid))
                counters[t] += 1
    while True:  # completion nodes: only where a path would otherwise have no next node
        picks = []
        for t, tree in enumerate(trees):
            i = _needs_completion(tree)
            if i is None:
                continue
            n = tree.nodes[i]
            open_ = [c for c in (0, 1) if not n.terminal[c]]
            c = max(open_, key=lambda c: (n.p_llm if c == 1 else 1.0 - n.p_llm, -c))
            p = n.p_llm if c == 1 else 1.0 - n.p_llm
            kid = _Node(depth=n.depth + 1, steps=n.steps + (n.texts[c],), prob=n.prob * p,
                        parent=i, branch=c, completion=True)
            picks.append((t, kid))
            tree.n_completion += 1
        if not picks:
            break
        _expand(trees, picks, slm, llm, prm, st, projection, stats)
    for tree in trees:
        _assign_fallbacks(tree)
    return trees
