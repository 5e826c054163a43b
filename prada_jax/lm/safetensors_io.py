"""Validated, memory-mapped reading and plain writing of safetensors files (bf16 included).

The format: 8-byte little-endian header length N, N bytes of JSON header
(``name -> {dtype, shape, data_offsets: [begin, end]}`` plus optional ``__metadata__``), then
the data buffer. Reading checks every tensor's byte range against the file size so a truncated
file raises an error naming it instead of returning garbage.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Mapping

import ml_dtypes
import numpy as np
from prada_jax.errors import BadInput

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 * 2**20


class SafetensorsError(BadInput):
    """A malformed or truncated safetensors file (the message names the file)."""


def read_header(path: str | os.PathLike) -> tuple[dict, dict, int]:
    """Parses and validates a safetensors header.

    Returns:
      (tensors: name -> {dtype, shape, data_offsets}, metadata dict, data start byte offset).

    Raises:
      SafetensorsError: naming ``path`` if the header is malformed or any tensor's bytes lie
        past the end of the file (a truncated shard).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"safetensors file not found: {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: truncated or corrupt safetensors file (header claims "
                                   f"{n} bytes, file has {size})")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SafetensorsError(f"{path}: corrupt safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: corrupt safetensors header (not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    start = 8 + n
    data_len = size - start
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise SafetensorsError(f"{path}: bad header entry for tensor {name!r}: {info!r}") from e
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if end - begin != want or begin < 0:
            raise SafetensorsError(f"{path}: tensor {name!r} byte range {begin}..{end} does not "
                                   f"match shape {shape} of {info['dtype']}")
        if end > data_len:
            raise SafetensorsError(f"{path}: truncated safetensors file: tensor {name!r} ends at "
                                   f"byte {start + end} but the file has {size} bytes")
    return header, meta, start


class SafetensorsFile:
    """Lazy, memory-mapped read access to one validated safetensors file."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.header, self.metadata, self._start = read_header(self.path)
        self._mm = None

    def keys(self) -> list[str]:
        return list(self.header)

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> np.dtype:
        return _DTYPES[self.header[name]["dtype"]]

    def get(self, name: str) -> np.ndarray:
        """A read-only view of tensor ``name`` (no copy; memory-mapped)."""
        if name not in self.header:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        info = self.header[name]
        begin, end = info["data_offsets"]
        raw = self._mm[self._start + begin:self._start + end]
        return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


def save_file(tensors: Mapping[str, np.ndarray], path: str | os.PathLike,
              metadata: Mapping[str, str] | None = None) -> int:
    """Writes ``tensors`` (numpy arrays, bf16 via ml_dtypes allowed) to ``path``; returns bytes.

    Tensors are laid out in sorted-name order so equal inputs give byte-identical files.
    """
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(np.asarray(tensors[name]))
        if arr.dtype not in _NAMES:
            raise TypeError(f"tensor {name!r}: dtype {arr.dtype} cannot be stored in safetensors")
        nbytes = arr.nbytes
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((-len(blob)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
    return 8 + len(blob) + offset
