"""Teacher-logit exporter (library): scores pool or student sequences with a PyTorch HF teacher.

The command is ``python -m prada_jax.distill.export`` (``export/__main__.py``, absl flags)::

  python -m prada_jax.distill.export --teacher=PATH --pool=POOL_DIR --out=DIR \\
      [--top_k=64] [--batch_tokens=4096] [--shard_tokens=65536] [--device=cpu] \\
      [--dtype=float32] [--value_dtype=float16] [--temperature=1.0] [--tokenizer=PATH]
  python -m prada_jax.distill.export --teacher=PATH --sequences=FILE.jsonl --out=DIR ...

``--pool``: every trajectory ``i`` of the pool is scored under sequence id ``str(i)``.
``--sequences``: one JSON object per line, ``{"id": ..., "tokens": [...]}`` (student-sampled
continuations for the on-policy mode); ids are stored as strings.
Rerunning the same command on the same ``--out`` resumes (finished shards are kept; the
remaining sequences are re-scored in the same batches, so the shards come out identical).
The teacher's tokenizer must equal the pool's (fingerprint of the vocabulary items); teacher
output rows beyond the tokenizer's length (embedding padding) are excluded from the softmax.
torch and transformers are imported only when the exporter runs.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from tqdm import tqdm

from prada_jax.distill import logits_store, scoring
from prada_jax.distill.pool import load_pool
from prada_jax.errors import BadInput


def read_sequences_jsonl(path: str) -> tuple[list[str], list[list[int]]]:
    """Reads ``{"id", "tokens"}`` lines; errors name the file and line."""
    if not os.path.isfile(path):
        raise BadInput(f"--sequences {path}: file not found")
    ids, seqs, seen = [], [], set()
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                seq_id, toks = str(rec["id"]), rec["tokens"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise BadInput(f"{path}:{lineno}: expected an object with 'id' and 'tokens' "
                                 f"({e})") from e
            if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                     for t in toks):
                raise BadInput(f"{path}:{lineno}: 'tokens' must be a list of ints")
            if seq_id in seen:
                raise BadInput(f"{path}:{lineno}: duplicate id {seq_id!r}")
            seen.add(seq_id)
            ids.append(seq_id)
            seqs.append(toks)
    return ids, seqs


def check_tokenizer(teacher_fingerprint: str, teacher_len: int, expected: Mapping[str, Any],
                    teacher_where: str, data_where: str) -> None:
    """Refuses a teacher whose tokenizer differs from the data's (fingerprint and length)."""
    fp = expected.get("fingerprint")
    n = expected.get("vocab_size")
    if fp is not None and fp != teacher_fingerprint:
        raise BadInput(f"tokenizer mismatch: the teacher tokenizer at {teacher_where} has "
                         f"fingerprint {teacher_fingerprint} ({teacher_len} tokens) but "
                         f"{data_where} was tokenized with fingerprint {fp} ({n} tokens)")
    if n is not None and int(n) != teacher_len:
        raise BadInput(f"tokenizer mismatch: the teacher tokenizer at {teacher_where} has "
                         f"{teacher_len} tokens but {data_where} says vocab_size={n}")


def export_logits(model, seq_ids: Sequence[str], seqs: Sequence[Sequence[int]], out_dir: str, *,
                  meta: Mapping[str, Any], vocab_size: int, top_k: int = 64,
                  batch_tokens: int = 4096, shard_tokens: int = 1 << 16,
                  value_dtype: str = "float16", temperature: float = 1.0, device=None,
                  progress: bool = True,
                  on_shard_written: Callable[[int], None] | None = None) -> dict:
    """Scores ``seqs`` with the torch ``model`` and streams them into a logit store.

    Memory is bounded by one batch of logits (``batch_tokens`` × V floats) plus one shard of
    top-k rows (``shard_tokens`` × bytes/token). Shards end on batch boundaries, so a resumed
    export re-forms the same batches and writes byte-identical shards.

    Args:
      model: transformers causal LM (eval mode).
      seq_ids: N unique ids (stored as strings).
      seqs: N token lists.
      out_dir: store folder (resumed if it holds an index with the same meta / top_k).
      meta: stored in the index (teacher, tokenizer fingerprint, ...).
      vocab_size: the tokenizer's length; output rows past it are dropped.
      top_k, batch_tokens, shard_tokens, value_dtype, temperature, device: see the CLI flags.
      progress: show a tqdm bar (tokens).
      on_shard_written: called with the number of shards written so far after each shard.

    Returns:
      {"sequences", "tokens" (scored this run), "seconds", "tokens_per_s", "bytes",
       "bytes_per_token", "skipped"}.
    """
    if len(seq_ids) != len(seqs):
        raise ValueError("seq_ids and seqs must have the same length")
    for i, s in zip(seq_ids, seqs):
        arr = np.asarray(s)
        bad = arr[(arr < 0) | (arr >= vocab_size)]
        if bad.size:
            raise ValueError(f"sequence {i!r}: token id {int(bad[0])} outside [0, {vocab_size})")
    writer = logits_store.LogitStoreWriter(out_dir, top_k, meta, shard_tokens=shard_tokens,
                                           value_dtype=value_dtype)
    total = sum(max(len(s) - 1, 0) for s in seqs)
    scored, skipped = 0, 0
    bar = tqdm(total=total, unit="tok", desc="teacher logits", disable=not progress)
    start = time.perf_counter()
    shards_before = len(writer.index["shards"])
    for idx in scoring.plan_batches([len(s) for s in seqs], batch_tokens):
        todo = [i for i in idx if not writer.done(seq_ids[i])]
        n_tok = sum(max(len(seqs[i]) - 1, 0) for i in idx)
        if not todo:
            skipped += len(idx)
            bar.update(n_tok)
            continue
        results = scoring.score_subset(model, [seqs[i] for i in todo], top_k=top_k, device=device,
                                       temperature=temperature, vocab_size=vocab_size)
        for i, r in zip(todo, results):
            writer.add(seq_ids[i], r)
            scored += r["logp_actual"].shape[0]
        skipped += len(idx) - len(todo)
        bar.update(n_tok)
        if writer.maybe_flush() and on_shard_written is not None:
            on_shard_written(len(writer.index["shards"]))
    writer.close()
    bar.close()
    seconds = time.perf_counter() - start
    new_shards = writer.index["shards"][shards_before:]
    nbytes = sum(s["bytes"] for s in new_shards)
    return {"sequences": len(seqs), "tokens": scored, "seconds": seconds,
            "tokens_per_s": scored / seconds if seconds > 0 else float("nan"), "bytes": nbytes,
            "bytes_per_token": nbytes / scored if scored else float("nan"), "skipped": skipped}


TORCH_DTYPES = ("float32", "bfloat16", "float16")


def export_store(teacher: str, out: str, *, pool: str | None = None,
                 sequences: str | None = None, top_k: int = 64, batch_tokens: int = 4096,
                 shard_tokens: int = 1 << 16, device: str = "cpu", dtype: str = "float32",
                 value_dtype: str = "float16", temperature: float = 1.0,
                 tokenizer: str | None = None, tokenizer_fingerprint: str | None = None,
                 progress: bool = True) -> dict:
    """Scores a pool's trajectories (ids ``str(i)``) or a JSONL file's sequences with the
    teacher folder and writes (or resumes) the logit store ``out``: the one on-disk teacher-logit
    format (:mod:`prada_jax.distill.logits_store`). Every bad input — a missing or damaged
    teacher folder (a truncated weight shard is named), a folder without tokenizer files, a
    tokenizer that differs from the pool's, ``top_k`` above the vocabulary (checked before the
    teacher loads), a damaged or differently configured existing store — raises
    :class:`~prada_jax.errors.BadInput` naming the flag or file. Returns the statistics of
    :func:`export_logits`."""
    if (pool is None) == (sequences is None):
        raise BadInput("exactly one of --pool and --sequences is needed")
    tok_dir = tokenizer or teacher
    scoring.check_teacher_files(teacher)
    tok = scoring.load_tokenizer(tok_dir, "--tokenizer" if tokenizer else "--teacher")
    fingerprint = scoring.tokenizer_fingerprint(tok)
    n_tok = len(tok)
    if not 1 <= top_k <= n_tok:
        raise BadInput(f"--top_k={top_k}: must lie in [1, {n_tok}] (the tokenizer at {tok_dir} "
                       f"has {n_tok} tokens)")
    if pool is not None:
        p = load_pool(pool)
        expected = p.meta["tokenizer"]
        data_where = os.path.join(pool, "pool.json")
        offsets = np.asarray(p.traj_offsets, np.int64)
        tokens = np.asarray(p.tokens)
        # Views into the pool's token array: no per-token Python objects for large pools.
        seqs = [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        seq_ids = [str(i) for i in range(len(seqs))]
        source = {"pool": os.path.abspath(pool),
                  "pool_content_hash": p.meta.get("content_hash")}
    else:
        seq_ids, seqs = read_sequences_jsonl(sequences)
        expected = {"fingerprint": tokenizer_fingerprint}
        data_where = sequences
        source = {"sequences": os.path.abspath(sequences)}
    check_tokenizer(fingerprint, n_tok, expected, tok_dir, data_where)
    for i, s in zip(seq_ids, seqs):
        arr = np.asarray(s)
        bad = arr[(arr < 0) | (arr >= n_tok)]
        if bad.size:
            raise BadInput(f"{data_where}: sequence {i!r}: token id {int(bad[0])} outside "
                           f"[0, {n_tok}) of the tokenizer at {tok_dir}")
    # a store being resumed must be intact, with the same top_k / dtypes: refuse before the
    # teacher loads
    index_path = os.path.join(out, logits_store.INDEX_FILE)
    if os.path.isfile(index_path):
        idx = logits_store.TeacherLogits.open(out).index   # every listed shard intact
        if idx["top_k"] != top_k or idx["dtypes"].get("topk_logp") != value_dtype:
            raise logits_store.LogitStoreError(
                f"{index_path}: existing store has top_k={idx['top_k']}, topk_logp dtype "
                f"{idx['dtypes'].get('topk_logp')}; cannot resume with --top_k={top_k}, "
                f"--value_dtype={value_dtype} (use another --out)")
    model = scoring.load_teacher(teacher, dtype=dtype, device=device)
    rows = model.get_output_embeddings().weight.shape[0]
    if rows < n_tok:
        raise BadInput(f"--teacher {teacher}: {rows} output rows < {n_tok} tokenizer tokens")
    meta = {"teacher": os.path.abspath(teacher),
            "teacher_model_type": model.config.model_type, "teacher_vocab_rows": int(rows),
            "vocab_size": n_tok, "tokenizer_fingerprint": fingerprint,
            "temperature": temperature, "compute_dtype": dtype, **source}
    return export_logits(model, seq_ids, seqs, out, meta=meta, vocab_size=n_tok, top_k=top_k,
                         batch_tokens=batch_tokens, shard_tokens=shard_tokens,
                         value_dtype=value_dtype, temperature=temperature, device=device,
                         progress=progress)
