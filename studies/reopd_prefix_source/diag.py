"""Post-verdict diagnostic of the prefix-source study (studies/reopd_prefix_source/README.md,
"Reading"), SYNTHETIC: for each prefix pool, the target teacher T's mean log-probability of
the pool's action tokens (from T's exported logits on that pool), split by the trajectories'
success, and the mix of the two call forms (entity first, relation first).

    python -m studies.reopd_prefix_source.diag --teacher_pool=T/seed0/pool \
        --teacher_logits=T/seed0/logits --generator_pool=G/seed0/pool \
        --generator_logits=STUDY/logits_T_on_G [--json=FILE]

Prints (and with ``--json`` writes) ``{"synthetic", "teacher_pool", "generator_pool"}``; the
committed output is ``results/diag.json``. It ran first as ``python
docs/results/reopd_prefix_source_diag.py`` with the same four paths, positional. Bad input
(a missing folder): one stderr line, exit 2.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from absl import flags

from prada_jax import cli, config_utils
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.task import kg
from prada_jax.errors import BadInput

FOLDERS = ("teacher_pool", "teacher_logits", "generator_pool", "generator_logits")


def pool_stats(pool_dir: str, logits_dir: str) -> dict:
    """T's mean log-prob per action token [nats] (all trajectories, and successful / failed
    ones), the number of calls written entity first / relation first, and the pool's success."""
    pool = pool_lib.load_pool(pool_dir)
    tab = teacher_table.load(logits_dir, pool)
    act = np.asarray(pool.action_mask).astype(bool)
    offs = np.asarray(pool.traj_offsets)
    first = np.zeros(act.shape, bool)
    first[offs[:-1]] = True                  # row of a trajectory's first token is undefined
    lp = np.asarray(tab.logp_actual, np.float64)
    traj = np.repeat(np.arange(pool.num_trajectories), np.diff(offs))
    succ = np.asarray(pool.success).astype(bool)
    m = act & ~first
    toks = np.asarray(pool.tokens)
    ent = rel = 0
    for a, b in zip(np.asarray(pool.turn_starts), np.asarray(pool.turn_ends)):
        kind, payload = kg.parse_action(toks[a:b].tolist())
        if kind == "call" and len(payload) == 2:
            ent += payload[0].isupper()
            rel += payload[0].islower()
    return {"pool": str(pool_dir), "success": float(succ.mean()),
            "T_logp_per_action_token": float(lp[m].mean()),
            "T_logp_successful": float(lp[m & succ[traj]].mean()),
            "T_logp_failed": float(lp[m & ~succ[traj]].mean()) if (~succ).any() else None,
            "calls_entity_first": int(ent), "calls_relation_first": int(rel)}


def _define_flags():
    flags.DEFINE_string("teacher_pool", None, "T's own prefix pool (folder with pool.json)")
    flags.DEFINE_string("teacher_logits", None, "T's logit store on its own pool")
    flags.DEFINE_string("generator_pool", None, "the generator G's prefix pool")
    flags.DEFINE_string("generator_logits", None, "T's logit store on G's pool "
                        "(the study's logits_T_on_G)")
    flags.DEFINE_string("json", None, "also write the result here")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    for name in FOLDERS:
        value = getattr(F, name)
        if not value or not Path(value).is_dir():
            raise BadInput(f"--{name}={value}: not a folder")
    res = {"synthetic": True,
           "teacher_pool": pool_stats(F.teacher_pool, F.teacher_logits),
           "generator_pool": pool_stats(F.generator_pool, F.generator_logits)}
    text = json.dumps(res, indent=1)
    if F.json:
        Path(F.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
