"""The serving server's prefix cache as pure jnp functions over the [U] user slots.

What vLLM (V1: automatic prefix caching, on by default) and SGLang (RadixAttention, on by
default) do, at the env's slot granularity (docs/latency.md "The prefix cache"):

* **What is cached.** Each user slot owns at most two server-side prefixes: the LLM's KV of
  the user's context as the server last saw it (``server_cached``: the context of its last
  offload + the step the LLM generated for it) and the online PRM's KV of the last prefix it
  scored (``prm_cached``, the RSD baseline). A request reuses ``min(cached, context)`` tokens
  (the context grows along the user's path, so the cached tokens are a prefix of it) and the
  server prefills only the rest; the upload still carries the whole context (a stateless
  API). Prefixes are per user: two users of the same problem do not share their question's
  KV (a conservative simplification; RadixAttention would share it).
* **The KV budget.** The server's KV memory (memory − the LLM's weights − the PRM's, both
  resident on the serving server) in LLM-KV tokens (``kv_budget_tokens``); a PRM token costs
  ``prm_kv_ratio`` of them. At the end of every slot the running sequences (``pinned``: each
  sequence's KV, ``job.ctx`` tokens, never evicted) plus the cached prefixes fit in it: if they
  do not, whole cached prefixes are evicted **least recently used first** (the slot a user's
  prefix was last used: a server job of the user ran; ties by user slot) until they do. A
  running sequence's own LLM prefix is part of its KV (counted once, as pinned). An evicted
  prefix is prefilled again at its user's next offload (charged by the request: the cache
  then holds 0 of its tokens). A user that finishes frees its prefixes.
* ``make_params`` checks that M sequences of the longest length fit the budget, so the pinned
  part alone never exceeds it and the invariant ``Σ pinned + Σ cached ≤ budget`` holds after
  every slot (a test checks it against the NumPy reference, ``envs.edge_numpy``).
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from prada_jax import latency as lat


def kv_budget_tokens(lp: lat.LatencyParams) -> float:
    """The serving server's KV budget in LLM-KV tokens (host-side): ``floor((mem − LLM
    weights − PRM weights) / KV bytes of one LLM token)``; ``inf`` under the ``paper`` clock
    (no memory model). The same memory ``latency.max_sequences(with_prm=True)`` divides."""
    if not lp.roofline:
        return math.inf
    hw = lp.server_hw
    free = (float(hw.mem_bytes) - float(lat.model_weight_bytes(lp.llm, hw))
            - float(lat.model_weight_bytes(lp.prm, hw)))
    return float(max(math.floor(free / float(lat.kv_bytes_per_token(lp.llm, hw))), 0))


def prm_kv_ratio(lp: lat.LatencyParams) -> float:
    """KV bytes of one PRM token over one LLM token (host-side; 1 when the PRM has the LLM's
    shape, as the default Qwen2.5-Math-PRM-7B does)."""
    if not lp.roofline:
        return 1.0
    hw = lp.server_hw
    return float(lat.kv_bytes_per_token(lp.prm, hw)) / float(lat.kv_bytes_per_token(lp.llm, hw))


def evict_lru(llm_cached, prm_cached, holds, running_ctx, last_used, budget_tokens, ratio):
    """Evicts least-recently-used prefixes until the running sequences and the cache fit.

    Args:
      llm_cached, prm_cached: [U] int32, tokens of each user's cached LLM / PRM prefix (0 where
        none; the caller zeroes finished users and disabled caches).
      holds: [U] bool, the user's job holds a running sequence (its LLM prefix is pinned).
      running_ctx: [U] float32, tokens in that sequence's KV (read where ``holds``).
      last_used: [U] int32, the slot each user's prefixes were last used (LRU order).
      budget_tokens: float32 scalar, the KV budget in LLM-KV tokens (``inf``: never evicts).
      ratio: float32 scalar, ``prm_kv_ratio``.

    Returns:
      ``(llm_cached, prm_cached, stats)``; ``stats``: ``evicted_tokens`` (tokens of the
      evicted prefixes, LLM + PRM), ``kv_in_use_tokens`` (pinned + cached after eviction, in
      LLM-KV tokens), ``kv_pinned_tokens``.
    """
    u = llm_cached.shape[0]
    llm_f = jnp.where(holds, 0.0, llm_cached.astype(jnp.float32))
    prm_f = prm_cached.astype(jnp.float32) * ratio
    own = llm_f + prm_f                                   # evictable tokens of each user
    pinned = jnp.sum(jnp.where(holds, running_ctx, 0.0))
    need = pinned + jnp.sum(own) - budget_tokens
    idx = jnp.arange(u, dtype=jnp.int32)
    key = jnp.where(own > 0, last_used, jnp.iinfo(jnp.int32).max)
    order = jnp.lexsort((idx, key))                       # oldest first, ties by user slot
    own_sorted = own[order]
    before = jnp.cumsum(own_sorted) - own_sorted
    evict_sorted = (own_sorted > 0) & (before < need)
    evict = jnp.zeros((u,), bool).at[order].set(evict_sorted)
    drop_llm = evict & ~holds
    evicted = (jnp.sum(jnp.where(drop_llm, llm_cached, 0))
               + jnp.sum(jnp.where(evict, prm_cached, 0))).astype(jnp.float32)
    stats = dict(evicted_tokens=evicted,
                 kv_in_use_tokens=pinned + jnp.sum(jnp.where(evict, 0.0, own)),
                 kv_pinned_tokens=pinned)
    return (jnp.where(drop_llm, 0, llm_cached), jnp.where(evict, 0, prm_cached), stats)
