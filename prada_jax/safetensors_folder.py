"""Atomic writing and hashing of a data folder: one safetensors file of arrays + one JSON meta.

Shared by the step-trace format (``prada_jax.traces.format``) and the trajectory pool
(``prada_jax.distill.pool``): both store ``content_hash = "sha256:<hex>"`` of the arrays file.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def file_sha256(path: os.PathLike | str) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks (the one file hasher of the project)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hash(path: os.PathLike | str) -> str:
    """``"sha256:<hex>"`` of a file's bytes (:func:`file_sha256` with its algorithm named)."""
    return "sha256:" + file_sha256(path)


def write_arrays_and_meta(arrays_path: os.PathLike | str, arrays: dict[str, np.ndarray],
                          meta_path: os.PathLike | str, meta: dict) -> dict:
    """Writes ``arrays`` (safetensors) and ``meta`` (JSON, with ``content_hash`` of the arrays
    file set) under temporary names, then renames both, so an interrupted save never leaves a
    half-written folder. Returns the meta as written."""
    arrays_path, meta_path = Path(arrays_path), Path(meta_path)
    tmp_arrays = arrays_path.with_name(arrays_path.name + ".tmp")
    save_file(arrays, str(tmp_arrays))
    meta = dict(meta, content_hash=file_hash(tmp_arrays))
    tmp_meta = meta_path.with_name(meta_path.name + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(tmp_arrays, arrays_path)
    os.replace(tmp_meta, meta_path)
    return meta
