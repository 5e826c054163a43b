"""Teacher top-k logits aligned to a pool's tokens, for gathering inside training batches.

A :class:`TeacherTable` holds, for every pool token position j (absolute index into
``pool.tokens``), the teacher's distribution *predicting* token j given the trajectory before
it: ``topk_ids`` [T, k] int32, ``topk_logp`` [T, k] float32, ``tail_mass`` [T] float32 and
``logp_actual`` [T] float32 (log-prob of the actual token j). Row j is undefined (zeros) for the
first token of each trajectory. This is the exporter's per-sequence layout ("entry i predicts
token i + 1") shifted by one and concatenated.

Sources: :func:`from_sequences` (any per-sequence list of dicts from a scoring function),
:func:`load` (a folder written by :func:`save`, or one written by the project's exporter
``prada_jax.distill.export``, read through ``prada_jax.distill.logits_store``). Every source is
checked against the pool; a mismatch raises ``TeacherLogitsMismatch`` naming what differs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from flax import struct

from prada_jax.distill.pool import Pool, file_hash
from prada_jax.errors import BadInput

TABLE_FILE = "teacher_table.safetensors"
TABLE_META = "teacher_table.json"


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


def save(table: TeacherTable, out_dir: os.PathLike | str, pool_dir: os.PathLike | str) -> Path:
    from safetensors.numpy import save_file
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"topk_ids": table.topk_ids, "topk_logp": table.topk_logp,
               "tail_mass": table.tail_mass, "logp_actual": table.logp_actual},
              str(out / TABLE_FILE))
    meta = dict(table.meta)
    meta["pool_content_hash"] = json.loads((Path(pool_dir) / "pool.json").read_text())[
        "content_hash"]
    meta["top_k"] = table.top_k
    meta["content_hash"] = file_hash(out / TABLE_FILE)
    (out / TABLE_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


def load(path: os.PathLike | str, pool: Pool) -> TeacherTable:
    """Loads teacher logits for ``pool`` from ``path`` and checks they match it."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: teacher logits folder not found")
    if (path / TABLE_FILE).is_file():
        from safetensors.numpy import load_file
        meta = json.loads((path / TABLE_META).read_text())
        arr = load_file(str(path / TABLE_FILE))
        T = int(np.asarray(pool.tokens).shape[0])
        if arr["topk_ids"].shape[0] != T:
            raise TeacherLogitsMismatch(f"{path / TABLE_FILE}: {arr['topk_ids'].shape[0]} rows "
                                        f"but the pool has {T} tokens")
        table = TeacherTable(arr["topk_ids"], arr["topk_logp"], arr["tail_mass"],
                             arr["logp_actual"], meta=meta)
    else:
        from prada_jax.distill.logits_store import TeacherLogits  # the exporter's store
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
        if "pool_content_hash" not in table.meta:
            for key in ("pool_hash", "pool_content_hash"):
                if key in meta:
                    table.meta["pool_content_hash"] = meta[key]
    check_against_pool(table, pool, str(path))
    return table
