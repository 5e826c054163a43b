"""Teacher top-k logits aligned to a pool's tokens, for gathering inside training batches.

A :class:`TeacherTable` holds, for every pool token position j (absolute index into
``pool.tokens``), the teacher's distribution *predicting* token j given the trajectory before
it: ``topk_ids`` [T, k] int32, ``topk_logp`` [T, k] float32, ``tail_mass`` [T] float32 and
``logp_actual`` [T] float32 (log-prob of the actual token j). Row j is undefined (zeros) for the
first token of each trajectory. This is the exporter's per-sequence layout ("entry i predicts
token i + 1") shifted by one and concatenated.

Sources: :func:`from_sequences` (any per-sequence list of dicts from a scoring function) and
:func:`load` (a logit store, :mod:`prada_jax.distill.logits_store` — the one on-disk format,
written by the exporter ``prada_jax.distill.export`` or by :func:`write_store`). Every source
is checked against the pool; a mismatch raises ``TeacherLogitsMismatch`` naming what differs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from flax import struct

from prada_jax.distill import logits_store
from prada_jax.distill.logits_store import INDEX_FILE, TeacherLogits
from prada_jax.distill.pool import Pool
from prada_jax.errors import BadInput

class TeacherLogitsMismatch(BadInput):
    """Exported teacher logits that do not match the pool."""


@struct.dataclass
class TeacherTable:
    topk_ids: Any
    topk_logp: Any
    tail_mass: Any
    logp_actual: Any
    meta: dict = struct.field(pytree_node=False, default_factory=dict)

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[1])

    def gather(self, pos: np.ndarray) -> dict[str, np.ndarray]:
        """Rows for absolute positions ``pos`` [B, A] (-1 = padding → zeros, tail 1)."""
        safe = np.where(pos < 0, 0, pos)
        out = {"topk_ids": self.topk_ids[safe], "topk_logp": self.topk_logp[safe],
               "tail_mass": self.tail_mass[safe], "logp_actual": self.logp_actual[safe]}
        pad = pos < 0
        out["topk_ids"] = np.where(pad[..., None], 0, out["topk_ids"]).astype(np.int32)
        out["topk_logp"] = np.where(pad[..., None], -1e4, out["topk_logp"]).astype(np.float32)
        out["tail_mass"] = np.where(pad, 1.0, out["tail_mass"]).astype(np.float32)
        out["logp_actual"] = np.where(pad, 0.0, out["logp_actual"]).astype(np.float32)
        return out


def from_sequences(pool: Pool, seqs: Sequence[dict], source: str = "<scores>",
                   meta: dict | None = None) -> TeacherTable:
    """Builds the table from per-trajectory score dicts (``logp_actual`` [L-1], ``topk_ids``
    [L-1, k], ``topk_logp`` [L-1, k], ``tail_mass`` [L-1]; entry i predicts token i + 1)."""
    N = pool.num_trajectories
    if len(seqs) != N:
        raise TeacherLogitsMismatch(f"{source}: {len(seqs)} scored sequences but the pool has "
                                    f"{N} trajectories")
    T = int(np.asarray(pool.tokens).shape[0])
    k = int(np.asarray(seqs[0]["topk_ids"]).shape[-1]) if N else 1
    ids = np.zeros((T, k), np.int32)
    lp = np.full((T, k), -1e4, np.float32)
    tail = np.ones(T, np.float32)
    act = np.zeros(T, np.float32)
    offs = np.asarray(pool.traj_offsets)
    for i, d in enumerate(seqs):
        a, b = int(offs[i]), int(offs[i + 1])
        n = b - a - 1
        for name in ("logp_actual", "topk_ids", "topk_logp", "tail_mass"):
            if name not in d:
                raise TeacherLogitsMismatch(f"{source}: sequence {i} lacks '{name}'")
            got = np.asarray(d[name]).shape[0]
            if got != n:
                raise TeacherLogitsMismatch(
                    f"{source}: sequence {i} field '{name}' has {got} entries, but pool "
                    f"trajectory {i} has {b - a} tokens (needs {n}): the logits do not match "
                    "the pool")
        if np.asarray(d["topk_ids"]).shape[-1] != k:
            raise TeacherLogitsMismatch(f"{source}: sequence {i} has a different top-k")
        ids[a + 1:b] = np.asarray(d["topk_ids"], np.int32)
        lp[a + 1:b] = np.asarray(d["topk_logp"], np.float32)
        tail[a + 1:b] = np.clip(np.asarray(d["tail_mass"], np.float32), 0.0, 1.0)
        act[a + 1:b] = np.asarray(d["logp_actual"], np.float32)
    return TeacherTable(ids, lp, tail, act, meta=dict(meta or {}))


def check_against_pool(table: TeacherTable, pool: Pool, source: str = "<table>",
                       atol: float = 5e-2) -> None:
    """Consistency checks: the pool hash if recorded, and that each actual token's teacher
    log-prob equals its top-k entry whenever the token is in the top-k (catches logits
    exported for other token sequences)."""
    want = table.meta.get("pool_content_hash")
    if want and want != pool.meta.get("content_hash"):
        raise TeacherLogitsMismatch(f"{source}: exported for pool {want}, but this pool is "
                                    f"{pool.meta.get('content_hash')}")
    tokens = np.asarray(pool.tokens)
    hit = table.topk_ids == tokens[:, None]
    first = np.zeros(tokens.shape[0], bool)
    first[np.asarray(pool.traj_offsets)[:-1]] = True
    hit[first] = False
    rows = np.nonzero(hit.any(-1))[0]
    if rows.size:
        col = hit[rows].argmax(-1)
        diff = np.abs(table.topk_logp[rows, col] - table.logp_actual[rows])
        if np.any(diff > atol):
            j = int(rows[np.argmax(diff)])
            raise TeacherLogitsMismatch(f"{source}: token {j}'s log-prob disagrees with its "
                                        "top-k entry: the logits do not match the pool tokens")
    vocab = (pool.meta.get("tokenizer") or {}).get("vocab_size")
    if np.any(table.topk_ids < 0) or (vocab and np.any(table.topk_ids >= vocab)):
        raise TeacherLogitsMismatch(f"{source}: top-k ids outside the pool tokenizer's "
                                    f"vocabulary [0, {vocab})")


def write_store(pool: Pool, seqs: Sequence[dict], out_dir: os.PathLike | str,
                meta: dict | None = None, value_dtype: str = "float16") -> Path:
    """Writes per-trajectory score dicts (``from_sequences``' contract, ids ``str(i)``) as a
    logit store (:mod:`prada_jax.distill.logits_store`, the one on-disk teacher-logit format)
    recording the pool's content hash; :func:`load` reads it back."""
    from_sequences(pool, seqs)   # same shape checks as on load
    k = int(np.asarray(seqs[0]["topk_ids"]).shape[-1])
    m = {"pool_content_hash": pool.meta.get("content_hash"), **(meta or {})}
    with logits_store.LogitStoreWriter(out_dir, k, m, value_dtype=value_dtype) as w:
        for i, d in enumerate(seqs):
            w.add(str(i), d)
    return Path(out_dir)


def load(path: os.PathLike | str, pool: Pool) -> TeacherTable:
    """Loads a logit store written for ``pool`` (by ``python -m prada_jax.distill.export`` or
    :func:`write_store`) and checks it matches the pool; every problem raises
    :class:`TeacherLogitsMismatch` / ``LogitStoreError`` (both ``BadInput``) naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise TeacherLogitsMismatch(f"{path}: teacher logits folder not found")
    if not (path / INDEX_FILE).is_file():
        raise TeacherLogitsMismatch(
            f"{path}: no {INDEX_FILE} (not a teacher-logit store; export one with "
            "python -m prada_jax.distill.export, or rerun python -m prada_jax.distill.task.teacher "
            "to regenerate the task cache)")
    store = TeacherLogits.open(path)
    seqs = []
    for i in range(pool.num_trajectories):
        try:
            seqs.append(store.get(i))
        except (KeyError, IndexError) as e:
            raise TeacherLogitsMismatch(f"{path}: no exported logits for pool trajectory "
                                        f"{i} ({e})") from None
    meta = dict(getattr(store, "meta", {}) or {})
    table = from_sequences(pool, seqs, str(path), meta)
    if "pool_content_hash" not in table.meta and "pool_hash" in meta:
        table.meta["pool_content_hash"] = meta["pool_hash"]
    check_against_pool(table, pool, str(path))
    return table
