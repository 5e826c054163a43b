"""Joins the staged batches of a build into the final trace folder (``format.save``) with its
``problems.jsonl`` and ``steps.jsonl``."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from prada_jax.traces import datasets as datasets_lib
from prada_jax.traces import format as fmt
from prada_jax.traces.builder.staging import STAGING, batch_name, read_batch

__all__ = ["assemble"]


def assemble(out: Path, problems: Sequence[datasets_lib.Problem], batches: list[tuple[int, int]],
             meta: dict) -> dict:
    """Joins the staged batches into ``out`` (``format.save``), validates; returns the meta."""
    staging = out / STAGING
    parts, texts_all, extras = [], [], []
    for start, end in batches:
        arrays, texts, extra = read_batch(staging / batch_name(start, end))
        parts.append(arrays)
        texts_all += [pair for problem_texts in texts for pair in problem_texts]
        extras.append(extra)
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    n_nodes = cat["n_nodes"]
    roots = np.concatenate([[0], np.cumsum(n_nodes)[:-1]]).astype(np.int32)
    offset = np.repeat(roots, n_nodes)
    child = np.where(cat["child"] >= 0, cat["child"] + offset[:, None], -1).astype(np.int32)
    fallback = np.where(cat["fallback"] >= 0, cat["fallback"] + offset, -1).astype(np.int32)
    traces = fmt.TraceSet(
        feat=cat["feat"], prm=cat["prm"], cand_prm=cat["cand_prm"],
        cand_tokens=cat["cand_tokens"], ctx_tokens=cat["ctx_tokens"], child=child,
        terminal=cat["terminal"], correct=cat["correct"], fallback=fallback, depth=cat["depth"],
        problem=np.repeat(np.arange(len(n_nodes), dtype=np.int32), n_nodes), root=roots,
        n_nodes=n_nodes.astype(np.int32), answer_id=cat["problem_index"].astype(np.int32))
    fallback_uses = int((fallback >= 0).sum())
    gen = dict(meta.get("generator", {}))
    gen.update(
        completion_nodes=int(cat["completion"].sum()),
        nodes_with_fallback=fallback_uses,
        fallback_other_branch=int(sum(e.get("fallback_other_branch", 0) for e in extras)),
        fallback_same_depth=int(sum(e.get("fallback_same_depth", 0) for e in extras)),
        answer_checks=int(sum(e.get("checks", 0) for e in extras)),
        answer_check_timeouts=int(sum(e.get("timeouts", 0) for e in extras)),
        build_seconds=float(sum(e.get("seconds", 0.0) for e in extras)),
        max_prm_rescore_diff=float(max(e.get("max_prm_rescore_diff", 0.0) for e in extras)),
    )
    full_meta = dict(meta, generator=gen)
    fmt.save(traces, out, full_meta)
    with open(out / "problems.jsonl.tmp", "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps({"answer_id": p.index, "question": p.question,
                                "answer": p.answer, "kind": p.kind}) + "\n")
    os.replace(out / "problems.jsonl.tmp", out / "problems.jsonl")
    with open(out / "steps.jsonl.tmp", "w", encoding="utf-8") as f:
        for nid, (pair, dep) in enumerate(zip(texts_all, cat["depth"])):
            f.write(json.dumps({"node": nid, "depth": int(dep), "slm": pair[0],
                                "llm": pair[1]}) + "\n")
    os.replace(out / "steps.jsonl.tmp", out / "steps.jsonl")
    return fmt.validate(out)
