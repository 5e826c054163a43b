"""``python -m prada_jax.distill.task.evaluate``: runs the arithmetic task with a model and the
calculator tool; prints the success rate (JSON).

    python -m prada_jax.distill.task.evaluate --student=DIR [--n=256] [--seed=0] [--batch=64]

``DIR`` is a Hugging Face folder (the trainer's ``student_hf/``, or the teacher's folder).
Greedy decoding; problems are synthetic, ``make_problems(seed * 1000 + 3, n, split="eval")``
(never in a training pool). Library:
:mod:`prada_jax.distill.task.evaluate`. Bad input is one line on stderr, exit 2.
"""
from __future__ import annotations

import json
from typing import Sequence

from absl import flags

from prada_jax import cli
from prada_jax.distill import entry
from prada_jax.distill.task import arith
from prada_jax.distill.task.evaluate import evaluate_model
from prada_jax.errors import BadInput

PROG = "prada_jax.distill.task.evaluate"


def _define(fv) -> None:
    flags.DEFINE_string("student", None, "Hugging Face folder of the model", flag_values=fv)
    flags.DEFINE_integer("n", 256, "number of problems", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("seed", 0, "problems: make_problems(seed*1000+3, split=\"eval\")",
                         flag_values=fv)
    flags.DEFINE_integer("batch", 64, "episodes decoded together", lower_bound=1,
                         flag_values=fv)



def main(argv: Sequence[str] | None = None) -> int:
    fv = entry.parse(_define, argv, PROG, __doc__)
    if not fv.student:
        raise BadInput("--student is required")
    model, _ = entry.load_student(fv.student)
    problems = arith.make_problems(fv.seed * 1000 + 3, fv.n, split="eval")
    res = evaluate_model(model, problems, fv.batch)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    cli.run_local(main)
