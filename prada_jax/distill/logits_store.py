"""On-disk store of teacher top-k log-probs: streamed safetensors shards plus a JSON index.

Layout of a store folder::

  index.json                 format_version, top_k, dtypes, meta (teacher, tokenizer
                             fingerprint, ...), shards [{file, tokens, bytes}],
                             sequences {id: [shard, offset, length]}, complete
  shard_00000.safetensors    logp_actual [T] f32, topk_ids [T, k] i32,
  shard_00001.safetensors    topk_logp [T, k] f16|bf16, tail_mass [T] f32
  ...

Row ``offset + i`` of a sequence's shard is the teacher's prediction of token ``i + 1`` of the
sequence (see :mod:`prada_jax.distill.scoring`). The writer is resumable: shards are written to
a temporary name and renamed, then the index is atomically replaced, so after a crash every
shard the index lists is complete; shard files the index does not list (a crash between the
rename and the index update) and ``*.tmp`` leftovers are deleted and rewritten.
No pickle anywhere; numpy + JSON only (no torch).
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from prada_jax.lm import safetensors_io

FORMAT_VERSION = 1
INDEX_FILE = "index.json"
FIELDS = ("logp_actual", "topk_ids", "topk_logp", "tail_mass")
_VALUE_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
# float16 cannot hold -inf-like log-probs below its range; clamp to the most negative finite.
_F16_MIN = float(np.finfo(np.float16).min)


class LogitStoreError(BadInput):
    """A malformed, truncated or inconsistent store; the message names the file."""


def shard_name(i: int) -> str:
    return f"shard_{i:05d}.safetensors"


def bytes_per_token(top_k: int, value_dtype: str = "float16") -> int:
    """Stored bytes per scored token (excluding headers and the index)."""
    return top_k * (4 + _VALUE_DTYPES[value_dtype].itemsize) + 4 + 4


def _read_index(path: str) -> dict:
    try:
        with open(path) as f:
            index = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LogitStoreError(f"{path}: not valid JSON ({e})") from e
    for key in ("format_version", "top_k", "dtypes", "meta", "shards", "sequences"):
        if key not in index:
            raise LogitStoreError(f"{path}: missing field {key!r}")
    if index["format_version"] != FORMAT_VERSION:
        raise LogitStoreError(f"{path}: format_version {index['format_version']} is not "
                              f"{FORMAT_VERSION}")
    return index


class LogitStoreWriter:
    """Streams per-sequence teacher top-k arrays into shards; resumable.

    Args:
      out_dir: store folder (created).
      top_k: candidates per token.
      meta: JSON-able description (``teacher``, ``tokenizer_fingerprint``, ``vocab_size``, ...).
        On resume every key must equal the stored value, else :class:`LogitStoreError`.
      shard_tokens: a shard is written once this many tokens are buffered (at a
        :meth:`maybe_flush` call).
      value_dtype: ``"float16"`` (default) or ``"bfloat16"`` for ``topk_logp``.
    """

    def __init__(self, out_dir: str | os.PathLike, top_k: int, meta: Mapping[str, Any], *,
                 shard_tokens: int = 1 << 16, value_dtype: str = "float16"):
        if value_dtype not in _VALUE_DTYPES:
            raise ValueError(f"value_dtype must be one of {list(_VALUE_DTYPES)}, "
                             f"got {value_dtype!r}")
        if top_k < 1 or shard_tokens < 1:
            raise ValueError(f"top_k and shard_tokens must be >= 1, got {top_k}, {shard_tokens}")
        self.out_dir = os.fspath(out_dir)
        self.top_k = int(top_k)
        self.shard_tokens = int(shard_tokens)
        self.value_dtype = value_dtype
        os.makedirs(self.out_dir, exist_ok=True)
        self.index_path = os.path.join(self.out_dir, INDEX_FILE)
        meta = json.loads(json.dumps(dict(meta)))  # normalise (tuples → lists) for comparison
        dtypes = {"logp_actual": "float32", "topk_ids": "int32", "topk_logp": value_dtype,
                  "tail_mass": "float32"}
        if os.path.isfile(self.index_path):
            index = _read_index(self.index_path)
            if index["top_k"] != self.top_k or index["dtypes"] != dtypes:
                raise LogitStoreError(
                    f"{self.index_path}: existing store has top_k={index['top_k']}, "
                    f"dtypes={index['dtypes']}; cannot resume with top_k={top_k}, "
                    f"value_dtype={value_dtype}")
            for key, value in meta.items():
                if index["meta"].get(key) != value:
                    raise LogitStoreError(
                        f"{self.index_path}: existing store has meta.{key}="
                        f"{index['meta'].get(key)!r}, this export has {value!r}; use "
                        "another --out folder")
            self.index = index
            self.index["complete"] = False
        else:
            self.index = {"format_version": FORMAT_VERSION, "top_k": self.top_k, "dtypes": dtypes,
                          "meta": meta, "shards": [], "sequences": {}, "complete": False}
        self._clean_partial()
        self._buffer: list[tuple[str, dict]] = []
        self._buffered_ids: set[str] = set()
        self._buffered_tokens = 0

    def _clean_partial(self) -> None:
        listed = {s["file"] for s in self.index["shards"]}
        for name in os.listdir(self.out_dir):
            path = os.path.join(self.out_dir, name)
            stray_shard = name.startswith("shard_") and name.endswith(".safetensors") and \
                name not in listed
            if stray_shard or name.endswith(".tmp"):
                os.remove(path)
        for s in self.index["shards"]:
            _check_shard(self.out_dir, s, self.index_path)

    @property
    def num_sequences(self) -> int:
        return len(self.index["sequences"])

    def done(self, seq_id) -> bool:
        """True if ``seq_id`` is already stored (in a written shard) or buffered."""
        seq_id = str(seq_id)
        return seq_id in self.index["sequences"] or seq_id in self._buffered_ids

    def add(self, seq_id, arrays: Mapping[str, np.ndarray]) -> None:
        """Buffers one sequence's arrays (``FIELDS``; ``topk_ids`` [T, k], others [T] / [T, k])."""
        seq_id = str(seq_id)
        if self.done(seq_id):
            raise LogitStoreError(f"{self.index_path}: sequence id {seq_id!r} is already stored")
        t = int(np.shape(arrays["logp_actual"])[0])
        want = {"logp_actual": (t,), "topk_ids": (t, self.top_k), "topk_logp": (t, self.top_k),
                "tail_mass": (t,)}
        for name, shape in want.items():
            if tuple(np.shape(arrays[name])) != shape:
                raise ValueError(f"sequence {seq_id!r}: {name} has shape {np.shape(arrays[name])}, "
                                 f"expected {shape}")
        self._buffer.append((seq_id, arrays))
        self._buffered_ids.add(seq_id)
        self._buffered_tokens += t

    def maybe_flush(self) -> bool:
        """Writes a shard if ≥ ``shard_tokens`` tokens are buffered; returns whether it did."""
        if self._buffered_tokens >= self.shard_tokens:
            self._flush()
            return True
        return False

    def _flush(self) -> None:
        if not self._buffer:
            return
        shard_id = len(self.index["shards"])
        name = shard_name(shard_id)
        k, vdt = self.top_k, _VALUE_DTYPES[self.value_dtype]
        cat = {}
        for field in FIELDS:
            parts = [np.asarray(a[field]) for _, a in self._buffer]
            cat[field] = np.concatenate(parts, axis=0) if parts else None
        tensors = {
            "logp_actual": cat["logp_actual"].astype(np.float32).reshape(-1),
            "topk_ids": cat["topk_ids"].astype(np.int32).reshape(-1, k),
            "topk_logp": np.maximum(cat["topk_logp"].astype(np.float32), _F16_MIN)
                           .astype(vdt).reshape(-1, k),
            "tail_mass": cat["tail_mass"].astype(np.float32).reshape(-1),
        }
        path = os.path.join(self.out_dir, name)
        nbytes = safetensors_io.save_file(tensors, path + ".tmp",
                                          # the format's tag, not a module path
                                          metadata={"format": "prada_jax.logits_store",
                                                    "format_version": str(FORMAT_VERSION)})
        os.replace(path + ".tmp", path)
        offset = 0
        for seq_id, a in self._buffer:
            n = int(np.shape(a["logp_actual"])[0])
            self.index["sequences"][seq_id] = [shard_id, offset, n]
            offset += n
        self.index["shards"].append({"file": name, "tokens": offset, "bytes": nbytes})
        self._write_index()
        self._buffer, self._buffered_ids, self._buffered_tokens = [], set(), 0

    def close(self) -> None:
        """Writes the remaining buffer and marks the store complete."""
        self._flush()
        self.index["complete"] = True
        self._write_index()

    def _write_index(self) -> None:
        write_json(self.index_path, self.index, indent=None, sort_keys=True,
                   separators=(",", ":"), newline=False)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        return False


def _check_shard(out_dir: str, shard: Mapping[str, Any], index_path: str):
    path = os.path.join(out_dir, shard["file"])
    if not os.path.isfile(path):
        raise LogitStoreError(f"{index_path}: lists shard {shard['file']} but {path} is missing")
    size = os.path.getsize(path)
    if size != shard["bytes"]:
        raise LogitStoreError(f"{path}: truncated or modified shard ({size} bytes, index.json "
                              f"records {shard['bytes']})")
    try:
        header, _, _ = safetensors_io.read_header(path)
    except safetensors_io.SafetensorsError as e:
        raise LogitStoreError(str(e)) from e
    for field in FIELDS:
        if field not in header:
            raise LogitStoreError(f"{path}: shard has no tensor {field!r}")
    t = header["logp_actual"]["shape"][0]
    if t != shard["tokens"]:
        raise LogitStoreError(f"{path}: shard holds {t} tokens, index.json records "
                              f"{shard['tokens']}")
    return safetensors_io.SafetensorsFile(path)


class TeacherLogits:
    """Read access to a finished (or partially written) store; see the module docstring."""

    def __init__(self, path: str, index: dict, files: list):
        self.path = path
        self.index = index
        self._files = files

    @classmethod
    def open(cls, path: str | os.PathLike, require_complete: bool = False) -> "TeacherLogits":
        """Opens and validates a store.

        Raises:
          LogitStoreError naming the file: missing/truncated shards, sequences whose token range
          lies past the end of their shard, a store not marked complete (if required).
        """
        path = os.fspath(path)
        index_path = os.path.join(path, INDEX_FILE)
        if not os.path.isfile(index_path):
            raise FileNotFoundError(f"no teacher-logit store at {path} ({INDEX_FILE} missing)")
        index = _read_index(index_path)
        if require_complete and not index.get("complete"):
            raise LogitStoreError(f"{index_path}: export did not finish (complete=false); rerun "
                                  "the exporter with the same --out to resume")
        files = [_check_shard(path, s, index_path) for s in index["shards"]]
        for seq_id, entry in index["sequences"].items():
            try:
                shard, offset, length = (int(x) for x in entry)
            except (TypeError, ValueError) as e:
                raise LogitStoreError(f"{index_path}: sequence {seq_id!r} entry {entry!r} is not "
                                      "[shard, offset, length]") from e
            if not 0 <= shard < len(files):
                raise LogitStoreError(f"{index_path}: sequence {seq_id!r} points to shard {shard}, "
                                      f"the store has {len(files)}")
            tokens = index["shards"][shard]["tokens"]
            if offset < 0 or length < 0 or offset + length > tokens:
                raise LogitStoreError(f"{index_path}: sequence {seq_id!r} range [{offset}, "
                                      f"{offset + length}) lies past the end of "
                                      f"{files[shard].path} ({tokens} tokens)")
        return cls(path, index, files)

    @property
    def top_k(self) -> int:
        return int(self.index["top_k"])

    @property
    def meta(self) -> dict:
        return self.index["meta"]

    @property
    def complete(self) -> bool:
        return bool(self.index.get("complete"))

    def ids(self) -> list[str]:
        return list(self.index["sequences"])

    def __len__(self) -> int:
        return len(self.index["sequences"])

    def __contains__(self, seq_id) -> bool:
        return str(seq_id) in self.index["sequences"]

    def get(self, seq_id) -> dict[str, np.ndarray]:
        """Arrays of one sequence (copies): ``logp_actual`` [T] f32, ``topk_ids`` [T, k] i32,
        ``topk_logp`` [T, k] float32 (widened from the stored 16-bit), ``tail_mass`` [T] f32;
        T = sequence length − 1, row i predicting token i + 1."""
        seq_id = str(seq_id)
        if seq_id not in self.index["sequences"]:
            raise KeyError(f"{self.path}: no sequence {seq_id!r} in the teacher-logit store")
        shard, offset, length = self.index["sequences"][seq_id]
        f = self._files[shard]
        out = {}
        for field in FIELDS:
            arr = np.array(f.get(field)[offset:offset + length])
            out[field] = arr.astype(np.float32) if field == "topk_logp" else arr
        return out
