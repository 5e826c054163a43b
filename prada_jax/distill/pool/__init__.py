"""Trajectory pool format: recorded multi-turn teacher trajectories, their files and validation.

A pool is one folder with two files (docs/design.md §7):

* ``pool.safetensors`` (no pickle). ``T`` tokens in all, ``N`` trajectories, ``K`` agent turns:

  ================  =======  =======  ===========================================================
  field             shape    dtype    meaning
  ================  =======  =======  ===========================================================
  ``tokens``        [T]      int32    token ids of all trajectories, concatenated
  ``action_mask``   [T]      uint8    1 = agent action token, 0 = prompt / environment / tool
  ``traj_offsets``  [N+1]    int64    trajectory i = ``tokens[traj_offsets[i]:traj_offsets[i+1]]``
  ``turn_offsets``  [N+1]    int64    agent turns of trajectory i = ``turn_offsets[i]:[i+1]``
  ``turn_starts``   [K]      int64    absolute start (inclusive) of each agent turn's tokens
  ``turn_ends``     [K]      int64    absolute end (exclusive) of each agent turn's tokens
  ``success``       [N]      uint8    the trajectory solved its task (0/1)
  ================  =======  =======  ===========================================================

* ``pool.json``: ``format_version``, ``task`` (name), ``counts`` (``tokens``, ``trajectories``,
  ``turns``), ``tokenizer`` (``name``, ``vocab_size``, ``fingerprint``), ``content_hash``
  (``sha256:`` of the bytes of ``pool.safetensors``), plus free-form ``source``/``synthetic``.

Invariants the validator checks: offsets start at 0, are non-decreasing and end at the array
lengths; every trajectory has at least one agent turn; turns are non-empty, ordered, do not
overlap and lie inside their trajectory; the action mask is 1 exactly on the tokens of the
agent turns; token ids lie in ``[0, vocab_size)``. Agent turn ``t`` of a trajectory is counted
**from 0** (the first agent turn is t = 0); the replayed prefix of turn t is every token of the
trajectory before ``turn_starts[t]``.

Loading parses safetensors and JSON only: nothing in the files can run code.
The converter ``python -m prada_jax.distill.pool convert --jsonl F --tokenizer DIR --out DIR``
turns chat-formatted JSONL (one object per line with ``messages``: ``[{"role", "content"}]``,
optional ``success`` and ``task``) into a pool through the tokenizer's chat template.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from flax import struct
from safetensors import SafetensorError
from safetensors.numpy import load_file

from prada_jax.distill.scoring import tokenizer_fingerprint
from prada_jax.errors import BadInput
from prada_jax.safetensors_folder import file_hash, write_arrays_and_meta

FORMAT_VERSION = 1
POOL_FILE = "pool.safetensors"
META_FILE = "pool.json"

FIELDS: dict[str, np.dtype] = {
    "tokens": np.dtype(np.int32),
    "action_mask": np.dtype(np.uint8),
    "traj_offsets": np.dtype(np.int64),
    "turn_offsets": np.dtype(np.int64),
    "turn_starts": np.dtype(np.int64),
    "turn_ends": np.dtype(np.int64),
    "success": np.dtype(np.uint8),
}
REQUIRED_META = ("format_version", "task", "counts", "tokenizer", "content_hash")
AGENT_ROLES = ("assistant",)


class PoolFormatError(BadInput):
    """A pool folder or array set that is malformed. The message names the file and field."""

    def __init__(self, path: os.PathLike | str, field: str, problem: str):
        self.path = str(path)
        self.field = field
        super().__init__(f"{path}: field '{field}': {problem}")


@struct.dataclass
class Pool:
    """Arrays + metadata of one trajectory pool (shapes in the module docstring)."""

    tokens: Any
    action_mask: Any
    traj_offsets: Any
    turn_offsets: Any
    turn_starts: Any
    turn_ends: Any
    success: Any
    meta: dict = struct.field(pytree_node=False, default_factory=dict)

    @property
    def num_trajectories(self) -> int:
        return int(self.traj_offsets.shape[0] - 1)

    @property
    def num_turns(self) -> int:
        return int(self.turn_starts.shape[0])

    def turns_per_trajectory(self) -> np.ndarray:
        """[N] int64 number of agent turns of each trajectory."""
        return np.diff(np.asarray(self.turn_offsets))

    def trajectory(self, i: int) -> np.ndarray:
        """[L_i] int32 tokens of trajectory i."""
        a, b = int(self.traj_offsets[i]), int(self.traj_offsets[i + 1])
        return np.asarray(self.tokens[a:b])

    def trajectories(self) -> list[np.ndarray]:
        return [self.trajectory(i) for i in range(self.num_trajectories)]

    def to_dict(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(getattr(self, k)) for k in FIELDS}


def _check_offsets(name: str, off: np.ndarray, total: int, where) -> None:
    if off.ndim != 1 or off.shape[0] < 1:
        raise PoolFormatError(where, name, f"must be 1-D with >= 1 entry, got shape {off.shape}")
    if off[0] != 0:
        raise PoolFormatError(where, name, f"must start at 0, got {int(off[0])}")
    if np.any(np.diff(off) < 0):
        i = int(np.argmax(np.diff(off) < 0))
        raise PoolFormatError(where, name, f"must be non-decreasing (entry {i + 1} < entry {i})")
    if off[-1] != total:
        raise PoolFormatError(where, name, f"must end at {total}, got {int(off[-1])}")


def validate_arrays(arrays: dict[str, np.ndarray], vocab_size: int | None = None,
                    where: os.PathLike | str = POOL_FILE) -> None:
    """Checks dtypes, shapes and the structural invariants of the pool arrays.

    Raises:
      PoolFormatError naming ``where`` and the offending field.
    """
    for name, dtype in FIELDS.items():
        if name not in arrays:
            raise PoolFormatError(where, name, "missing")
        a = arrays[name]
        if a.dtype != dtype:
            raise PoolFormatError(where, name, f"dtype {a.dtype}, expected {dtype}")
        if a.ndim != 1:
            raise PoolFormatError(where, name, f"must be 1-D, got shape {a.shape}")
    tokens, mask = arrays["tokens"], arrays["action_mask"]
    to, uo = arrays["traj_offsets"], arrays["turn_offsets"]
    ts, te = arrays["turn_starts"], arrays["turn_ends"]
    T, N, K = tokens.shape[0], to.shape[0] - 1, ts.shape[0]
    if mask.shape[0] != T:
        raise PoolFormatError(where, "action_mask",
                              f"has {mask.shape[0]} entries but tokens has {T}: "
                              "the action mask does not fit the tokens")
    if np.any(mask > 1):
        raise PoolFormatError(where, "action_mask", "values must be 0 or 1")
    if vocab_size is not None and T and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise PoolFormatError(where, "tokens",
                              f"ids must lie in [0, {vocab_size}), got [{tokens.min()}, "
                              f"{tokens.max()}]")
    _check_offsets("traj_offsets", to, T, where)
    if uo.shape[0] != N + 1:
        raise PoolFormatError(where, "turn_offsets",
                              f"has {uo.shape[0]} entries, expected N+1 = {N + 1}")
    _check_offsets("turn_offsets", uo, K, where)
    if te.shape[0] != K:
        raise PoolFormatError(where, "turn_ends", f"has {te.shape[0]} entries, expected {K}")
    if arrays["success"].shape[0] != N:
        raise PoolFormatError(where, "success",
                              f"has {arrays['success'].shape[0]} entries, expected {N}")
    if np.any(arrays["success"] > 1):
        raise PoolFormatError(where, "success", "values must be 0 or 1")
    n_turns = np.diff(uo)
    if N and np.any(n_turns < 1):
        i = int(np.argmax(n_turns < 1))
        raise PoolFormatError(where, "turn_offsets",
                              f"trajectory {i} has no agent turns (need >= 1)")
    if np.any(te <= ts):
        k = int(np.argmax(te <= ts))
        raise PoolFormatError(where, "turn_ends", f"turn {k} is empty or reversed")
    traj_of_turn = np.repeat(np.arange(N), n_turns)
    lo, hi = to[traj_of_turn], to[traj_of_turn + 1]
    bad = (ts < lo) | (te > hi)
    if np.any(bad):
        k = int(np.argmax(bad))
        raise PoolFormatError(where, "turn_starts",
                              f"turn {k} [{ts[k]}, {te[k]}) lies outside its trajectory "
                              f"{traj_of_turn[k]} [{lo[k]}, {hi[k]})")
    if K > 1:
        same = traj_of_turn[1:] == traj_of_turn[:-1]
        overlap = same & (ts[1:] < te[:-1])
        if np.any(overlap):
            k = int(np.argmax(overlap)) + 1
            raise PoolFormatError(where, "turn_starts",
                                  f"turn {k} starts before turn {k - 1} ends (turns must be "
                                  "ordered and disjoint)")
    expected = np.zeros(T, np.int64)
    np.add.at(expected, ts, 1)
    np.add.at(expected, te[te < T], -1)
    expected = np.cumsum(expected)
    if np.any(expected.astype(np.uint8) != mask):
        j = int(np.argmax(expected.astype(np.uint8) != mask))
        raise PoolFormatError(where, "action_mask",
                              f"does not fit the turn spans (first mismatch at token {j}: "
                              f"mask {mask[j]}, turn spans say {int(expected[j])})")


def _check_meta(meta: dict, where) -> None:
    if not isinstance(meta, dict):
        raise PoolFormatError(where, "<json>", "top level must be an object")
    for key in REQUIRED_META:
        if key not in meta:
            raise PoolFormatError(where, key, "missing")
    v = meta["format_version"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise PoolFormatError(where, "format_version", f"must be a positive integer, got {v!r}")
    if v > FORMAT_VERSION:
        raise PoolFormatError(where, "format_version",
                              f"version {v} is newer than this reader ({FORMAT_VERSION})")
    tok = meta["tokenizer"]
    if not isinstance(tok, dict) or not isinstance(tok.get("vocab_size"), int) \
            or tok["vocab_size"] < 1 or "name" not in tok or "fingerprint" not in tok:
        raise PoolFormatError(where, "tokenizer",
                              "must be an object with name, vocab_size (int > 0), fingerprint")
    counts = meta["counts"]
    if not isinstance(counts, dict) or not all(
            isinstance(counts.get(k), int) for k in ("tokens", "trajectories", "turns")):
        raise PoolFormatError(where, "counts", "must hold integer tokens, trajectories, turns")


def build_arrays(trajectories: Sequence[Sequence[int]],
                 turn_spans: Sequence[Sequence[tuple[int, int]]],
                 success: Sequence[int]) -> dict[str, np.ndarray]:
    """Builds pool arrays from per-trajectory token lists and agent-turn spans.

    Args:
      trajectories: N lists of token ids.
      turn_spans: N lists of (start, end) spans relative to their trajectory, end exclusive.
      success: N values in {0, 1}.
    """
    if not (len(trajectories) == len(turn_spans) == len(success)):
        raise ValueError("trajectories, turn_spans and success must have the same length")
    lens = np.array([len(t) for t in trajectories], np.int64)
    to = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    nt = np.array([len(s) for s in turn_spans], np.int64)
    uo = np.concatenate([[0], np.cumsum(nt)]).astype(np.int64)
    starts = [to[i] + s for i, spans in enumerate(turn_spans) for s, _ in spans]
    ends = [to[i] + e for i, spans in enumerate(turn_spans) for _, e in spans]
    tokens = (np.concatenate([np.asarray(t, np.int64) for t in trajectories])
              if len(trajectories) else np.zeros(0, np.int64))
    mask = np.zeros(tokens.shape[0], np.uint8)
    for s, e in zip(starts, ends):
        mask[s:e] = 1
    return dict(tokens=tokens.astype(np.int32), action_mask=mask, traj_offsets=to,
                turn_offsets=uo, turn_starts=np.asarray(starts, np.int64),
                turn_ends=np.asarray(ends, np.int64),
                success=np.asarray(success, np.uint8))


def make_pool(arrays: dict[str, np.ndarray], meta: dict) -> Pool:
    return Pool(**{k: arrays[k] for k in FIELDS}, meta=meta)


def save_pool(pool: Pool | dict, out_dir: os.PathLike | str, meta: dict | None = None) -> Path:
    """Validates and writes ``pool.safetensors`` + ``pool.json`` (atomic renames).

    ``meta`` (or ``pool.meta``) needs ``task`` and ``tokenizer``; version, counts and hash are
    filled in here.
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(pool, Pool):
        arrays, base_meta = pool.to_dict(), dict(pool.meta)
    else:
        arrays, base_meta = dict(pool), {}
    base_meta.update(meta or {})
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    for key in ("task", "tokenizer"):
        if key not in base_meta:
            raise PoolFormatError(out / META_FILE, key, "missing")
    full = dict(base_meta)
    full.update(format_version=FORMAT_VERSION,
                counts={"tokens": int(arrays["tokens"].shape[0]),
                        "trajectories": int(arrays["traj_offsets"].shape[0] - 1),
                        "turns": int(arrays["turn_starts"].shape[0])},
                content_hash="")
    _check_meta(full, out / META_FILE)
    validate_arrays(arrays, full["tokenizer"]["vocab_size"], out / POOL_FILE)
    write_arrays_and_meta(out / POOL_FILE, arrays, out / META_FILE, full)
    return out


def read_meta(path: os.PathLike | str) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise PoolFormatError(path, "<folder>", "not a directory")
    mp = path / META_FILE
    if not mp.is_file():
        raise PoolFormatError(mp, "<file>", "missing")
    try:
        meta = json.loads(mp.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PoolFormatError(mp, "<json>", f"not valid JSON ({e})") from None
    _check_meta(meta, mp)
    return meta


def load_pool(path: os.PathLike | str, check_hash: bool = True) -> Pool:
    """Loads and validates a pool folder. Raises PoolFormatError naming file and field."""

    path = Path(path)
    meta = read_meta(path)
    fp = path / POOL_FILE
    if not fp.is_file():
        raise PoolFormatError(fp, "<file>", "missing")
    if check_hash and file_hash(fp) != meta["content_hash"]:
        raise PoolFormatError(path / META_FILE, "content_hash",
                              f"does not match the bytes of {POOL_FILE} (file changed or corrupt)")
    try:
        arrays = load_file(str(fp))
    except (SafetensorError, OSError, ValueError) as e:
        raise PoolFormatError(fp, "<safetensors>", f"unreadable ({e})") from None
    validate_arrays(arrays, meta["tokenizer"]["vocab_size"], fp)
    counts = meta["counts"]
    got = {"tokens": int(arrays["tokens"].shape[0]),
           "trajectories": int(arrays["traj_offsets"].shape[0] - 1),
           "turns": int(arrays["turn_starts"].shape[0])}
    for k, v in got.items():
        if counts[k] != v:
            raise PoolFormatError(path / META_FILE, f"counts.{k}",
                                  f"says {counts[k]}, {POOL_FILE} has {v}")
    return make_pool(arrays, meta)


def validate_pool(path: os.PathLike | str) -> Pool:
    """Alias of :func:`load_pool` with the hash check (full validation)."""
    return load_pool(path, check_hash=True)


# ---------------------------------------------------------------------------------------------
# Chat-formatted JSONL -> pool
# ---------------------------------------------------------------------------------------------

def _render(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(list(messages), tokenize=True,
                                        add_generation_prompt=add_generation_prompt)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(x) for x in out]


def tokenize_conversation(tokenizer, messages: Sequence[dict], where: str = "<messages>"
                          ) -> tuple[list[int], list[tuple[int, int]]]:
    """Tokenizes one chat through the tokenizer's chat template and finds the agent turns.

    An assistant message's action tokens are those the template adds between
    ``render(messages[:i], add_generation_prompt=True)`` and ``render(messages[:i+1])`` (the
    content and the template's end-of-turn tokens); everything else (system/user/tool text and
    role headers) is prompt/environment. The template must be prefix-stable (each render is a
    prefix of the next), which holds for common templates; if not, a ValueError names the
    message.

    Returns:
      (token ids [L], agent-turn spans [(start, end)] with end exclusive).
    """
    if not tokenizer.chat_template:
        raise ValueError(f"{where}: the tokenizer has no chat_template")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"{where}: messages[{j}] needs 'role' and 'content'")
    full = _render(tokenizer, messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] not in AGENT_ROLES:
            continue
        prompt = _render(tokenizer, messages[:i], True)
        upto = _render(tokenizer, messages[: i + 1], False)
        if upto[: len(prompt)] != prompt or full[: len(upto)] != upto:
            raise ValueError(f"{where}: messages[{i}]: the chat template is not prefix-stable, "
                             "so agent tokens cannot be located")
        if len(upto) > len(prompt):
            spans.append((len(prompt), len(upto)))
    return full, spans


def tokenizer_meta(tokenizer, name: str | None = None) -> dict:
    """``{"name", "vocab_size", "fingerprint"}`` for ``pool.json`` (fingerprint:
    :func:`prada_jax.distill.scoring.tokenizer_fingerprint`, the one the exporter checks)."""
    return {"name": name or getattr(tokenizer, "name_or_path", "") or "unnamed",
            "vocab_size": int(len(tokenizer)), "fingerprint": tokenizer_fingerprint(tokenizer)}


def convert_jsonl(jsonl_path: os.PathLike | str, tokenizer, out_dir: os.PathLike | str,
                  task: str | None = None, tokenizer_name: str | None = None,
                  extra_meta: dict | None = None) -> Path:
    """Converts chat-formatted JSONL into a pool folder.

    Each line: ``{"messages": [{"role": ..., "content": ...}, ...], "success": 0/1 (optional,
    default 0), "task": str (optional)}``. Roles ``assistant`` are agent turns; any other role
    (system, user, tool, ...) is prompt/environment. A line with no assistant message raises
    an error naming the file and line.
    """
    jsonl_path = Path(jsonl_path)
    if not jsonl_path.is_file():
        raise FileNotFoundError(f"{jsonl_path}: no such JSONL file")
    trajs, spans, succ, tasks = [], [], [], set()
    with open(jsonl_path) as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{jsonl_path}:{ln}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise PoolFormatError(where, "<json>", f"not valid JSON ({e})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
                raise PoolFormatError(where, "messages", "missing or not a list")
            toks, sp = tokenize_conversation(tokenizer, rec["messages"], where)
            if not sp:
                raise PoolFormatError(where, "messages", "no assistant (agent) turn")
            s = rec.get("success", 0)
            if s not in (0, 1, True, False):
                raise PoolFormatError(where, "success", f"must be 0/1, got {s!r}")
            trajs.append(toks)
            spans.append(sp)
            succ.append(int(s))
            if "task" in rec:
                tasks.add(str(rec["task"]))
    if not trajs:
        raise PoolFormatError(jsonl_path, "<lines>", "no trajectories")
    meta = {"task": task or (tasks.pop() if len(tasks) == 1 else "mixed"),
            "tokenizer": tokenizer_meta(tokenizer, tokenizer_name),
            "source": {"jsonl": str(jsonl_path)}}
    meta.update(extra_meta or {})
    return save_pool(build_arrays(trajs, spans, succ), out_dir, meta)
