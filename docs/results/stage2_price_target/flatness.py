"""Issue 33 item 4: is the validation grid's preference for a price above the capacity-clearing
one real or seed noise? Per-seed objective (accuracy − β·latency, SYNTHETIC gsm8k) of PRADA at
constant λ_s (µ = 0) on ``slow_server`` at the verdict's measurement size (SIZES["full"]: U = 32,
M = 1, 12 users/s, server 10× slower, 1200 slots, first 150 discarded), on S validation seeds
and S fresh test seeds, each λ paired against λ_s = REF on the same seeds.

Usage: python flatness.py POLICY_DIR OUT_JSON [S] [test_seed0]
POLICY_DIR: e.g. POL/seed_0/critic of ``python -m evals.stage2.policies --out=POL --seeds=0``
(make demo's policy). Writes every per-seed value to OUT_JSON.
"""
import json
import sys
import time

import jax.numpy as jnp
import numpy as np

from envs import edge, scenarios
from evals import stage2, suite
from prada_jax import stats
from prada_jax.sched.registry import SCHEDULER_NAMES

LAMS = (0.0, 0.0631, 0.0794, 0.1, 0.1259, 0.1585, 0.1995, 0.3162)
REF = 0.1

P, OUT = sys.argv[1], sys.argv[2]
S = int(sys.argv[3]) if len(sys.argv) > 3 else 16
TEST0 = int(sys.argv[4]) if len(sys.argv) > 4 else 32
size = dict(stage2.SIZES["full"])
policy = suite.load_policy(P)
env_kw = suite.env_kwargs_from(policy.config, dict(size["env"], num_users=size["num_users"]))
env_kw.update(scenarios.preset_env("slow_server"))
n = int(policy.config.env.get("problems", 0)) or None
tseed = int(policy.config.env.trace_seed) + suite.HELD_OUT_SEED_OFFSET
sched = SCHEDULER_NAMES.index("threshold")
res = {"policy": P, "lams": LAMS, "ref": REF, "seeds": S, "scenario": "slow_server",
       "synthetic": True, "size": "full", "sets": {}}
for split, off in (("validation", 0), ("test", TEST0)):
    tr = suite.load_traces("gsm8k", n, tseed, split=split)
    s0 = suite.evaluation_seed0(tr.info, policy, S, seed0=off)
    p = edge.make_params(tr.traces, **{k: env_kw[k] for k in stage2._ENV_KEYS},
                         **scenarios.latency_overrides(env_kw),
                         scenario=scenarios.preset("slow_server", size["scenario_length"]))
    true_reward = policy.meta.get("reward_mode", "coarse") == "true"
    p = p.replace(policy_true_reward=jnp.asarray(true_reward))
    r = stage2.Runner(p, S, size["slots"], size["warmup"], policy.apply_fn, policy.params,
                      seed0=s0)
    t0 = time.time()
    obj = r.run_grid(sched, np.asarray(LAMS), np.zeros(len(LAMS)))     # [G, S]
    ref = obj[LAMS.index(REF)]
    rows = {}
    for lam, o in zip(LAMS, obj):
        ci = stats.mean_ci(o - ref, 0.95)
        rows[str(lam)] = {"objective_mean": float(np.mean(o)), "minus_ref": float(ci.mean),
                          "lo": float(ci.low), "hi": float(ci.high),
                          "per_seed": [float(v) for v in o]}
    res["sets"][split] = {"seed0": s0, "rows": rows, "wall_s": time.time() - t0}
    print(split, s0, {k: (round(v["objective_mean"], 4), round(v["minus_ref"], 4),
                          round(v["lo"], 4), round(v["hi"], 4)) for k, v in rows.items()},
          flush=True)
json.dump(res, open(OUT, "w"), indent=1)
