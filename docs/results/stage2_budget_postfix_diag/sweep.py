"""Post-verdict diagnostic: lambda sweep on the budget learner's env (validation, learner seed):
measured occupancy vs learner surrogates; breakdown of admissions that never run.

Usage (README.md here): python sweep.py POLICY_DIR DUAL_RUN_DIR lambda1,lambda2,... [OUT_JSON]"""
import json, sys
import jax, numpy as np
from prada_jax import config_utils
from prada_jax.dual import trainer, rollout, problem
from prada_jax.sched.base import LOCAL

if len(sys.argv) < 4:
    sys.exit("usage: sweep.py POLICY_DIR DUAL_RUN_DIR lambda1,lambda2,... [OUT_JSON]")
c = config_utils.read_config_json(sys.argv[2])
c.policy_dir = sys.argv[1]
setup = trainer.build_setup(c)
E, T, W, rho = 32, 1200, 150, 0.27
ro = jax.jit(rollout.make_rollout(setup.policy_fn, T))
rows = []
for lam in [float(v) for v in sys.argv[3].split(",")]:
    carry = rollout.init_rollout(jax.random.key(trainer.learner_seed(c)), setup.env_params, E,
                                 lambda k: rollout.fixed_prices(problem.Multipliers(lam, 0.0)))
    _, out = ro(carry, setup.env_params)
    b = jax.tree.map(lambda a: np.asarray(a)[W:], out["batch"])
    busy = np.asarray(out["server_in_use"])[W:].astype(float)
    M = float(np.asarray(b.capacity_units).mean())
    d = np.asarray(problem.hard_decision(b.w, b.w_bar, b.b, lam, 0.0, b.fresh))
    adm = (d != LOCAL) & b.fresh
    dec = np.asarray(out["decision"])[W:]
    outage = np.asarray(out["outage"])[W:]
    r = dict(lam=lam, measured=float(busy.mean() / M), measured_se=float(busy.mean(0).std(ddof=1) / M / np.sqrt(E)),
             adm=float(adm.sum(-1).mean()), k_fresh=float(b.work[b.fresh].mean()),
             k_adm=float(b.work[adm].mean()),
             old_surrogate=float(adm.sum(-1).mean() * b.work[b.fresh].mean() / M),
             new_sum_admit_k=float((adm * b.work).sum(-1).mean() / M),
             fate_imm=float((adm & (dec == 2)).sum() / adm.sum()),
             fate_queue=float((adm & (dec == 1)).sum() / adm.sum()),
             fate_local_outage=float((adm & (dec == 0) & outage).sum() / adm.sum()),
             fate_local_repair=float((adm & (dec == 0) & ~outage).sum() / adm.sum()),
             queued_runs=float(((dec == 2) & ~b.fresh & b.valid).sum() / adm.sum()))
    print(json.dumps(r), flush=True)
    rows.append(r)
if len(sys.argv) > 4:
    json.dump(rows, open(sys.argv[4], "w"), indent=1)
