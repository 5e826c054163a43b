"""``python -m prada_jax.distill.task.kg_teacher``: builds the knowledge-graph task's cache.

    python -m prada_jax.distill.task.kg_teacher --cache=checkpoints/kg_cache [--seed=0] \\
        [--temperature=1.0 --layers=3 ... --top_k=8 --threads=1]

Trains the PyTorch teacher, records its trajectories sampled at ``--temperature`` (a training
pool and a held-out pool), exports its top-k logits and measures its success under
``<cache>/seed<seed>/`` (see the library, :mod:`prada_jax.distill.task.kg_teacher`). Reruns
reuse finished stages. All data is synthetic. Bad input is one line on stderr, exit 2.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from absl import flags

from prada_jax import cli
from prada_jax.distill import entry
from prada_jax.distill import pool as pool_lib
from prada_jax.distill.task import kg
from prada_jax.distill.task.common import ensure_teacher
from prada_jax.distill.task.export_local import export_logits
from prada_jax.distill.task.kg_teacher import (DEFAULTS, evaluate_torch, record_pool,
                                              train_teacher)

PROG = "prada_jax.distill.task.kg_teacher"


def _define(fv) -> None:
    flags.DEFINE_string("cache", "checkpoints/kg_cache", "output cache folder", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "teacher, problems, pool and sampling seed", flag_values=fv)
    for k, v in DEFAULTS.items():
        if k == "temperature":
            flags.DEFINE_float(k, v, "teacher sampling temperature of the pools and of the "
                               "reported success (0 = greedy)", lower_bound=0.0, flag_values=fv)
        elif isinstance(v, float):
            flags.DEFINE_float(k, v, f"teacher {k}", lower_bound=0.0, flag_values=fv)
        else:
            flags.DEFINE_integer(k, v, f"teacher {k}", lower_bound=1, flag_values=fv)


def main(argv: Sequence[str] | None = None) -> int:
    fv = entry.parse(_define, argv, PROG, __doc__)
    import torch  # lazy: torch is the optional [torch] extra
    torch.set_num_threads(fv.threads)
    root = Path(fv.cache) / f"seed{fv.seed}"
    root.mkdir(parents=True, exist_ok=True)
    tdir = root / "teacher"
    t0 = time.time()
    model = ensure_teacher(tdir, fv, train_teacher, t0)
    tau = fv.temperature
    eval_problems = kg.make_problems(fv.seed * 1000 + 3, fv.n_eval)
    ev = {"temperature": tau, "sampled": evaluate_torch(model, eval_problems, tau, fv.seed),
          "greedy": evaluate_torch(model, eval_problems, 0.0), "synthetic": True}
    (root / "teacher_eval.json").write_text(json.dumps(ev, indent=2))
    print(f"teacher success on {fv.n_eval} held-out problems (synthetic): sampled at "
          f"τ = {tau}: {ev['sampled']['success_rate']:.3f} {ev['sampled']['ci95']}, greedy "
          f"{ev['greedy']['success_rate']:.3f}", flush=True)
    pdir = root / "pool"
    if not (pdir / pool_lib.META_FILE).is_file():
        record_pool(model, kg.make_problems(fv.seed * 1000 + 2, fv.n_pool), pdir,
                    root / "pool.jsonl", temperature=tau, seed=fv.seed)
    pool = pool_lib.load_pool(pdir)
    print(f"pool: {pool.meta['counts']}, teacher success in pool "
          f"{float(np.mean(pool.success)):.3f} ({time.time() - t0:.0f}s)", flush=True)
    export_logits(tdir, pdir, root / "logits", fv.top_k)
    hdir = root / "pool_heldout"
    if not (hdir / pool_lib.META_FILE).is_file():
        record_pool(model, kg.make_problems(fv.seed * 1000 + 4, fv.n_pool), hdir,
                    temperature=tau, seed=fv.seed + 1, extra_meta={"split": "heldout"})
    export_logits(tdir, hdir, root / "logits_heldout", fv.top_k)
    print(f"logits: {root / 'logits'}, held-out pool {hdir} ({time.time() - t0:.0f}s total)")
    return 0


if __name__ == "__main__":
    cli.run_local(main)
