"""Post-verdict diagnostic (issue 23 budget): at the learned constant price, on the learner's own
env (validation split, learner seeds), compare the learner's surrogate (admissions x kbar)
with sum of admitted work and with measured occupancy.

Usage (README.md here): python diag.py POLICY_DIR DUAL_RUN_DIR [lambda_s]
POLICY_DIR: the verdict's policy folder; DUAL_RUN_DIR: the budget learner's run folder
(OUT/dual/nominal/constant of the budget run), whose config.json is reused with its
policy_dir replaced by POLICY_DIR."""
import json, sys
import jax, numpy as np
from prada_jax import config_utils
from prada_jax.dual import trainer, rollout, problem
from prada_jax.sched.base import LOCAL

if len(sys.argv) < 3:
    sys.exit("usage: diag.py POLICY_DIR DUAL_RUN_DIR [lambda_s]")
c = config_utils.read_config_json(sys.argv[2])
c.policy_dir = sys.argv[1]
setup = trainer.build_setup(c)
lam = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0405118390917778
E, T, W = 16, 1200, 150
ro = jax.jit(rollout.make_rollout(setup.policy_fn, T))
carry = rollout.init_rollout(jax.random.key(trainer.learner_seed(c)), setup.env_params, E,
                             lambda k: rollout.fixed_prices(problem.Multipliers(lam, 0.0)))
carry, out = ro(carry, setup.env_params)
b = jax.tree.map(lambda a: np.asarray(a)[W:], out["batch"])
dec_env = np.asarray(out["decision"])[W:]          # [T,E,U] after enforcement
busy = np.asarray(out["server_in_use"])[W:].astype(float)
M = np.asarray(b.capacity_units)
d = np.asarray(problem.hard_decision(b.w, b.w_bar, b.b, lam, 0.0, b.fresh))
adm = (d != LOCAL) & b.fresh                        # learner's admissions (before repair)
work = b.work
rho = 0.27
# learner's per-slot kbar: over the E envs of one slot (the online batch is [E, U])
f = b.fresh.astype(float)
nf = f.sum(axis=(1, 2))
kbar_t = np.where(nf > 0, np.maximum((f * work).sum(axis=(1, 2)) / np.maximum(nf, 1), 1), 1)
adm_per = adm.sum(-1)                               # [T,E]
res = dict(
    lam=lam, slots=int(busy.size),
    measured_occupancy=float(busy.mean() / M.mean()),
    admissions_per_env_slot=float(adm_per.mean()),
    kbar_pooled_all_fresh=float(work[b.fresh].mean()),
    k_admitted_mean=float(work[adm].mean()),
    share_slots_without_fresh=float((nf == 0).mean()),
    learner_capacity_target_mean_rho_M_over_kbar_t=float((rho * M.mean(1) / kbar_t).mean()),
    surrogate_occ_adm_x_kbar_pooled=float(adm_per.mean() * work[b.fresh].mean() / M.mean()),
    surrogate_occ_mean_adm_x_kbar_t=float((adm_per.mean(1) * kbar_t).mean() / M.mean()),
    sum_admitted_work_per_slot_over_M=float((adm * work).sum(-1).mean() / M.mean()),
    learner_mean_excess=float((adm_per - rho * M / kbar_t[:, None]).mean()),
)
# what actually ran: env decisions IMMEDIATE of any candidate (fresh or queued), their work
imm = dec_env == 2
x = jax.tree.map(lambda a: np.asarray(a)[W:], out["x"])
k_all = np.maximum(np.ceil(x.delay_s / 0.05), 1)
res["env_runs_per_env_slot"] = float(imm.sum(-1).mean())
res["env_sum_run_work_per_slot_over_M"] = float((imm * k_all).sum(-1).mean() / M.mean())
q_adm = (d == 1) & b.fresh
res["learner_queue_admissions_per_env_slot"] = float(q_adm.sum(-1).mean())
res["outage_share_of_imm"] = float(np.asarray(out["outage"])[W:][ (d==2)&b.fresh].mean()) if ((d==2)&b.fresh).any() else None
print(json.dumps(res, indent=1))
