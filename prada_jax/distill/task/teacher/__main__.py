"""``python -m prada_jax.distill.task.teacher``: builds the arithmetic task's cache.

    python -m prada_jax.distill.task.teacher --cache=checkpoints/task_cache [--seed=0] \\
        [--hidden=128 --layers=2 ... --top_k=8]

Trains the PyTorch teacher, records its trajectories (a training pool and a held-out pool) and
exports its top-k logits under ``<cache>/seed<seed>/`` (see the library,
:mod:`prada_jax.distill.task.teacher`). Reruns reuse the teacher and the pools (the steps
both task commands share: :mod:`prada_jax.distill.task.teacher_cache`). All data is synthetic.
Bad input is one line on stderr, exit 2.
"""
from __future__ import annotations

import os
from typing import Sequence

from prada_jax import cli
from prada_jax.distill import entry
from prada_jax.distill.task import arith, teacher_cache
from prada_jax.distill.task.teacher import (DEFAULTS, evaluate_torch, record_pool,
                                           train_teacher)

PROG = "prada_jax.distill.task.teacher"


def _define(fv) -> None:
    teacher_cache.define_flags(fv, DEFAULTS, "checkpoints/task_cache")


def _evaluate(model, problems) -> tuple[dict, str]:
    ev = evaluate_torch(model, problems)
    return ev, f"teacher success on held-out problems (synthetic): {ev['success_rate']:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    fv = entry.parse(_define, argv, PROG, __doc__)
    import torch  # lazy: torch is the optional [torch] extra
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    teacher_cache.build_task_cache(
        fv, train_teacher,
        lambda offset, n, split: arith.make_problems(fv.seed * 1000 + offset, n, split=split),
        _evaluate, record_pool, heldout_seed=fv.seed)
    return 0


if __name__ == "__main__":
    cli.run_local(main)
