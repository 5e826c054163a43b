"""Step-trace format: the arrays of a forest of step trees, their files, and their validation.

A trace set is one folder with two files (docs/design.md §2):

* ``nodes.safetensors``: flat arrays, no pickle. Per node (index = node id, ``N`` nodes):

  ================  ===========  =========  ==================================================
  field             shape        dtype      meaning
  ================  ===========  =========  ==================================================
  ``feat``          [N, F]       float32    what the edge observes about its own draft
  ``prm``           [N]          float32    PRM score of the prefix x_k, in [0, 1]
  ``cand_prm``      [N, 2]       float32    PRM of x_k + SLM draft (0), x_k + LLM step (1)
  ``cand_tokens``   [N, 2]       int32      tokens of the SLM draft (0) and LLM step (1), >= 1
  ``ctx_tokens``    [N]          int32      tokens in x_k (prompt + previous steps), >= 1
  ``child``         [N, 2]       int32      successor node id per candidate, -1 = not expanded
  ``terminal``      [N, 2]       uint8      candidate finishes the solution (0/1)
  ``correct``       [N, 2]       uint8      terminal candidate's final answer is right (0/1)
  ``fallback``      [N]          int32      successor used when the chosen non-terminal child
                                            was not expanded (-1 = none needed)
  ``depth``         [N]          int32      step index k of the node (root = 0)
  ``problem``       [N]          int32      problem index of the node
  ================  ===========  =========  ==================================================

  Per problem (``P`` problems): ``root`` [P] int32 (node id), ``n_nodes`` [P] int32,
  ``answer_id`` [P] int32. Nodes of problem p are contiguous and start at ``root[p]``.

* ``meta.json``: ``format_version``, ``benchmark``, ``synthetic`` (bool), ``models``
  (``slm``, ``llm``, ``prm`` names), ``feature_dim``, ``feature_names``, ``counts``
  (``problems``, ``nodes``), ``max_depth``, ``generator`` (settings), ``content_hash``
  (``sha256:`` of the bytes of ``nodes.safetensors``); optional ``splits``: the problem
  indices of each part, ``{"train": [...], "validation": [...], "test": [...]}`` (disjoint,
  together every problem; ``prada_jax.traces.splits``) and ``split_rule``. Other keys are
  allowed and ignored (kept as provenance; ``validate`` lists them).

Either file may be a symlink, also to a file outside the folder: it is followed and
``validate`` names the link and its target. The content hash pins the bytes of
``nodes.safetensors`` only: a linked ``meta.json`` is checked for its format, like any
``meta.json``, but nothing pins its content. A file that is not a regular file (a directory,
a device such as the zero device, a FIFO, a socket; also through a symlink) is refused, naming
what it is.

Edges (child and fallback) always go from depth k to depth k + 1, so the graph is acyclic
and every path ends within ``max_depth`` + 1 steps; the validator checks this.
The PRM of a prefix is one score: ``prm[child[n, c]]`` equals ``cand_prm[n, c]`` (to
``PRM_CHILD_ATOL``, which allows batched / bf16 rescoring); the validator checks this too.
Loading parses safetensors (a header + raw buffers) and JSON only: nothing in the files can
run code.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
from flax import struct
from safetensors import SafetensorError
from safetensors.numpy import load_file

from prada_jax.errors import BadInput
from prada_jax.safetensors_folder import file_hash, write_arrays_and_meta
from prada_jax.jsonio import read_json, write_json
from prada_jax.traces.splits import (DEFAULT_FRACTIONS, SplitError, check_splits,
                                       problem_split)

FORMAT_VERSION = 1
NODES_FILE = "nodes.safetensors"
META_FILE = "meta.json"

# name -> (dtype, shape spec). "N" nodes, "P" problems, "F" feature dim, ints are literal.
NODE_FIELDS: dict[str, tuple[np.dtype, tuple]] = {
    "feat": (np.dtype(np.float32), ("N", "F")),
    "prm": (np.dtype(np.float32), ("N",)),
    "cand_prm": (np.dtype(np.float32), ("N", 2)),
    "cand_tokens": (np.dtype(np.int32), ("N", 2)),
    "ctx_tokens": (np.dtype(np.int32), ("N",)),
    "child": (np.dtype(np.int32), ("N", 2)),
    "terminal": (np.dtype(np.uint8), ("N", 2)),
    "correct": (np.dtype(np.uint8), ("N", 2)),
    "fallback": (np.dtype(np.int32), ("N",)),
    "depth": (np.dtype(np.int32), ("N",)),
    "problem": (np.dtype(np.int32), ("N",)),
}
PROBLEM_FIELDS: dict[str, tuple[np.dtype, tuple]] = {
    "root": (np.dtype(np.int32), ("P",)),
    "n_nodes": (np.dtype(np.int32), ("P",)),
    "answer_id": (np.dtype(np.int32), ("P",)),
}
ALL_FIELDS = {**NODE_FIELDS, **PROBLEM_FIELDS}
PRM_CHILD_ATOL = 1e-3   # |prm[child[n, c]] - cand_prm[n, c]| allowed (batched/bf16 rescoring)
REQUIRED_META = ("format_version", "benchmark", "synthetic", "models", "feature_dim",
                 "counts", "max_depth", "content_hash")
# Optional keys this package writes (synthetic generator, builder). Any other key is allowed,
# read by nothing and left in the file (provenance, e.g. a user's notes); ``validate`` lists it.
OPTIONAL_META = ("feature_names", "generator", "prm_style", "splits", "split_rule")


class TraceFormatError(BadInput):
    """A trace folder that is malformed. The message names the file and the field."""

    def __init__(self, path: os.PathLike | str, field: str, problem: str):
        self.path = str(path)
        self.field = field
        super().__init__(f"{path}: field '{field}': {problem}")


@struct.dataclass
class TraceSet:
    """Arrays of one trace set (see the module docstring for shapes and meanings).

    A pytree of NumPy arrays: ``jax.device_put(traces)`` moves it to a device, and it can sit
    in env params so one compiled env step serves any trace set of the same shapes.
    """

    feat: Any
    prm: Any
    cand_prm: Any
    cand_tokens: Any
    ctx_tokens: Any
    child: Any
    terminal: Any
    correct: Any
    fallback: Any
    depth: Any
    problem: Any
    root: Any
    n_nodes: Any
    answer_id: Any

    @property
    def num_nodes(self) -> int:
        return int(self.prm.shape[0])

    @property
    def num_problems(self) -> int:
        return int(self.root.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.feat.shape[1])

    def to_dict(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(getattr(self, k)) for k in ALL_FIELDS}


def save(traces: TraceSet, out_dir: os.PathLike | str, meta: dict) -> Path:
    """Validates ``traces`` and writes ``nodes.safetensors`` + ``meta.json`` into ``out_dir``.

    ``meta`` needs at least ``benchmark``, ``synthetic``, ``models``; counts, feature dim,
    max depth, format version and content hash are filled in here. Files are written to
    temporary names and renamed, so an interrupted save never leaves a half-written set.
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v) for k, v in traces.to_dict().items()}
    for name, (dtype, _) in ALL_FIELDS.items():
        if arrays[name].dtype != dtype:
            raise TraceFormatError(out / NODES_FILE, name,
                                   f"dtype {arrays[name].dtype}, expected {dtype}")
    max_depth = int(arrays["depth"].max()) if arrays["depth"].size else 0
    full_meta = dict(meta)
    full_meta.update(
        format_version=FORMAT_VERSION,
        feature_dim=int(arrays["feat"].shape[1]),
        counts={"problems": int(arrays["root"].shape[0]), "nodes": int(arrays["prm"].shape[0])},
        max_depth=max_depth,
    )
    full_meta.setdefault("feature_names", [f"f{i}" for i in range(arrays["feat"].shape[1])])
    validate_arrays(arrays, full_meta, out / NODES_FILE)
    write_arrays_and_meta(out / NODES_FILE, arrays, out / META_FILE, full_meta)
    return out


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def _check_regular_file(path: Path) -> None:
    """Refuses ``path`` unless it is (or links to) a regular file, saying what it is instead:
    missing, a symlink to nothing, a directory, a character device (e.g. a link to the zero
    device), a block device, a FIFO or a socket (``TraceFormatError``, field ``<file>``)."""
    if path.is_file():
        return
    link = path.is_symlink()
    target = os.path.realpath(path) if link else None
    if not path.exists():
        problem = f"is a symlink to {target}, which does not exist" if link else "missing"
    else:
        mode = path.stat().st_mode
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        via = f" (a symlink to {target})" if link else ""
        problem = f"is {kind}{via}, not a regular file"
    raise TraceFormatError(path, "<file>", problem)


#: Rows (of ``traces stats`` and the evaluation tables) whose numbers come from one role's
#: model: a stand-in in that role (``stand_in_roles``) makes them the stand-in's numbers.
STAND_IN_ROWS = {"llm": ("All-LLM", "Draft then LLM (recompute)"),
                 "prm": ("RSD (online PRM)",)}


def stand_in_roles(meta: dict | None) -> dict[str, str]:
    """The roles a trace set's models fill only as stand-ins: ``{role: note}`` for each entry
    of ``meta["roles"]`` (written by the real builder's ``--role-notes``) whose note starts
    with "stand-in" (e.g. one small model playing the server LLM and the PRM). Empty for
    synthetic sets and sets built with the models the roles name."""
    roles = (meta or {}).get("roles")
    if not isinstance(roles, dict):
        return {}
    out = {}
    for role, entry in roles.items():
        note = entry.get("note") if isinstance(entry, dict) else entry
        if isinstance(note, str) and note.strip().lower().startswith("stand-in"):
            out[str(role)] = note.strip()
    return out


def read_meta(path: os.PathLike | str) -> dict:
    """Reads and checks ``meta.json`` of a trace folder."""
    path = Path(path)
    meta_path = path / META_FILE
    if not path.is_dir():
        raise TraceFormatError(path, "<folder>", "not a directory")
    _check_regular_file(meta_path)
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(meta_path, "<json>", f"not valid JSON ({e})") from None
    except RecursionError:
        raise TraceFormatError(meta_path, "<json>", "not valid JSON (nested too deeply)") from None
    except (ValueError, OSError) as e:   # e.g. an integer beyond the conversion limit
        raise TraceFormatError(meta_path, "<json>", f"unreadable ({e})") from None
    if not isinstance(meta, dict):
        raise TraceFormatError(meta_path, "<json>", "top level must be an object")
    for key in REQUIRED_META:
        if key not in meta:
            raise TraceFormatError(meta_path, key, "missing")
    version = meta["format_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceFormatError(meta_path, "format_version", f"must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise TraceFormatError(meta_path, "format_version",
                               f"version {version} is newer than this reader ({FORMAT_VERSION}); "
                               "upgrade prada_jax")
    if version < 1:
        raise TraceFormatError(meta_path, "format_version", f"invalid version {version}")
    if not isinstance(meta["synthetic"], bool):
        raise TraceFormatError(meta_path, "synthetic", "must be true or false")
    if not isinstance(meta["benchmark"], str) or not meta["benchmark"]:
        raise TraceFormatError(meta_path, "benchmark", "must be a non-empty string")
    models = meta["models"]
    if not isinstance(models, dict) or not all(isinstance(models.get(k), str)
                                               for k in ("slm", "llm", "prm")):
        raise TraceFormatError(meta_path, "models", "must hold string 'slm', 'llm' and 'prm'")
    if not _is_int(meta["feature_dim"]) or meta["feature_dim"] < 1:
        raise TraceFormatError(meta_path, "feature_dim", "must be a positive integer")
    if not _is_int(meta["max_depth"]) or meta["max_depth"] < 0:
        raise TraceFormatError(meta_path, "max_depth", "must be a non-negative integer")
    names = meta.get("feature_names")
    if names is not None and (not isinstance(names, list)
                              or len(names) != meta["feature_dim"]
                              or not all(isinstance(x, str) for x in names)):
        raise TraceFormatError(meta_path, "feature_names",
                               f"must be a list of {meta['feature_dim']} strings (feature_dim)")
    counts = meta["counts"]
    if not (isinstance(counts, dict) and _is_int(counts.get("problems"))
            and _is_int(counts.get("nodes"))):
        raise TraceFormatError(meta_path, "counts", "must hold integer 'problems' and 'nodes'")
    if counts["problems"] < 1 or counts["nodes"] < 1:   # before the splits: say what it is
        raise TraceFormatError(meta_path, "counts",
                               f"empty trace set ({counts['problems']} problems, "
                               f"{counts['nodes']} nodes)")
    if not isinstance(meta["content_hash"], str) or not meta["content_hash"].startswith("sha256:"):
        raise TraceFormatError(meta_path, "content_hash", "must be 'sha256:<hex>'")
    if "splits" in meta:
        try:
            meta["splits"] = check_splits(meta["splits"], counts["problems"], where=meta_path)
        except SplitError as e:
            raise TraceFormatError(meta_path, e.field, e.problem) from None
    return meta


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _read_arrays(nodes_path: Path) -> dict[str, np.ndarray]:
    _check_regular_file(nodes_path)
    try:
        # safetensors parses a JSON header and copies raw buffers: it cannot run code.
        return load_file(str(nodes_path))
    except (SafetensorError, OSError, ValueError, TypeError, KeyError, OverflowError,
            MemoryError) as e:
        raise TraceFormatError(nodes_path, "<safetensors>",
                               f"cannot parse (truncated or corrupt?): {e}") from None


def load(path: os.PathLike | str, *, check_hash: bool = True) -> TraceSet:
    """Loads and fully validates a trace folder.

    Args:
      path: folder with ``nodes.safetensors`` and ``meta.json``.
      check_hash: compare the sha256 of ``nodes.safetensors`` with ``meta.json``.

    Returns:
      a ``TraceSet`` of NumPy arrays (use ``jax.device_put`` to move it).

    Raises:
      TraceFormatError: naming the file and the field, for anything malformed.
    """
    path = Path(path)
    meta = read_meta(path)
    nodes_path = path / NODES_FILE
    if check_hash and nodes_path.is_file():
        actual = file_hash(nodes_path)
        if actual != meta["content_hash"]:
            raise TraceFormatError(nodes_path, "content_hash",
                                   f"file hash {actual[:19]}... does not match meta.json "
                                   f"({meta['content_hash'][:19]}...): file changed or corrupt")
    arrays = _read_arrays(nodes_path)
    validate_arrays(arrays, meta, nodes_path)
    return TraceSet(**{k: arrays[k] for k in ALL_FIELDS})


def validate(path: os.PathLike | str) -> dict:
    """Validates a trace folder; returns its meta. Raises ``TraceFormatError``."""
    load(path)
    return read_meta(path)


def unknown_meta_keys(meta: dict) -> list[str]:
    """Top-level keys of ``meta.json`` that no reader uses (neither required nor written by
    this package), sorted. They are allowed and kept as provenance."""
    return sorted(set(meta) - set(REQUIRED_META) - set(OPTIONAL_META))


def outside_links(path: os.PathLike | str) -> dict[str, str]:
    """``{file name: resolved target}`` of the folder's files (``nodes.safetensors``,
    ``meta.json``) that are symlinks to a file outside the folder. Such links are followed
    (sharing one large nodes file between folders is legitimate) and ``validate`` reports
    them; ``meta.json``'s content hash pins the bytes of ``nodes.safetensors``, not of
    ``meta.json`` itself."""
    folder = Path(path).resolve()
    out = {}
    for name in (NODES_FILE, META_FILE):
        p = Path(path) / name
        if p.is_symlink():
            target = p.resolve()
            if folder not in target.parents:
                out[name] = str(target)
    return out


def validate_notes(path: os.PathLike | str, meta: dict) -> list[str]:
    """What ``validate`` says about a valid folder besides "OK": files that are symlinks to
    outside the folder, and ``meta.json`` keys no reader uses."""
    pinned = {NODES_FILE: "followed; its bytes checked against meta.json's content_hash",
              META_FILE: "followed; its format checked, but no hash pins its content"}
    notes = [f"{name} is a symlink to {target}, outside the folder ({pinned[name]})"
             for name, target in outside_links(path).items()]
    extra = unknown_meta_keys(meta)
    if extra:
        notes.append(f"{META_FILE} keys not read by prada_jax, kept as provenance: "
                     f"{', '.join(extra)}")
    return notes


def validate_arrays(arrays: dict[str, np.ndarray], meta: dict, where: os.PathLike | str) -> None:
    """Checks every field of a trace set's arrays. Raises ``TraceFormatError`` naming it."""
    where = Path(where)
    n, p = _check_fields(arrays, meta, where)
    _check_values(arrays, where)
    _check_tree(arrays, meta, n, where)
    _check_problems(arrays, n, p, where)
    child = arrays["child"]
    # The PRM of a prefix is the same text's score whether read at the parent or the child.
    has = child >= 0
    gap = np.abs(arrays["prm"][np.maximum(child, 0)] - arrays["cand_prm"])
    if np.any(has & (gap > PRM_CHILD_ATOL)):
        node = int(np.argwhere(has & (gap > PRM_CHILD_ATOL))[0][0])
        raise TraceFormatError(where, "prm", f"node {node}: prm of a child differs from the "
                               f"parent's cand_prm by more than {PRM_CHILD_ATOL}")


def _check_fields(arrays: dict, meta: dict, where: Path) -> tuple[int, int]:
    """Every field present with its dtype and shape, the meta's counts; returns (N nodes,
    P problems)."""
    for name in ALL_FIELDS:
        if name not in arrays:
            raise TraceFormatError(where, name, "missing")
    extra = set(arrays) - set(ALL_FIELDS)
    if extra:
        raise TraceFormatError(where, sorted(extra)[0], "unknown field")
    n = arrays["prm"].shape[0] if arrays["prm"].ndim == 1 else -1
    p = arrays["root"].shape[0] if arrays["root"].ndim == 1 else -1
    f = meta.get("feature_dim")
    dims = {"N": n, "P": p, "F": f}
    for name, (dtype, spec) in ALL_FIELDS.items():
        a = arrays[name]
        if a.dtype != dtype:
            raise TraceFormatError(where, name, f"dtype {a.dtype}, expected {dtype}")
        want = tuple(dims[s] if isinstance(s, str) else s for s in spec)
        if a.shape != want:
            raise TraceFormatError(where, name, f"shape {a.shape}, expected {want} "
                                   f"(N={n} nodes, P={p} problems, F={f} from meta feature_dim)")
    counts = meta.get("counts", {})
    if counts.get("nodes") != n:
        raise TraceFormatError(where, "counts.nodes", f"meta says {counts.get('nodes')}, file has {n}")
    if counts.get("problems") != p:
        raise TraceFormatError(where, "counts.problems",
                               f"meta says {counts.get('problems')}, file has {p}")
    if n < 1 or p < 1:
        raise TraceFormatError(where, "prm" if n < 1 else "root", "empty trace set")
    return n, p


def _check_values(arrays: dict, where: Path) -> None:
    """Finite features and scores, scores in [0, 1], token counts >= 1, 0/1 flags, ``correct``
    only on terminal candidates."""
    for name in ("feat", "prm", "cand_prm"):
        if not np.all(np.isfinite(arrays[name])):
            bad = int(np.argwhere(~np.isfinite(arrays[name]))[0][0])
            raise TraceFormatError(where, name, f"non-finite value at node {bad}")
    for name in ("prm", "cand_prm"):
        a = arrays[name]
        if a.min() < 0 or a.max() > 1:
            raise TraceFormatError(where, name, f"values must lie in [0, 1], got "
                                   f"[{a.min():.4g}, {a.max():.4g}]")
    for name in ("cand_tokens", "ctx_tokens"):
        if arrays[name].min() < 1:
            raise TraceFormatError(where, name, "token counts must be >= 1")
    for name in ("terminal", "correct"):
        if arrays[name].max() > 1:
            raise TraceFormatError(where, name, "must be 0 or 1")
    terminal = arrays["terminal"].astype(bool)
    if np.any(arrays["correct"].astype(bool) & ~terminal):
        raise TraceFormatError(where, "correct", "set on a non-terminal candidate")


def _check_tree(arrays: dict, meta: dict, n: int, where: Path) -> None:
    """Successor ids in range, depths, no dangling candidate, every edge one step deeper."""
    terminal = arrays["terminal"].astype(bool)
    child, fallback, depth = arrays["child"], arrays["fallback"], arrays["depth"]
    if child.min() < -1 or child.max() >= n:
        raise TraceFormatError(where, "child", f"ids must be -1 or in [0, {n}), got "
                               f"[{child.min()}, {child.max()}]")
    if fallback.min() < -1 or fallback.max() >= n:
        raise TraceFormatError(where, "fallback", f"ids must be -1 or in [0, {n}), got "
                               f"[{fallback.min()}, {fallback.max()}]")
    if np.any(terminal & (child >= 0)):
        raise TraceFormatError(where, "child", "a terminal candidate has a successor")
    if depth.min() < 0:
        raise TraceFormatError(where, "depth", "must be >= 0")
    max_depth = meta.get("max_depth")
    if max_depth is not None and depth.max() > max_depth:
        raise TraceFormatError(where, "depth", f"{depth.max()} exceeds meta max_depth {max_depth}")

    # Every non-terminal candidate has somewhere to go: its child, else the fallback.
    dangling = ~terminal & (child < 0) & (fallback[:, None] < 0)
    if np.any(dangling):
        node = int(np.argwhere(dangling)[0][0])
        raise TraceFormatError(where, "fallback",
                               f"node {node}: a non-terminal candidate has no child and no "
                               "fallback (a path with no end)")
    # Edges go one step deeper: no cycles, and every path ends within max_depth + 1 steps.
    ids = np.arange(n)
    for c in (0, 1):
        has = child[:, c] >= 0
        bad = has & (depth[np.maximum(child[:, c], 0)] != depth + 1)
        if np.any(bad):
            node = int(ids[bad][0])
            raise TraceFormatError(where, "child", f"node {node}: child {child[node, c]} is not "
                                   "one step deeper (cycle or malformed tree)")
    has_fb = fallback >= 0
    bad = has_fb & (depth[np.maximum(fallback, 0)] != depth + 1)
    if np.any(bad):
        node = int(ids[bad][0])
        raise TraceFormatError(where, "fallback", f"node {node}: fallback {fallback[node]} is not "
                               "one step deeper (cycle or malformed tree)")


def _check_problems(arrays: dict, n: int, p: int, where: Path) -> None:
    """Each problem's nodes a contiguous block from its root, edges inside the problem."""
    child, fallback, depth = arrays["child"], arrays["fallback"], arrays["depth"]
    # Nodes of a problem are contiguous from its root; edges stay inside the problem.
    root, n_nodes, problem = arrays["root"], arrays["n_nodes"], arrays["problem"]
    if np.any(n_nodes < 1) or int(n_nodes.sum()) != n:
        raise TraceFormatError(where, "n_nodes", f"must be >= 1 and sum to {n}")
    starts = np.concatenate([[0], np.cumsum(n_nodes)[:-1]]).astype(np.int64)
    if not np.array_equal(root.astype(np.int64), starts):
        raise TraceFormatError(where, "root", "roots must be the first node of each problem's "
                               "contiguous block")
    if not np.array_equal(problem, np.repeat(np.arange(p, dtype=np.int32), n_nodes)):
        raise TraceFormatError(where, "problem", "does not match root/n_nodes blocks")
    if np.any(depth[root] != 0):
        raise TraceFormatError(where, "depth", "roots must have depth 0")
    for name, succ in (("child", child), ("fallback", fallback[:, None])):
        src = np.broadcast_to(problem[:, None], succ.shape)
        ok = (succ < 0) | (problem[np.maximum(succ, 0)] == src)
        if not np.all(ok):
            node = int(np.argwhere(~ok)[0][0])
            raise TraceFormatError(where, name, f"node {node} points into another problem")


def write_splits(folder, seed: int = 0, fractions=DEFAULT_FRACTIONS) -> dict[str, list[int]]:
    """Adds a ``splits`` record (``splits.problem_split`` of its problem count) to the
    ``meta.json`` of a trace folder that has none, writing it atomically; returns the record.
    A folder that already has one is refused (:class:`SplitError`): a split, once used, is
    not redrawn."""
    meta = read_meta(folder)
    if "splits" in meta:
        raise SplitError(f"{folder}: meta.json already has 'splits'")
    rec = problem_split(int(meta["counts"]["problems"]), seed, fractions)
    meta_path = Path(folder) / META_FILE
    raw = read_json(meta_path)   # validated by the load above
    raw["splits"] = rec
    raw["split_rule"] = {"seed": int(seed), "fractions": [float(f) for f in fractions]}
    write_json(meta_path, raw, indent=2, sort_keys=True, newline=False)
    return rec
