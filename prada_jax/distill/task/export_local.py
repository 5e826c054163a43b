"""Teacher scoring for the built-in task (PyTorch): top-k + tail per token, and the export step.

:func:`score_sequences` uses the project exporter's ``prada_jax.distill.scoring.score_sequences``
when it is importable and otherwise a small local implementation with the same contract (per
sequence: ``logp_actual`` [L-1], ``topk_ids`` [L-1, k], ``topk_logp`` [L-1, k], ``tail_mass``
[L-1]; entry i predicts token i + 1). :func:`export_logits` writes the teacher table of a pool
(via the exporter CLI when present, else locally).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from prada_jax.distill import pool as pool_lib
from prada_jax.distill import teacher_table


def score_sequences_local(model, token_seqs: Sequence[Sequence[int]], top_k: int,
                          batch_size: int = 64) -> list[dict]:
    """Teacher-forced scoring of token sequences with a PyTorch causal LM (float32)."""
    import torch
    out = []
    with torch.no_grad():
        for s in range(0, len(token_seqs), batch_size):
            chunk = [list(map(int, t)) for t in token_seqs[s:s + batch_size]]
            L = max(len(t) for t in chunk)
            x = torch.zeros((len(chunk), L), dtype=torch.long)
            att = torch.zeros_like(x)
            for b, t in enumerate(chunk):
                x[b, :len(t)] = torch.tensor(t)
                att[b, :len(t)] = 1
            logp = torch.log_softmax(model(input_ids=x, attention_mask=att).logits.float(), -1)
            k = min(top_k, logp.shape[-1])
            top_lp, top_id = logp.topk(k, dim=-1)
            for b, t in enumerate(chunk):
                n = len(t) - 1
                nxt = torch.tensor(t[1:], dtype=torch.long)
                lp = logp[b, :n]
                tl = top_lp[b, :n].double()
                out.append({
                    "logp_actual": lp.gather(-1, nxt[:, None])[:, 0].numpy().astype(np.float32),
                    "topk_ids": top_id[b, :n].numpy().astype(np.int32),
                    "topk_logp": top_lp[b, :n].numpy().astype(np.float32),
                    "tail_mass": np.clip(1.0 - tl.exp().sum(-1).numpy(), 0.0, 1.0
                                         ).astype(np.float32),
                })
    return out


def score_sequences(model, token_seqs, top_k: int) -> list[dict]:
    """The exporter's scoring function if available, else :func:`score_sequences_local`."""
    try:
        from prada_jax.distill.scoring import score_sequences as exporter_score
    except ImportError:
        return score_sequences_local(model, token_seqs, top_k)
    return exporter_score(model, token_seqs, top_k)


def export_logits(teacher_dir: os.PathLike | str, pool_dir: os.PathLike | str,
                  out_dir: os.PathLike | str, top_k: int = 8,
                  use_exporter: bool | None = None) -> Path:
    """Scores every pool trajectory with the teacher and writes the teacher logits.

    ``use_exporter`` (default: when ``prada_jax.distill.export`` exists) runs
    ``python -m prada_jax.distill.export`` in a subprocess; otherwise scores locally and writes
    a :mod:`teacher_table` folder. Either folder is read by ``teacher_table.load``.
    """
    out = Path(out_dir)
    pool = pool_lib.load_pool(pool_dir)
    if use_exporter is None:
        import importlib.util
        use_exporter = importlib.util.find_spec("prada_jax.distill.export") is not None
    if use_exporter:
        cmd = [sys.executable, "-m", "prada_jax.distill.export", "--teacher", str(teacher_dir),
               "--pool", str(pool_dir), "--out", str(out), "--top-k", str(top_k)]
        subprocess.run(cmd, check=True)
    else:
        from prada_jax.distill.task.teacher import load_teacher
        model = load_teacher(teacher_dir)
        seqs = score_sequences_local(model, pool.trajectories(), top_k)
        table = teacher_table.from_sequences(pool, seqs, str(teacher_dir),
                                             {"teacher": str(teacher_dir), "top_k": top_k,
                                              "scorer": "local"})
        teacher_table.save(table, out, pool_dir)
    teacher_table.load(out, pool)  # verify
    return out
