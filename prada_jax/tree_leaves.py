"""Leaf-wise pytree helpers a checkpoint needs: typed PRNG keys as raw key data (and back), the
first non-finite float leaf."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["is_typed_key", "first_non_finite", "keys_to_data", "data_to_keys"]


def is_typed_key(x: Any) -> bool:
    """True if ``x`` (an array or a ``jax.ShapeDtypeStruct``) holds typed PRNG keys."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _finite_flags(leaves):
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


_finite_flags_jit = jax.jit(_finite_flags)


def first_non_finite(tree: Any) -> str | None:
    """Key path of the first float leaf of ``tree`` holding a NaN/inf, or None if all finite.

    Integer, boolean and PRNG-key leaves are skipped. ``jax.Array`` leaves are reduced on
    their devices in one jitted call (sharded or multi-host arrays included; only one bool
    per leaf comes to the host); NumPy leaves on the host.
    """
    dev, host = [], []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dtype = getattr(x, "dtype", None)
        if dtype is None or is_typed_key(x) or not jax.dtypes.issubdtype(dtype, np.inexact):
            continue
        (dev if isinstance(x, jax.Array) else host).append((path, x))
    bad = [p for p, x in host if not bool(np.all(np.isfinite(np.asarray(x))))]
    if dev:
        flags = np.asarray(_finite_flags_jit([x for _, x in dev]))
        bad += [p for (p, _), ok in zip(dev, flags) if not ok]
    if not bad:
        return None
    return jax.tree_util.keystr(bad[0]) or "<root>"


def keys_to_data(tree: Any) -> Any:
    """Replaces every typed PRNG key leaf of ``tree`` by its raw ``key_data`` (uint32 [..., 2]).

    Works on concrete arrays and, under ``jax.eval_shape``, on abstract ones.
    """
    return jax.tree.map(lambda x: jax.random.key_data(x) if is_typed_key(x) else x, tree)


def data_to_keys(data_tree: Any, template: Any) -> Any:
    """Inverse of ``keys_to_data``: re-wraps raw key data where ``template`` has typed keys.

    Args:
      data_tree: pytree as returned by ``keys_to_data`` (or restored from disk).
      template: pytree of the same structure whose typed-key leaves give the key impl.
    """
    def _wrap(d, t):
        if not is_typed_key(t):
            return d
        # Concrete keys report their impl; abstract ones (ShapeDtypeStruct) carry it in dtype.
        impl = t.dtype._impl if isinstance(t, jax.ShapeDtypeStruct) else jax.random.key_impl(t)
        return jax.random.wrap_key_data(d, impl=impl)
    return jax.tree.map(_wrap, data_tree, template)
