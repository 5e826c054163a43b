"""Crafted trace sets with known answers for the evals' tests (not benchmark data).

``crafted_traces``: one step per problem; the LLM's step is always right, the SLM's draft is
right on even problems only; feature 0 says which (+1: the draft is wrong); the PRM scores a
right draft 0.9 and a wrong one 0.1. ``oracle_apply`` is a screening "policy" that nominates
exactly the wrong drafts and carries ΔQ = feature 0.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from prada_jax.traces.format import TraceSet, validate_arrays


def crafted_traces(problems: int = 8, feature_dim: int = 4) -> TraceSet:
    """See the module docstring. Returns a validated ``TraceSet`` of ``problems`` nodes."""
    p = problems
    slm_right = (np.arange(p) % 2 == 0)
    feat = np.zeros((p, feature_dim), np.float32)
    feat[:, 0] = np.where(slm_right, -1.0, 1.0)
    arrays = dict(
        feat=feat, prm=np.full(p, 0.5, np.float32),
        cand_prm=np.stack([np.where(slm_right, 0.9, 0.1), np.full(p, 0.95)], 1).astype(np.float32),
        cand_tokens=np.full((p, 2), 20, np.int32), ctx_tokens=np.full(p, 60, np.int32),
        child=np.full((p, 2), -1, np.int32), terminal=np.ones((p, 2), np.uint8),
        correct=np.stack([slm_right, np.ones(p, bool)], 1).astype(np.uint8),
        fallback=np.full(p, -1, np.int32), depth=np.zeros(p, np.int32),
        problem=np.arange(p, dtype=np.int32), root=np.arange(p, dtype=np.int32),
        n_nodes=np.ones(p, np.int32), answer_id=np.arange(p, dtype=np.int32))
    meta = {"feature_dim": feature_dim, "counts": {"nodes": p, "problems": p}, "max_depth": 0}
    validate_arrays(arrays, meta, "crafted")
    return TraceSet(**arrays)


def oracle_apply(params, obs):
    """Nominates exactly when feature 0 says the draft is wrong; ΔQ = that feature."""
    del params
    f = obs[..., 0]
    logits = jnp.stack([-f, f], -1)
    q = jnp.stack([jnp.zeros_like(f), f], -1)
    return logits, q
