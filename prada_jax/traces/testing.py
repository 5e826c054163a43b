"""Tiny random trace sets for tests: valid by construction, no calibration (not synthetic data).

Used by unit tests of the env, learner and schedulers where the content of the traces does not
matter, only their structure. For benchmark-like data use ``prada_jax.traces.synthetic``.
"""
from __future__ import annotations

import numpy as np

from prada_jax.traces.format import TraceSet


def random_traces(seed: int = 0, problems: int = 4, depth: int = 3, feature_dim: int = 8,
                  p_terminal: float = 0.2, p_expand: float = 0.8) -> TraceSet:
    """A random forest: each node has two candidates; a candidate is terminal with probability
    ``p_terminal`` (always at ``depth - 1``), else expanded with probability ``p_expand``; an
    unexpanded non-terminal candidate falls back to its sibling's child (or a fresh node).

    Returns a ``TraceSet`` that passes ``validate_arrays``. Depth of any path <= ``depth``.
    """
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("feat", "prm", "cand_prm", "cand_tokens", "ctx_tokens",
                                             "child", "terminal", "correct", "fallback", "depth",
                                             "problem")}
    roots, n_nodes = [], []

    def new_node(p, d, prm, ctx):
        i = len(cols["prm"])
        cols["feat"].append(rng.normal(size=feature_dim).astype(np.float32))
        cols["prm"].append(np.float32(prm))
        cols["cand_prm"].append(rng.uniform(0, 1, size=2).astype(np.float32))
        cols["cand_tokens"].append(rng.integers(5, 80, size=2).astype(np.int32))
        cols["ctx_tokens"].append(np.int32(ctx))
        cols["child"].append(np.array([-1, -1], np.int32))
        cols["terminal"].append(np.zeros(2, np.uint8))
        cols["correct"].append(np.zeros(2, np.uint8))
        cols["fallback"].append(np.int32(-1))
        cols["depth"].append(np.int32(d))
        cols["problem"].append(np.int32(p))
        return i

    for p in range(problems):
        start = len(cols["prm"])
        roots.append(start)
        frontier = [new_node(p, 0, rng.uniform(0.3, 0.7), int(rng.integers(40, 200)))]
        while frontier:
            nxt = []
            for i in frontier:
                d = int(cols["depth"][i])
                for c in (0, 1):
                    last = d == depth - 1
                    if last or rng.uniform() < p_terminal:
                        cols["terminal"][i][c] = 1
                        cols["correct"][i][c] = np.uint8(rng.uniform() < cols["cand_prm"][i][c])
                    elif rng.uniform() < p_expand:
                        j = new_node(p, d + 1, cols["cand_prm"][i][c],
                                     cols["ctx_tokens"][i] + cols["cand_tokens"][i][c])
                        cols["child"][i][c] = j
                        nxt.append(j)
                needs_fb = [(cols["terminal"][i][c] == 0 and cols["child"][i][c] < 0) for c in (0, 1)]
                if any(needs_fb):
                    kids = [int(k) for k in cols["child"][i] if k >= 0]
                    if kids:
                        cols["fallback"][i] = np.int32(kids[0])
                    else:
                        j = new_node(p, d + 1, cols["prm"][i], cols["ctx_tokens"][i] + 10)
                        cols["fallback"][i] = np.int32(j)
                        nxt.append(j)
            frontier = nxt
        n_nodes.append(len(cols["prm"]) - start)

    arrays = {k: np.stack(v) for k, v in cols.items()}
    return TraceSet(**arrays, root=np.asarray(roots, np.int32), n_nodes=np.asarray(n_nodes, np.int32),
                    answer_id=np.arange(problems, dtype=np.int32))


def random_meta(traces: TraceSet, benchmark: str = "random") -> dict:
    """Meta for a random test trace set (``validate_arrays`` accepts it)."""
    return {"benchmark": benchmark, "synthetic": True, "models": {"slm": "none", "llm": "none",
            "prm": "none"}, "feature_dim": traces.feature_dim,
            "counts": {"problems": traces.num_problems, "nodes": traces.num_nodes},
            "max_depth": int(np.max(traces.depth)), "generator": {"kind": "random_test"}}
