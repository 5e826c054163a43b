"""The resumable staging folder ``OUT/staging/``: one atomically written safetensors file per
batch of problems, guarded by the fingerprint of the settings, models and data."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save

from prada_jax.jsonio import read_json
from prada_jax.safetensors_folder import file_sha256
from prada_jax.traces.builder.settings import BuildError
from prada_jax.traces.builder.tree import ProblemTree

__all__ = ["STAGING", "SETTINGS_FILE", "PROJECTION_FILE", "trees_to_arrays", "batch_name",
           "atomic_write_bytes", "write_batch", "read_batch", "file_sha256",
           "model_fingerprint", "prepare_staging"]

STAGING = "staging"
SETTINGS_FILE = "settings.json"
PROJECTION_FILE = "projection.safetensors"


def trees_to_arrays(trees: Sequence[ProblemTree]) -> dict[str, np.ndarray]:
    """Per-node arrays of a batch with problem-local node ids, plus ``n_nodes`` [P] and
    ``problem_index`` [P]."""
    nodes = [n for t in trees for n in t.nodes]
    return {
        "feat": np.stack([n.feat for n in nodes]).astype(np.float32),
        "prm": np.array([n.prm for n in nodes], np.float32),
        "cand_prm": np.array([n.cand_prm for n in nodes], np.float32),
        "cand_tokens": np.array([n.cand_tokens for n in nodes], np.int32),
        "ctx_tokens": np.array([n.ctx_tokens for n in nodes], np.int32),
        "child": np.array([n.child for n in nodes], np.int32),
        "terminal": np.array([n.terminal for n in nodes], np.uint8),
        "correct": np.array([n.correct for n in nodes], np.uint8),
        "fallback": np.array([n.fallback for n in nodes], np.int32),
        "depth": np.array([n.depth for n in nodes], np.int32),
        "completion": np.array([n.completion for n in nodes], np.uint8),
        "n_nodes": np.array([len(t.nodes) for t in trees], np.int32),
        "problem_index": np.array([t.problem.index for t in trees], np.int32),
    }


def batch_name(start: int, end: int) -> str:
    return f"batch_{start:07d}_{end:07d}.safetensors"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_batch(staging: Path, start: int, end: int, trees: Sequence[ProblemTree],
                extra: dict) -> Path:
    """Writes one batch atomically (temporary file, fsync, rename)."""
    arrays = trees_to_arrays(trees)
    texts = [[list(n.texts) for n in t.nodes] for t in trees]
    meta = {"texts": json.dumps(texts), "extra": json.dumps(extra)}
    path = staging / batch_name(start, end)
    atomic_write_bytes(path, save(arrays, metadata=meta))
    return path


def read_batch(path: Path) -> tuple[dict[str, np.ndarray], list, dict]:
    """``(arrays, texts, extra)`` of one staged batch file (``write_batch``'s layout)."""
    arrays = {}
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            arrays[k] = f.get_tensor(k)
    return arrays, json.loads(meta.get("texts", "[]")), json.loads(meta.get("extra", "{}"))


def model_fingerprint(path: Path) -> dict:
    """Folder name, sha256 of config.json, and names + sizes of the weight files (weights are
    not hashed: multi-GB)."""
    weights = sorted([p.name, p.stat().st_size] for p in path.iterdir()
                     if p.suffix in (".safetensors", ".bin") or p.name.endswith(".index.json"))
    return {"name": path.name, "config_sha256": file_sha256(path / "config.json"),
            "weights": weights}


def _diff_keys(a, b, prefix: str = "") -> list[str]:
    """Dotted names of the leaves where two JSON-like dicts differ."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [prefix.rstrip(".") or "<root>"] if a != b else []
    out = []
    for k in sorted(set(a) | set(b)):
        out += _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
    return out


def prepare_staging(out: Path, fingerprint: dict) -> Path:
    staging = out / STAGING
    fingerprint = json.loads(json.dumps(fingerprint))  # compare as stored (tuples -> lists)
    staging.mkdir(parents=True, exist_ok=True)
    for p in staging.glob("*.tmp*"):  # leftovers of a write killed half-way
        p.unlink()
    sfile = staging / SETTINGS_FILE
    has_batches = any(staging.glob("batch_*.safetensors"))
    if sfile.is_file() and has_batches:
        old = read_json(sfile, error=BuildError)
        if old != fingerprint:
            diff = _diff_keys(old, fingerprint)
            raise BuildError(f"{sfile}: the staged batches were built with different settings "
                             f"({', '.join(diff)}); use another --out or delete {staging}")
    else:  # nothing staged yet: (re)start with these settings and a fresh projection
        (staging / PROJECTION_FILE).unlink(missing_ok=True)
        atomic_write_bytes(sfile, json.dumps(fingerprint, indent=2, sort_keys=True).encode())
    return staging
