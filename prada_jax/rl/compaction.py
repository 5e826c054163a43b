"""Compacts a rollout's decision samples into a fixed-size buffer for PPO's decision-only
update."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["decision_capacity", "compact_decisions"]


def decision_capacity(num_samples: int, fraction: float, num_minibatches: int) -> int:
    """K = ⌈fraction · num_samples⌉ rounded up to a multiple of ``num_minibatches`` (and at most
    ``num_samples`` rounded the same way): the size of the compacted decision buffer."""
    k = max(1, math.ceil(float(fraction) * int(num_samples)))
    k = min(k, int(num_samples))
    return int(math.ceil(k / num_minibatches) * num_minibatches)


def compact_decisions(flat: dict, capacity: int, key: jax.Array) -> tuple[dict, jax.Array]:
    """Gathers the decision samples of ``flat`` into fixed-size buffers of ``capacity``.

    Args:
      flat: dict of [N, ...] arrays with a bool ``decision`` [N] entry.
      capacity: K, buffer size.
      key: PRNG key; when there are more than K decisions (overflow), the K kept are the
        first K in sample order starting from a uniformly random sample (cyclically),
        otherwise all are kept.

    Returns:
      ``(compact, dropped)``: dict of [K, ...] arrays whose ``decision`` is the validity mask
      (the first ``min(n_dec, K)`` entries; padding repeats sample 0 with mask False), and the
      int32 number of decisions that did not fit.
    """
    dec = flat["decision"].astype(bool)
    n = dec.shape[0]
    # Start the scan at a random sample (cyclically): with more than K decisions, the K kept
    # are a contiguous run from a random start, so no part of the rollout is always dropped.
    # (A full random permutation costs more than the rest of the compaction.)
    shift = jax.random.randint(key, (), 0, n)
    (pos,) = jnp.nonzero(jnp.roll(dec, -shift), size=capacity, fill_value=0)
    idx = (pos + shift) % n
    n_dec = jnp.sum(dec.astype(jnp.int32))
    valid = jnp.arange(capacity) < n_dec
    out = {k: jnp.take(v, idx, axis=0) for k, v in flat.items() if k != "decision"}
    out["decision"] = valid
    return out, jnp.maximum(n_dec - capacity, 0)
