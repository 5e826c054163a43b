"""Thin orbax ``CheckpointManager`` wrapper: save a whole pytree every N steps, keep K, restore.

Used by every launcher (PPO, dual ascent, distillation). A checkpoint holds two items:

* ``state``: any pytree of arrays (a learner state with params, optimiser state, env state,
  keys, counters). New-style typed PRNG keys (``jax.random.key``) cannot be written by orbax
  directly, so every typed-key leaf is stored as ``jax.random.key_data(key)`` (uint32) and
  re-wrapped with the template's key implementation on restore (``prada_jax.tree_leaves``):
  resumption is bit-exact.
* ``meta``: an optional JSON-serialisable dict (host-side counters, the config, notes).

Layout: ``<directory>/<step>/{state,meta,prada_manifest.json}``; a save interrupted by SIGKILL
leaves a ``<step>.orbax-checkpoint-tmp`` folder that is ignored (and cleaned up) on the next
start, so ``restore`` always returns the last *complete* step.

Trust:

* ``save`` refuses a state with a NaN/inf float leaf (``errors.NonFiniteTraining`` naming the
  leaf): a checkpoint on disk is always finite.
* After orbax commits a step, process 0 writes ``prada_manifest.json`` (size and SHA-256 of
  every file of the step). ``verify(step)`` checks it and names the first missing, truncated or
  changed file; a step without a manifest (an older run, a kill between the commit and the
  manifest, or a manifest deleted) is read back in full instead: every key of every OCDBT
  database in the step (the merged ``state/`` one and each ``ocdbt.process_<i>/``), and its
  JSON metadata files, so a truncated or missing data file is refused even where a restore
  would not read it. (A data file no database references any more, which orbax sometimes
  leaves in a step, is not read; only a manifest's hash covers it.) The same check serves a resume, a finished run rerun (nothing to train,
  but a damaged newest step is reported, not declared "already finished") and
  ``check_resumable``.
* Every failure ``restore`` can detect becomes a ``CheckpointError`` (a ``BadInput``, exit 2)
  whose one-line message names the step and the file: ``DamagedCheckpoint`` (a file missing,
  truncated or changed, unreadable metadata) or a template mismatch (the saved tree has other
  leaves/shapes than the state the config builds).
* ``restore_latest(template)`` (used when resuming) falls back to the newest intact step
  automatically, with one warning line on stderr naming the damaged step and file and the step
  it resumes from; the damaged step folder is renamed ``<step>.damaged`` so the run can save
  that step again. When no step is intact it prints no warning and raises one
  ``DamagedCheckpoint`` ("no intact checkpoint to resume from in DIR ..."); resuming trainers
  learn that before they write anything (``check_resumable``, called by
  ``run_state.check_resume``). Loading a policy for evaluation (``restore``) never falls back.

Example::

    ckpt = Checkpointer(workdir / "checkpoints", save_every=10, max_to_keep=3)
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(template_state)      # template: same structure/shapes
    ...
    ckpt.save(step, state, meta={"env_steps": 123})      # saved iff step % save_every == 0
    ckpt.close()
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
import tensorstore as ts   # orbax's own storage layer (installed with it)

from prada_jax.errors import BadInput, NonFiniteTraining
from prada_jax.jsonio import write_json
from prada_jax.tree_leaves import data_to_keys, first_non_finite, is_typed_key, keys_to_data

__all__ = ["Checkpointer", "CheckpointError", "DamagedCheckpoint", "MissingCheckpoint",
           "check_resumable", "step_folders", "MANIFEST_FILE"]

MANIFEST_FILE = "prada_manifest.json"


class CheckpointError(BadInput):
    """A checkpoint cannot be used (exit 2); the message names the step and the file."""


class MissingCheckpoint(CheckpointError, FileNotFoundError):
    """No checkpoint (or not the requested step, or no folder) where one was expected."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint step has a missing, truncated or changed file, or unreadable metadata."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _check_json(path: Path, step: int) -> None:
    """``DamagedCheckpoint`` naming checkpoint ``step`` and ``path`` unless the file parses as
    JSON."""
    try:
        json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise DamagedCheckpoint(f"checkpoint step {step} is damaged: {path} is not valid JSON "
                                f"({_first_line(e)})") from None


def _read_back(root: Path, step: int) -> None:
    """A step without a manifest, checked as far as the files allow: its JSON metadata files
    parse, and every value of every OCDBT database under it (each folder holding a
    ``manifest.ocdbt``: the merged one and the per-process ones) reads back, which opens every
    referenced data file over the byte range the database says it holds.

    Raises:
      DamagedCheckpoint: naming the step and the file (or database) that failed.
    """
    for rel in ("_CHECKPOINT_METADATA", "state/_METADATA", "meta/metadata"):
        path = root / rel
        if path.is_file():
            _check_json(path, step)
    for man in sorted(root.rglob("manifest.ocdbt")):
        db = man.parent
        try:
            kv = ts.KvStore.open({"driver": "ocdbt",
                                  "base": f"file://{db.absolute()}/"}).result()
            for key in kv.list().result():
                kv.read(key).result()
        except Exception as e:  # noqa: BLE001  (tensorstore raises ValueError & co.)
            raise DamagedCheckpoint(f"checkpoint step {step} is damaged: {db} does not read "
                                    f"back ({_first_line(e)[:300]})") from None


def _verify_step(directory: Path, step: int) -> bool:
    """``Checkpointer.verify`` on a folder, without orbax (see there)."""
    root = Path(directory) / str(int(step))
    man = root / MANIFEST_FILE
    if not man.is_file():
        _read_back(root, int(step))
        return False
    try:
        files = json.loads(man.read_text())["files"]
        items = [(str(k), int(v[0]), str(v[1])) for k, v in files.items()]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError,
            RecursionError) as e:
        raise DamagedCheckpoint(f"checkpoint step {step} is damaged: {man} is unreadable "
                                f"({_first_line(e)})") from None
    for rel, size, digest in items:
        path = root / rel
        if not path.is_file():
            raise DamagedCheckpoint(f"checkpoint step {step} is damaged: {path} is missing")
        data = path.read_bytes()
        if len(data) != size:
            raise DamagedCheckpoint(f"checkpoint step {step} is damaged: {path} has "
                                    f"{len(data)} bytes, expected {size} (truncated?)")
        if hashlib.sha256(data).hexdigest() != digest:
            raise DamagedCheckpoint(f"checkpoint step {step} is damaged: {path} differs "
                                    "from what was saved (checksum mismatch)")
    return True


def _no_intact(directory: Path, steps: list[int], newest: BaseException) -> DamagedCheckpoint:
    """The one-line error of a checkpoint folder whose every step is damaged."""
    which = f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(map(str, steps))}"
    return DamagedCheckpoint(f"no intact checkpoint to resume from in {directory} (damaged: "
                             f"{which}): {newest}; move the folder away to start over, or use "
                             "a new --workdir")


def step_folders(directory: os.PathLike | str) -> list[int]:
    """The committed step folders (``<directory>/<int>``) on disk, ascending; read-only, no
    orbax (``*.orbax-checkpoint-tmp`` and ``*.damaged`` folders are not steps)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and p.is_dir())


def check_resumable(directory: os.PathLike | str) -> None:
    """Refuses, before a resume writes anything, a checkpoint folder that holds steps but no
    intact one: every step fails its manifest check (``prada_manifest.json``) or, without a
    manifest, does not read back in full (``_read_back``). Read-only (no orbax manager is
    opened). A missing or empty folder passes (a fresh run).

    Raises:
      DamagedCheckpoint: one line naming the folder, the damaged steps and the newest one's
        file.
    """
    d = Path(directory).absolute()
    steps = step_folders(d)
    newest = None
    for step in reversed(steps):
        try:
            _verify_step(d, step)
            return
        except DamagedCheckpoint as e:
            newest = newest or e
    if newest is not None:
        raise _no_intact(d, steps, newest)


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
        checkpoint on disk is the last one saved" trivially true (and the manifest is
        written only for synchronous saves).
      create: False opens an existing folder read-only (loading a policy): nothing is
        created or cleaned up; a missing folder is a ``CheckpointError``.
    """

    def __init__(self, directory: os.PathLike | str, *, save_every: int = 1,
                 max_to_keep: int = 3, async_save: bool = False, create: bool = True):
        if int(save_every) < 1:
            raise ValueError(f"Checkpointer: save_every must be >= 1, got {save_every}")
        if int(max_to_keep) < 1:
            raise ValueError(f"Checkpointer: max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = Path(directory).absolute()
        if not create and not self.directory.is_dir():
            raise MissingCheckpoint(f"no checkpoint folder {self.directory}")
        if create:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.save_every = int(save_every)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=int(max_to_keep), create=bool(create),
            cleanup_tmp_directories=bool(create),
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
        bad = first_non_finite(state)
        if bad is not None:
            latest = self.latest_step()
            kept = ("no checkpoint was saved yet" if latest is None
                    else f"the last good checkpoint is step {latest} in {self.directory}")
            raise NonFiniteTraining(f"refusing to checkpoint step {step}: the state has "
                                    f"non-finite values in {bad}; {kept}")
        saved = self._manager.save(step, args=args, force=True)
        if not self._manager._options.enable_async_checkpointing:  # noqa: SLF001
            self._manager.wait_until_finished()
            if saved:
                self._write_manifest(step)
        return bool(saved)

    # ------------------------------------------------------------------ integrity
    def _write_manifest(self, step: int) -> None:
        if jax.process_index() != 0:
            return
        root = self.directory / str(step)
        files = {}
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.name != MANIFEST_FILE:
                data = path.read_bytes()
                files[str(path.relative_to(root))] = [len(data),
                                                      hashlib.sha256(data).hexdigest()]
        write_json(root / MANIFEST_FILE, {"step": step, "files": files}, indent=1)

    def verify(self, step: int) -> bool:
        """Checks step ``step`` against its manifest.

        Returns True if it was verified against its manifest, False if the step has no
        manifest (then every OCDBT database and JSON metadata file of the step was read back
        in full instead: see the module docstring).

        Raises:
          DamagedCheckpoint: naming the first missing, truncated or changed file (or an
            unreadable manifest, or a manifest-less step whose data does not read back).
        """
        return _verify_step(self.directory, step)

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores ``(state, meta)`` at ``step`` (default: latest).

        Args:
          template: a pytree with the structure, shapes and dtypes of the saved state
            (concrete arrays or ``jax.ShapeDtypeStruct``s; typed keys allowed), e.g. a freshly
            initialised learner state.
          step: which step; None = latest.

        Raises:
          CheckpointError (a ``BadInput``): no checkpoint (or not that step) in the directory,
            the saved tree does not match the template, or (``DamagedCheckpoint``) a file of
            the step is missing, truncated or changed; one line naming the step and file.
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise MissingCheckpoint(f"no checkpoint in {self.directory}")
        step = int(step)
        if step not in self._manager.all_steps():
            raise MissingCheckpoint(f"no checkpoint for step {step} in {self.directory} "
                                  f"(have {self.all_steps()})")
        verified = self.verify(step)
        abstract = jax.eval_shape(keys_to_data, template)

        def _target(a, t):
            # Restore onto the template's sharding where it has one (a sharded learner state on
            # a mesh, possibly of another device count than the one that saved it).
            # Leaves without one (NumPy, typed keys) go to the first local device, whatever
            # topology saved them.
            sharding = getattr(t, "sharding", None)
            if not (isinstance(t, jax.Array) and not is_typed_key(t) and sharding is not None
                    and tuple(t.shape) == tuple(a.shape)):
                sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)

        abstract = jax.tree.map(_target, abstract, template)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                  meta=ocp.args.JsonRestore())
        where = self.directory / str(step)
        meta_file = where / "meta" / "metadata"
        if meta_file.is_file():
            _check_json(meta_file, step)
        mismatch = self._structure_mismatch(step, abstract)
        if mismatch:
            raise CheckpointError(f"checkpoint {where} does not match the state this config "
                                  f"builds: {mismatch}")
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:  # noqa: BLE001  (orbax/tensorstore raise many types)
            if verified:   # every file is as saved and the tree matched: not damage
                raise CheckpointError(f"checkpoint {where} could not be restored onto the "
                                      f"expected state: {_first_line(e)}") from e
            raise DamagedCheckpoint(f"checkpoint step {step} is damaged or unreadable: "
                                    f"{where}: {_first_line(e)}") from e
        state = data_to_keys(restored["state"], template)
        meta = restored["meta"] if restored["meta"] is not None else {}
        if not isinstance(meta, dict):
            raise DamagedCheckpoint(f"checkpoint step {step} is damaged: {meta_file} is not a "
                                    "JSON object")
        return state, dict(meta)

    def _structure_mismatch(self, step: int, abstract: Any) -> str | None:
        """Leaves the saved tree (``state/_METADATA``) and ``abstract`` do not share, or None
        when they agree or the metadata cannot be read (the restore then reports it).
        Shapes are checked by the restore itself."""
        try:
            tree = json.loads((self.directory / str(step) / "state" / "_METADATA")
                              .read_text())["tree_metadata"]
            got = {tuple(str(k["key"]) for k in v["key_metadata"]) for v in tree.values()}
        except Exception:  # noqa: BLE001
            return None

        def _name(k):
            for attr in ("key", "name", "idx"):
                if hasattr(k, attr):
                    return str(getattr(k, attr))
            return str(k)
        want = {tuple(_name(k) for k in p)
                for p, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]}
        # (only missing leaves: orbax also lists empty nodes, e.g. optax's EmptyState, that a
        # flattened template does not have)
        missing = sorted("/".join(k) for k in want - got)
        if missing:
            extra = sorted("/".join(k) for k in got - want)
            return (f"{len(missing)} expected leaves are not in it (e.g. {missing[:2]}; it has "
                    f"{extra[:2]} instead)")
        return None

    def restore_latest(self, template: Any) -> tuple[Any, dict, int] | None:
        """Resume helper: ``(state, meta, step)`` of the newest intact step, or None if the
        directory has no checkpoint.

        A damaged newest step is reported in one warning line on stderr (naming the file and
        the step it falls back to) and renamed ``<step>.damaged``; the next older intact step
        is restored. A template mismatch is not damage and is raised at once.

        Raises:
          CheckpointError: a mismatch, or every step is damaged (naming the newest one's file).
        """
        steps = self.all_steps()
        if not steps:
            return None
        damaged: list[tuple[int, DamagedCheckpoint]] = []
        for step in reversed(steps):
            try:
                state, meta = self.restore(template, step)
            except DamagedCheckpoint as e:
                damaged.append((step, e))
                continue
            for bad, e in damaged:   # warned only once a step restored: then they are true
                older = [s for s in steps if s < bad]
                print(f"warning: {e}; falling back to step {older[-1]}", file=sys.stderr,
                      flush=True)
            if damaged:
                self._quarantine([s for s in steps if s > step])
            return state, meta, step
        raise _no_intact(self.directory, steps, damaged[0][1])

    def _quarantine(self, steps: list[int]) -> None:
        """Renames damaged step folders ``<step>.damaged`` (process 0) and reloads the
        manager, so those steps can be saved again."""
        if jax.process_index() == 0:
            for s in steps:
                src = self.directory / str(s)
                dst = self.directory / f"{s}.damaged"
                n = 1
                while dst.exists():
                    dst = self.directory / f"{s}.damaged{n}"
                    n += 1
                if src.exists():
                    os.replace(src, dst)
        self._manager.reload()

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

