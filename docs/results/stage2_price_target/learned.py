"""Issue 33 item 4: the capacity-clearing constant λ_s the default learner (averaged
subgradient, ρ = 1, SIZES["full"]'s learner size) finds on ``slow_server`` for a policy, per
learner seed (validation split and seeds), as ``evals.stage2.run`` learns it.

Usage: python learned.py POLICY_DIR OUT_DIR OUT_JSON [learner seeds, default 0,1]
"""
import json
import sys
from pathlib import Path

from envs import scenarios
from evals import stage2, suite

P, OUT, JS = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
seeds = [int(s) for s in (sys.argv[4] if len(sys.argv) > 4 else "0,1").split(",")]
size = dict(stage2.SIZES["full"])
policy = suite.load_policy(P)
env_kw = suite.env_kwargs_from(policy.config, dict(size["env"], num_users=size["num_users"]))
env_kw["train_problems"] = int(policy.config.env.get("problems", 0))
env_kw["choice_split"] = "validation"
env_kw.update(scenarios.preset_env("slow_server"))
res = {"policy": P, "scenario": "slow_server", "synthetic": True, "learned": {}}
for s in seeds:
    _, r, _, _ = stage2.learn_multipliers(OUT / f"seed{s}", "slow_server", Path(P), env_kw,
                                          size, False, seed=s)
    m = r["multipliers"]
    res["learned"][str(s)] = {"lambda_s": float(m.lambda_s), "mu_per_mhz": float(m.mu) * 1e6,
                              "scalars": {k: v for k, v in r["scalars"].items()
                                          if k.startswith("dual/")}}
    print(s, res["learned"][str(s)]["lambda_s"], res["learned"][str(s)]["mu_per_mhz"], flush=True)
json.dump(res, open(JS, "w"), indent=1)
