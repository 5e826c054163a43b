"""What the server LLM alone generates from each node of a trace set (``LLMPath``): the LLM's
branch to the end of the solution. The serving server's LLM-alone jobs decode it in one
resident sequence; its longest sequence bounds the server's M (``envs.server_memory``)."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import struct

from prada_jax.traces.format import TraceSet


@struct.dataclass
class LLMPath:
    """What the LLM alone generates from each node to the end of the solution, following the
    LLM's branch (candidate 1) and the fallback where a child is missing ([N] each): ``tokens``
    (all the steps' tokens), ``steps``, ``correct`` (bool), ``fallbacks`` (missing children
    taken), ``last_tokens`` (the final step's tokens)."""

    tokens: Any
    steps: Any
    correct: Any
    fallbacks: Any
    last_tokens: Any


def llm_path(traces: TraceSet) -> LLMPath:
    """``LLMPath`` of a trace set (host-side NumPy, vectorised over nodes). Raises
    ``ValueError`` if the LLM's branch from some node never ends (a cycle)."""
    child = np.asarray(traces.child)
    term = np.asarray(traces.terminal).astype(bool)
    corr = np.asarray(traces.correct).astype(bool)
    tok = np.asarray(traces.cand_tokens).astype(np.int64)
    fb = np.asarray(traces.fallback)
    n = child.shape[0]
    cur = np.arange(n)
    alive = np.ones(n, bool)
    tokens = np.zeros(n, np.int64)
    steps = np.zeros(n, np.int64)
    fbs = np.zeros(n, np.int64)
    correct = np.zeros(n, bool)
    last = np.zeros(n, np.int64)
    for _ in range(n + 1):
        if not alive.any():
            break
        t1 = term[cur, 1]
        tokens += np.where(alive, tok[cur, 1], 0)
        steps += alive
        ended = alive & t1
        correct = np.where(ended, corr[cur, 1], correct)
        last = np.where(ended, tok[cur, 1], last)
        ch = child[cur, 1]
        nxt = np.where(ch >= 0, ch, fb[cur])
        fbs += alive & ~t1 & (ch < 0)
        alive = alive & ~t1
        cur = np.where(alive, nxt, cur)
    if alive.any():
        raise ValueError("traces: the LLM's branch from some node never reaches a terminal step")
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return LLMPath(tokens=i32(tokens), steps=i32(steps), correct=jnp.asarray(correct),
                   fallbacks=i32(fbs), last_tokens=i32(last))

