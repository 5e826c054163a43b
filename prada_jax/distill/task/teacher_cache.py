"""Builds a built-in task's cache under ``<cache>/seed<seed>/`` (what
``python -m prada_jax.distill.task.teacher`` and ``python -m prada_jax.distill.task.kg_teacher``
run, each with its task's functions): ``teacher/`` (trained unless present),
``teacher_eval.json``, ``pool/`` + ``pool.jsonl``, ``logits/``, ``pool_heldout/`` and
``logits_heldout/``. Problem seeds: ``seed*1000 + 2`` the pool, ``+3`` the evaluation, ``+4``
the held-out pool (``+1``, teacher training, is the task's ``train_teacher``'s). Reruns reuse
the teacher and the pools. All data is synthetic.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
from absl import flags

from prada_jax.distill import pool as pool_lib
from prada_jax.distill.task.common import ensure_teacher
from prada_jax.distill.task.export_local import export_logits


def define_flags(fv, defaults: dict, cache: str, helps: dict | None = None) -> None:
    """``--cache`` (default ``cache``), ``--seed`` and one flag per entry of ``defaults`` (a
    task's teacher sizes; floats ≥ 0, integers ≥ 1), with the help texts of ``helps`` where
    given."""
    helps = helps or {}
    flags.DEFINE_string("cache", cache, "output cache folder", flag_values=fv)
    flags.DEFINE_integer("seed", 0, helps.get("seed", "teacher, problems and pool seed"),
                         flag_values=fv)
    for k, v in defaults.items():
        if isinstance(v, float):
            flags.DEFINE_float(k, v, helps.get(k, f"teacher {k}"), lower_bound=0.0,
                               flag_values=fv)
        else:
            flags.DEFINE_integer(k, v, helps.get(k, f"teacher {k}"), lower_bound=1,
                                 flag_values=fv)


def build_task_cache(fv, train_teacher: Callable, problems: Callable, evaluate: Callable,
                     record_pool: Callable, heldout_seed: int) -> Path:
    """Builds (or completes) ``<fv.cache>/seed<fv.seed>/``; returns that folder.

    ``train_teacher``: the task's (``common.ensure_teacher``); ``problems(offset, n, split)``:
    ``n`` problems of generator seed ``fv.seed*1000 + offset`` in ``split`` ("train", "eval",
    "heldout"); ``evaluate(model, problems)``: ``(teacher_eval.json's dict, the line to
    print)``; ``record_pool(model, problems, out_dir, jsonl_path=None, seed=..., extra_meta=...)``:
    the task's recorder (its sampling settings bound); ``heldout_seed``: the recorder's seed of
    the held-out pool (the training pool's is ``fv.seed``)."""
    root = Path(fv.cache) / f"seed{fv.seed}"
    root.mkdir(parents=True, exist_ok=True)
    tdir = root / "teacher"
    t0 = time.time()
    model = ensure_teacher(tdir, fv, train_teacher, t0)
    ev, line = evaluate(model, problems(3, fv.n_eval, "eval"))
    (root / "teacher_eval.json").write_text(json.dumps(ev, indent=2))
    print(line, flush=True)
    pdir = root / "pool"
    if not (pdir / pool_lib.META_FILE).is_file():
        record_pool(model, problems(2, fv.n_pool, "train"), pdir, root / "pool.jsonl",
                    seed=fv.seed)
    pool = pool_lib.load_pool(pdir)
    print(f"pool: {pool.meta['counts']}, teacher success in pool "
          f"{float(np.mean(pool.success)):.3f} ({time.time() - t0:.0f}s)", flush=True)
    export_logits(tdir, pdir, root / "logits", fv.top_k)
    hdir = root / "pool_heldout"
    if not (hdir / pool_lib.META_FILE).is_file():
        record_pool(model, problems(4, fv.n_pool, "heldout"), hdir, seed=heldout_seed,
                    extra_meta={"split": "heldout"})
    export_logits(tdir, hdir, root / "logits_heldout", fv.top_k)
    print(f"logits: {root / 'logits'}, held-out pool {hdir} ({time.time() - t0:.0f}s total)")
    return root
