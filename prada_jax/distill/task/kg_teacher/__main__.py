"""``python -m prada_jax.distill.task.kg_teacher``: builds the knowledge-graph task's cache.

    python -m prada_jax.distill.task.kg_teacher --cache=checkpoints/kg_cache [--seed=0] \\
        [--temperature=1.0 --layers=3 ... --top_k=8 --threads=1]

Trains the PyTorch teacher, records its trajectories sampled at ``--temperature`` (a training
pool and a held-out pool), exports its top-k logits and measures its success under
``<cache>/seed<seed>/`` (see the library, :mod:`prada_jax.distill.task.kg_teacher`). Reruns
reuse the teacher and the pools (the steps both task commands share:
:mod:`prada_jax.distill.task.teacher_cache`). All data is synthetic. Bad input is one line on
stderr, exit 2.
"""
from __future__ import annotations

import functools
from typing import Sequence

from prada_jax import cli
from prada_jax.distill import entry
from prada_jax.distill.task import kg, teacher_cache
from prada_jax.distill.task.kg_teacher import (DEFAULTS, evaluate_torch, record_pool,
                                              train_teacher)

PROG = "prada_jax.distill.task.kg_teacher"


def _define(fv) -> None:
    teacher_cache.define_flags(fv, DEFAULTS, "checkpoints/kg_cache", helps={
        "seed": "teacher, problems, pool and sampling seed",
        "temperature": "teacher sampling temperature of the pools and of the reported "
                       "success (0 = greedy)"})


def main(argv: Sequence[str] | None = None) -> int:
    fv = entry.parse(_define, argv, PROG, __doc__)
    import torch  # lazy: torch is the optional [torch] extra
    torch.set_num_threads(fv.threads)
    tau = fv.temperature

    def evaluate(model, problems) -> tuple[dict, str]:
        ev = {"temperature": tau, "sampled": evaluate_torch(model, problems, tau, fv.seed),
              "greedy": evaluate_torch(model, problems, 0.0), "synthetic": True}
        return ev, (f"teacher success on {fv.n_eval} held-out problems (synthetic): sampled "
                    f"at τ = {tau}: {ev['sampled']['success_rate']:.3f} "
                    f"{ev['sampled']['ci95']}, greedy {ev['greedy']['success_rate']:.3f}")

    teacher_cache.build_task_cache(
        fv, train_teacher,
        lambda offset, n, split: kg.make_problems(fv.seed * 1000 + offset, n),
        evaluate, functools.partial(record_pool, temperature=tau), heldout_seed=fv.seed + 1)
    return 0


if __name__ == "__main__":
    cli.run_local(main)
