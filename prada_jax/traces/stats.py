"""Summary statistics of a trace set: accuracies of fixed walks, PRM and feature informativeness.

Definitions (used by ``python -m prada_jax.traces stats``, the demo and the evals):

* A *walk* starts at each problem's root and at every node takes a candidate from its policy
  (``slm``: always 0, ``llm``: always 1, ``random``: 0/1 with probability 1/2 from a seeded
  ``np.random.default_rng``); a non-terminal candidate whose child was not expanded continues at
  ``fallback`` (counted as a fallback step). Accuracy = mean ``correct`` of the terminal
  candidate reached; ``fallback_*`` = fallback steps / all steps of that walk.
* ``V(n, c)`` = correctness reached by taking candidate ``c`` at node ``n`` and then always the
  SLM draft (candidate 0), following fallbacks.
* ``prm_delta_auc``: AUC of the PRM step delta ``cand_prm[n, c] - prm[n]`` against ``V(n, c)``,
  over every candidate of every node (does the PRM's step gain predict final correctness?).
  ``prm_final_auc``: AUC of ``cand_prm`` of terminal candidates against ``correct``.
* ``probe_auc``: a logistic probe (L2-regularised, Newton's method, standardised features)
  trained on the nodes of even-numbered problems and scored on odd-numbered ones, predicting
  "the LLM step is worth it": ``V(n, 1) > V(n, 0)``. ``probe_pos_rate`` is that label's rate.

AUC is the Mann–Whitney statistic with ties counted one half.
"""
from __future__ import annotations

import numpy as np

from prada_jax.traces.format import TraceSet, stand_in_roles


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` [M] for binary ``labels`` [M] (nan if one class)."""
    scores = np.asarray(scores, np.float64).ravel()
    labels = np.asarray(labels).astype(bool).ravel()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(s.size)
    # average ranks over ties (1-based)
    starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    ends = np.concatenate([starts[1:], [s.size]])
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def walk(traces: TraceSet, policy: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Walks every problem's tree with a fixed policy (vectorised over problems).

    Args:
      traces: a trace set (NumPy arrays).
      policy: ``slm`` (always candidate 0), ``llm`` (always 1) or ``random`` (fair coin).
      seed: seed of the random policy.

    Returns:
      dict of [P] arrays: ``correct`` (0/1), ``steps`` (steps taken), ``fallback_steps``,
      ``tokens`` (prompt + generated tokens of the path), ``llm_steps``.
    """
    if policy not in ("slm", "llm", "random"):
        raise ValueError(f"policy must be slm, llm or random, got {policy!r}")
    rng = np.random.default_rng(seed)
    term_all = np.asarray(traces.terminal).astype(bool)
    child = np.asarray(traces.child)
    fallback = np.asarray(traces.fallback)
    cand_tokens = np.asarray(traces.cand_tokens)
    correct_all = np.asarray(traces.correct)
    node = np.asarray(traces.root).astype(np.int64)
    p = node.size
    done = np.zeros(p, bool)
    out = {k: np.zeros(p, np.int64) for k in ("correct", "steps", "fallback_steps", "llm_steps")}
    tokens = np.asarray(traces.ctx_tokens)[node].astype(np.int64)
    for _ in range(int(np.max(traces.depth)) + 2):
        if done.all():
            break
        if policy == "random":
            a = rng.integers(0, 2, size=p)
        else:
            a = np.full(p, 1 if policy == "llm" else 0)
        live = ~done
        out["steps"] += live
        out["llm_steps"] += live & (a == 1)
        tokens += np.where(live, cand_tokens[node, a], 0)
        term = term_all[node, a] & live
        out["correct"] = np.where(term, correct_all[node, a], out["correct"])
        nxt = child[node, a]
        use_fb = live & ~term & (nxt < 0)
        out["fallback_steps"] += use_fb
        nxt = np.where(nxt < 0, fallback[node], nxt)
        done = done | term
        node = np.where(done, node, nxt)
    if not done.all():
        raise ValueError("a walk did not end within max depth + 1 steps (invalid trace set)")
    out["tokens"] = tokens
    return out


def continuation_value(traces: TraceSet) -> np.ndarray:
    """``V`` [N, 2]: correctness after taking candidate c at node n, then always candidate 0."""
    term = np.asarray(traces.terminal).astype(bool)
    correct = np.asarray(traces.correct).astype(np.int64)
    child = np.asarray(traces.child)
    nxt = np.where(child >= 0, child, np.asarray(traces.fallback)[:, None])
    depth = np.asarray(traces.depth)
    val0 = np.zeros(depth.size, np.int64)   # value of always-0 from node n
    out = np.zeros(term.shape, np.int64)
    for k in range(int(depth.max()), -1, -1):
        idx = np.flatnonzero(depth == k)
        for c in (0, 1):
            t = term[idx, c]
            out[idx, c] = np.where(t, correct[idx, c], val0[np.maximum(nxt[idx, c], 0)])
        val0[idx] = out[idx, 0]
    return out


def _logistic_probe(x_tr, y_tr, x_te, l2: float = 1.0, iters: int = 25) -> np.ndarray:
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-8
    a = np.concatenate([(x_tr - mu) / sd, np.ones((x_tr.shape[0], 1))], axis=1)
    b = np.concatenate([(x_te - mu) / sd, np.ones((x_te.shape[0], 1))], axis=1)
    w = np.zeros(a.shape[1])
    reg = l2 * np.eye(a.shape[1])
    reg[-1, -1] = 0.0
    y = y_tr.astype(np.float64)
    # einsum (no BLAS threads): multithreaded BLAS thrashes on small, busy CPUs.
    for _ in range(iters):
        pr = 1.0 / (1.0 + np.exp(-np.einsum("ni,i->n", a, w)))
        grad = np.einsum("ni,n->i", a, pr - y) + reg @ w
        hess = np.einsum("ni,nj->ij", a * (pr * (1 - pr))[:, None], a) + reg
        step = np.linalg.solve(hess, grad)
        w = w - step
        if np.max(np.abs(step)) < 1e-6:
            break
    return np.einsum("ni,i->n", b, w)


def trace_stats(traces: TraceSet, meta: dict | None = None, seed: int = 0) -> dict:
    """Summary statistics of a trace set (see the module docstring for the definitions).

    Args:
      traces: a trace set. meta: its ``meta.json`` dict (for the benchmark name and the
        synthetic label), optional. seed: seed of the random walk.

    Returns:
      a flat dict of Python scalars: ``benchmark``, ``synthetic``, ``stand_in`` (``{role:
      note}`` of the roles filled by a stand-in, ``format.stand_in_roles``), ``problems``,
      ``nodes``,
      ``nodes_per_problem``, ``steps_mean``/``steps_min``/``steps_max`` (all-SLM path),
      ``prompt_tokens``, ``slm_step_tokens``, ``llm_step_tokens`` (means over nodes),
      ``path_tokens_slm`` (mean prompt + generated tokens of the all-SLM path), ``acc_slm``,
      ``acc_llm``, ``acc_random`` (fractions), ``fallback_slm``/``_llm``/``_random`` (fractions
      of steps), ``prm_delta_auc``, ``prm_final_auc``, ``probe_auc``, ``probe_pos_rate``.
    """
    meta = meta or {}
    w = {pol: walk(traces, pol, seed) for pol in ("slm", "llm", "random")}
    term = np.asarray(traces.terminal).astype(bool)
    prm, cand_prm = np.asarray(traces.prm), np.asarray(traces.cand_prm)
    v = continuation_value(traces)
    delta = cand_prm - prm[:, None]
    problem = np.asarray(traces.problem)
    label = v[:, 1] > v[:, 0]
    tr, te = problem % 2 == 0, problem % 2 == 1
    feat = np.asarray(traces.feat, np.float64)
    if tr.any() and te.any() and 0 < label[tr].sum() < tr.sum() and 0 < label[te].sum() < te.sum():
        probe = auc(_logistic_probe(feat[tr], label[tr], feat[te]), label[te])
    else:
        probe = float("nan")
    root = np.asarray(traces.root)
    st = {
        "benchmark": str(meta.get("benchmark", "?")),
        "synthetic": bool(meta.get("synthetic", False)),
        "stand_in": stand_in_roles(meta),
        "problems": traces.num_problems,
        "nodes": traces.num_nodes,
        "nodes_per_problem": traces.num_nodes / traces.num_problems,
        "steps_mean": float(w["slm"]["steps"].mean()),
        "steps_min": int(w["slm"]["steps"].min()),
        "steps_max": int(w["slm"]["steps"].max()),
        "prompt_tokens": float(np.asarray(traces.ctx_tokens)[root].mean()),
        "slm_step_tokens": float(np.asarray(traces.cand_tokens)[:, 0].mean()),
        "llm_step_tokens": float(np.asarray(traces.cand_tokens)[:, 1].mean()),
        "path_tokens_slm": float(w["slm"]["tokens"].mean()),
        "acc_slm": float(w["slm"]["correct"].mean()),
        "acc_llm": float(w["llm"]["correct"].mean()),
        "acc_random": float(w["random"]["correct"].mean()),
    }
    for pol in ("slm", "llm", "random"):
        st[f"fallback_{pol}"] = float(w[pol]["fallback_steps"].sum() / w[pol]["steps"].sum())
    st.update(
        prm_delta_auc=auc(delta.ravel(), v.ravel()),
        prm_final_auc=auc(cand_prm[term], np.asarray(traces.correct)[term]),
        probe_auc=probe,
        probe_pos_rate=float(label.mean()),
    )
    return st


_ROWS = (
    ("problems", "problems", "{:d}"),
    ("nodes", "nodes", "{:d}"),
    ("nodes_per_problem", "nodes / problem", "{:.1f}"),
    ("steps_mean", "steps (all-SLM, mean)", "{:.2f}"),
    ("steps_range", "steps (min-max)", "{}"),
    ("prompt_tokens", "prompt tokens (mean)", "{:.0f}"),
    ("slm_step_tokens", "SLM step tokens (mean)", "{:.1f}"),
    ("llm_step_tokens", "LLM step tokens (mean)", "{:.1f}"),
    ("path_tokens_slm", "all-SLM path tokens (mean)", "{:.0f}"),
    ("acc_slm", "accuracy all-SLM (%)", "pct"),
    ("acc_llm", "accuracy all-LLM (%)", "pct"),
    ("acc_random", "accuracy random (%)", "pct"),
    ("fallback_slm", "fallback share all-SLM (%)", "pct"),
    ("fallback_llm", "fallback share all-LLM (%)", "pct"),
    ("fallback_random", "fallback share random (%)", "pct"),
    ("prm_delta_auc", "PRM step-delta AUC", "{:.3f}"),
    ("prm_final_auc", "PRM final AUC", "{:.3f}"),
    ("probe_auc", "feature probe AUC (LLM worth it)", "{:.3f}"),
    ("probe_pos_rate", "LLM-worth-it rate (%)", "pct"),
)


#: The role each row's numbers come from, where one role's model alone makes them: marked
#: ``†`` when the trace set's model in that role is a stand-in (``format.stand_in_roles``).
_ROW_ROLE = {"llm_step_tokens": "llm", "acc_llm": "llm", "fallback_llm": "llm",
             "prm_delta_auc": "prm", "prm_final_auc": "prm"}


def summary_table(stats: list[dict]) -> str:
    """A plain-text table, one column per trace set (as returned by ``trace_stats``); a value
    that rests on a stand-in model (the All-LLM rows on a stand-in LLM, the PRM rows on a
    stand-in PRM) is marked ``†``, with a footnote naming the roles."""
    if not stats:
        return "(no trace sets)"
    cols = []
    for s in stats:
        name = s.get("benchmark", "?") + (" [synthetic]" if s.get("synthetic") else "")
        stand_in = s.get("stand_in") or {}
        vals = []
        for key, _, fmt in _ROWS:
            if key == "steps_range":
                vals.append(f"{s['steps_min']}-{s['steps_max']}")
            elif fmt == "pct":
                vals.append(f"{100 * s[key]:.1f}")
            else:
                vals.append(fmt.format(s[key]))
            if _ROW_ROLE.get(key) in stand_in:
                vals[-1] += " †"
        cols.append([name] + vals)
    labels = ["metric"] + [label for _, label, _ in _ROWS]
    lw = max(len(x) for x in labels)
    widths = [max(len(x) for x in c) for c in cols]
    lines = []
    for i, lab in enumerate(labels):
        cells = "  ".join(c[i].rjust(wd) for c, wd in zip(cols, widths))
        lines.append(f"{lab.ljust(lw)}  {cells}")
        if i == 0:
            lines.append("-" * len(lines[0]))
    for s in stats:
        for role, note in (s.get("stand_in") or {}).items():
            lines.append(f"† {s.get('benchmark', '?')}: the {role.upper()} role is a {note}")
    return "\n".join(lines)
