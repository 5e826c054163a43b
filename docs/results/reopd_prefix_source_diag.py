"""Post-verdict diagnostics of the prefix-source study (docs/results/reopd_prefix_source.md),
SYNTHETIC: for each prefix pool, the target teacher T's mean log-probability of the pool's
action tokens (from T's exported logits on that pool) and the mix of the two call forms.

    python docs/results/reopd_prefix_source_diag.py T_POOL T_LOGITS G_POOL T_LOGITS_ON_G
"""
import json
import sys

import numpy as np

from prada_jax.distill import pool as pool_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.task import kg


def pool_stats(pool_dir: str, logits_dir: str) -> dict:
    """T's mean log-prob per action token [nats] (all trajectories, and successful / failed
    ones), the share of calls written entity first, and the pool's success."""
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
    return {"pool": pool_dir, "success": float(succ.mean()),
            "T_logp_per_action_token": float(lp[m].mean()),
            "T_logp_successful": float(lp[m & succ[traj]].mean()),
            "T_logp_failed": float(lp[m & ~succ[traj]].mean()) if (~succ).any() else None,
            "calls_entity_first": int(ent), "calls_relation_first": int(rel)}


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps({"synthetic": True, "teacher_pool": pool_stats(a[0], a[1]),
                      "generator_pool": pool_stats(a[2], a[3])}, indent=1))
