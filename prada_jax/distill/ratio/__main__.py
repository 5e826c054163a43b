"""``python -m prada_jax.distill.ratio``: the prefix likelihood-ratio diagnostic of a student.

    python -m prada_jax.distill.ratio --pool=POOL_DIR --logits=STORE_DIR --student=HF_DIR \\
        [--kappa_min=1e-3] [--batch_size=64] [--json=out.json]

Prints the per-turn teacher–student gap c̄, κ = exp(−c̄) and the regression of the prefix log
likelihood ratio on the turn index (library: :mod:`prada_jax.distill.ratio`). Bad input is one
line on stderr, exit 2.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from absl import flags
from flax import nnx

from prada_jax import cli
from prada_jax.distill import entry
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.ratio import diagnose_student, token_logp_fn
from prada_jax.errors import BadInput

PROG = "prada_jax.distill.ratio"


def _define(fv) -> None:
    flags.DEFINE_string("pool", None, "trajectory pool folder", flag_values=fv)
    flags.DEFINE_string("logits", None, "exported teacher logits of that pool", flag_values=fv)
    flags.DEFINE_string("student", None, "student Hugging Face folder", flag_values=fv)
    flags.DEFINE_float("kappa_min", 1e-3, "floor of the automatic kappa", flag_values=fv)
    flags.DEFINE_integer("batch_size", 64, "sequences per student forward", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_string("json", "", "also write the summary here", flag_values=fv)



def main(argv: Sequence[str] | None = None) -> int:
    fv = entry.parse(_define, argv, PROG, __doc__)
    for name in ("pool", "logits", "student"):
        if not fv[name].value:
            raise BadInput(f"--{name} is required")
    if not 0.0 < fv.kappa_min <= 1.0:
        raise BadInput(f"--kappa_min must lie in (0, 1], got {fv.kappa_min}")
    pool = pool_lib.load_pool(fv.pool)
    table = teacher_table.load(fv.logits, pool)
    model, _ = entry.load_student(fv.student)
    gd, params = nnx.split(model, nnx.Param)
    diag = diagnose_student(token_logp_fn(gd), params, pool, table, fv.kappa_min,
                            fv.batch_size)
    s = diag.summary()
    print(f"mean per-turn gap c = {s['mean_gap']:.4f} nats -> kappa = exp(-c) = "
          f"{s['kappa_auto']:.4g}")
    print(f"log br_t ~ {s['intercept']:.4f} + {s['slope']:.4f} t   (R^2 = {s['r2']:.4f}, "
          f"{sum(s['n_turn'])} pairs)")
    for t, (g, r, n) in enumerate(zip(s["mean_gap_turn"], s["mean_log_ratio_turn"],
                                      s["n_turn"])):
        print(f"  turn {t}: n = {n:5d}  mean gap {g:9.4f}  mean log br {r:9.4f}")
    if fv.json:
        Path(fv.json).write_text(json.dumps(s, indent=2))
    return 0


if __name__ == "__main__":
    cli.run_local(main)
