"""Export step of the built-in task's cache: a pool's teacher logits as a logit store.

:func:`export_logits` scores every pool trajectory with the teacher folder in-process through
the project exporter (:func:`prada_jax.distill.export.export_store`, so the one teacher-scoring
path :func:`prada_jax.distill.scoring.score_sequences` and the one on-disk format
:mod:`prada_jax.distill.logits_store`) and verifies the result against the pool. It imports
no other task module (``task/teacher.py`` imports this one, not the reverse).
"""
from __future__ import annotations

import os
from pathlib import Path

from prada_jax.distill import pool as pool_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.export import export_store


def export_logits(teacher_dir: os.PathLike | str, pool_dir: os.PathLike | str,
                  out_dir: os.PathLike | str, top_k: int = 8, progress: bool = False) -> Path:
    """Writes (or resumes) the logit store of ``pool_dir`` scored by ``teacher_dir`` (top-k per
    token, float16 top-k log-probs, the exporter's defaults otherwise); returns ``out_dir``."""
    out = Path(out_dir)
    pool = pool_lib.load_pool(pool_dir)
    export_store(str(teacher_dir), str(out), pool=str(pool_dir), top_k=top_k, progress=progress)
    teacher_table.load(out, pool)  # verify
    return out
