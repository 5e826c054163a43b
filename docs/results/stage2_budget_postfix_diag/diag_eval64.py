"""Post-verdict diagnostic: occupancy and objective vs lambda on validation, 64 eval seeds.

Usage (README.md here): python diag_eval64.py POLICY_DIR lambda1,lambda2,..."""
import sys, numpy as np
from envs import edge, scenarios
from evals import stage2, suite
if len(sys.argv) < 3:
    sys.exit("usage: diag_eval64.py POLICY_DIR lambda1,lambda2,...")
P = sys.argv[1]
size = dict(stage2.SIZES["full"])
policy = suite.load_policy(P)
env_kw = suite.env_kwargs_from(policy.config, dict(size["env"], num_users=size["num_users"]))
n = int(policy.config.env.get("problems", 0)) or None
tseed = int(policy.config.env.trace_seed) + suite.HELD_OUT_SEED_OFFSET
tr = suite.load_traces("gsm8k", n, tseed, split="validation")
S = 64
s0 = suite.evaluation_seed0(tr.info, policy, S)
p = edge.make_params(tr.traces, **{k: env_kw[k] for k in stage2._ENV_KEYS},
                     scenario=scenarios.preset("nominal", size["scenario_length"]))
r = stage2.Runner(p, S, size["slots"], size["warmup"], policy.apply_fn, policy.params, seed0=s0)
base = None
out = {}
for lam in [float(v) for v in sys.argv[2].split(",")]:
    m = r.run_prada(4, lam, 0.0)
    u, o = np.asarray(m["server_util"]), np.asarray(m["objective"])
    if base is None:
        base = o
    out[lam] = dict(occ=u.mean(), occ_se=u.std(ddof=1) / np.sqrt(S), occ_first16=u[:16].mean(),
                    obj=o.mean(), obj_minus_first=(o - base).mean(), se_diff=(o - base).std(ddof=1) / np.sqrt(S))
    print(lam, {k: round(float(v), 4) for k, v in out[lam].items()}, flush=True)
