"""``python -m prada_jax.distill.task.teacher``: builds the arithmetic task's cache.

    python -m prada_jax.distill.task.teacher --cache=checkpoints/task_cache [--seed=0] \\
        [--hidden=128 --layers=2 ... --top_k=8]

Trains the PyTorch teacher, records its trajectories (a training pool and a held-out pool) and
exports its top-k logits under ``<cache>/seed<seed>/`` (see the library,
:mod:`prada_jax.distill.task.teacher`). Reruns reuse finished stages. All data is synthetic.
Bad input is one line on stderr, exit 2.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from absl import flags

from prada_jax import cli
from prada_jax.distill import entry
from prada_jax.distill import pool as pool_lib
from prada_jax.distill.task import arith
from prada_jax.distill.task.common import ensure_teacher
from prada_jax.distill.task.export_local import export_logits
from prada_jax.distill.task.teacher import (DEFAULTS, evaluate_torch, record_pool,
                                           train_teacher)

PROG = "prada_jax.distill.task.teacher"


def _define(fv) -> None:
    flags.DEFINE_string("cache", "checkpoints/task_cache", "output cache folder", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "teacher, problems and pool seed", flag_values=fv)
    for k, v in DEFAULTS.items():
        if isinstance(v, float):
            flags.DEFINE_float(k, v, f"teacher {k}", lower_bound=0.0, flag_values=fv)
        else:
            flags.DEFINE_integer(k, v, f"teacher {k}", lower_bound=1, flag_values=fv)



def main(argv: Sequence[str] | None = None) -> int:
    fv = entry.parse(_define, argv, PROG, __doc__)
    import torch  # lazy: torch is the optional [torch] extra
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    root = Path(fv.cache) / f"seed{fv.seed}"
    root.mkdir(parents=True, exist_ok=True)
    tdir = root / "teacher"
    t0 = time.time()
    model = ensure_teacher(tdir, fv, train_teacher, t0)
    ev = evaluate_torch(model, arith.make_problems(fv.seed * 1000 + 3, fv.n_eval, split="eval"))
    (root / "teacher_eval.json").write_text(json.dumps(ev, indent=2))
    print(f"teacher success on held-out problems (synthetic): {ev['success_rate']:.3f}")
    pdir = root / "pool"
    if not (pdir / pool_lib.META_FILE).is_file():
        record_pool(model, arith.make_problems(fv.seed * 1000 + 2, fv.n_pool, split="train"),
                    pdir,
                    root / "pool.jsonl", seed=fv.seed)
    pool = pool_lib.load_pool(pdir)
    print(f"pool: {pool.meta['counts']}, teacher success in pool "
          f"{float(np.mean(pool.success)):.3f}")
    ldir = root / "logits"
    export_logits(tdir, pdir, ldir, fv.top_k)
    hdir = root / "pool_heldout"
    if not (hdir / pool_lib.META_FILE).is_file():
        record_pool(model, arith.make_problems(fv.seed * 1000 + 4, fv.n_pool, split="heldout"),
                    hdir,
                    seed=fv.seed, extra_meta={"split": "heldout"})
    export_logits(tdir, hdir, root / "logits_heldout", fv.top_k)
    print(f"logits: {ldir}, held-out pool {hdir} ({time.time() - t0:.0f}s total)")
    return 0


if __name__ == "__main__":
    cli.run_local(main)
