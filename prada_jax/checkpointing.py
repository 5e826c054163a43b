"""Thin orbax ``CheckpointManager`` wrapper: save a whole pytree every N steps, keep K, restore.

Used by every launcher (PPO, dual ascent, distillation). A checkpoint holds two items:

* ``state``: any pytree of arrays (a learner state with params, optimiser state, env state,
  keys, counters). New-style typed PRNG keys (``jax.random.key``) cannot be written by orbax
  directly, so every typed-key leaf is stored as ``jax.random.key_data(key)`` (uint32) and
  re-wrapped with the template's key implementation on restore: resumption is bit-exact.
* ``meta``: an optional JSON-serialisable dict (host-side counters, the config, notes).

Layout: ``<directory>/<step>/{state,meta}``; a save interrupted by SIGKILL leaves a
``<step>.orbax-checkpoint-tmp`` folder that is ignored (and cleaned up) on the next start, so
``restore`` always returns the last *complete* step.

Example::

    ckpt = Checkpointer(workdir / "checkpoints", save_every=10, max_to_keep=3)
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(template_state)      # template: same structure/shapes
    ...
    ckpt.save(step, state, meta={"env_steps": 123})      # saved iff step % save_every == 0
    ckpt.close()
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

__all__ = ["Checkpointer", "keys_to_data", "data_to_keys"]


def _is_typed_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def keys_to_data(tree: Any) -> Any:
    """Replaces every typed PRNG key leaf of ``tree`` by its raw ``key_data`` (uint32 [..., 2]).

    Works on concrete arrays and, under ``jax.eval_shape``, on abstract ones.
    """
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, tree)


def data_to_keys(data_tree: Any, template: Any) -> Any:
    """Inverse of ``keys_to_data``: re-wraps raw key data where ``template`` has typed keys.

    Args:
      data_tree: pytree as returned by ``keys_to_data`` (or restored from disk).
      template: pytree of the same structure whose typed-key leaves give the key impl.
    """
    def _wrap(d, t):
        if not _is_typed_key(t):
            return d
        # Concrete keys report their impl; abstract ones (ShapeDtypeStruct) carry it in dtype.
        impl = t.dtype._impl if isinstance(t, jax.ShapeDtypeStruct) else jax.random.key_impl(t)
        return jax.random.wrap_key_data(d, impl=impl)
    return jax.tree.map(_wrap, data_tree, template)


class Checkpointer:
    """Saves a pytree every ``save_every`` steps into ``directory``, keeping the newest
    ``max_to_keep``; restores the latest (or a given) step exactly.

    Args:
      directory: checkpoint folder (created if missing). Use ``<workdir>/checkpoints``.
      save_every: ``save(step, ...)`` writes only when ``step % save_every == 0`` (or
        ``force=True``). Steps are whatever the caller counts (updates, chunks, opt steps).
      max_to_keep: number of newest checkpoints kept on disk (older ones are deleted).
      async_save: let orbax write in a background thread (``wait()`` blocks until done).
        Off by default: the states here are small and synchronous saves make "the last
        checkpoint on disk is the last one saved" trivially true.
    """

    def __init__(self, directory: os.PathLike | str, *, save_every: int = 1,
                 max_to_keep: int = 3, async_save: bool = False):
        if int(save_every) < 1:
            raise ValueError(f"Checkpointer: save_every must be >= 1, got {save_every}")
        if int(max_to_keep) < 1:
            raise ValueError(f"Checkpointer: max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.save_every = int(save_every)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=int(max_to_keep), create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=bool(async_save))
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "meta"))

    # ------------------------------------------------------------------ queries
    def latest_step(self) -> int | None:
        """The newest complete step on disk, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All complete steps on disk, ascending."""
        return sorted(self._manager.all_steps())

    # ------------------------------------------------------------------ save / restore
    def should_save(self, step: int) -> bool:
        return int(step) % self.save_every == 0

    def save(self, step: int, state: Any, *, meta: dict | None = None,
             force: bool = False) -> bool:
        """Saves ``state`` (and JSON ``meta``) as ``step`` if due (or ``force``).

        Returns True iff a checkpoint was written. Saving a step that already exists is a
        no-op returning False (e.g. the final forced save right after a periodic one).
        """
        step = int(step)
        if not (force or self.should_save(step)):
            return False
        if step in self._manager.all_steps():
            return False
        # jax.Arrays go to orbax as they are: each process writes its own shards (multi-host).
        data = keys_to_data(state)
        args = ocp.args.Composite(state=ocp.args.StandardSave(data),
                                  meta=ocp.args.JsonSave(dict(meta or {})))
        saved = self._manager.save(step, args=args, force=True)
        if not self._manager._options.enable_async_checkpointing:  # noqa: SLF001
            self._manager.wait_until_finished()
        return bool(saved)

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores ``(state, meta)`` at ``step`` (default: latest).

        Args:
          template: a pytree with the structure, shapes and dtypes of the saved state
            (concrete arrays or ``jax.ShapeDtypeStruct``s; typed keys allowed), e.g. a freshly
            initialised learner state.
          step: which step; None = latest.

        Raises:
          FileNotFoundError: no checkpoint (or not that step) in the directory.
          ValueError: the saved tree does not match the template (names the directory).
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        step = int(step)
        if step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} "
                                    f"(have {self.all_steps()})")
        abstract = jax.eval_shape(keys_to_data, template)

        def _target(a, t):
            # Restore onto the template's sharding where it has one (a sharded learner state on
            # a mesh, possibly of another device count than the one that saved it).
            # Leaves without one (NumPy, typed keys) go to the first local device, whatever
            # topology saved them.
            sharding = getattr(t, "sharding", None)
            if not (isinstance(t, jax.Array) and not _is_typed_key(t) and sharding is not None
                    and tuple(t.shape) == tuple(a.shape)):
                sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)

        abstract = jax.tree.map(_target, abstract, template)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                  meta=ocp.args.JsonRestore())
        try:
            restored = self._manager.restore(step, args=args)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"checkpoint {self.directory / str(step)} does not match the "
                             f"expected state structure: {e}") from e
        state = data_to_keys(restored["state"], template)
        meta = restored["meta"] if restored["meta"] is not None else {}
        return state, dict(meta)

    # ------------------------------------------------------------------ lifetime
    def wait(self) -> None:
        """Blocks until pending (async) saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

