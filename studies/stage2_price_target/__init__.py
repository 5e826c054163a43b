"""The price's target: capacity clearing against the objective on ``slow_server`` (issue 33
item 4). Is the validation grid's preference for a price above the capacity-clearing one real
or seed noise? Per policy sample (``python -m train.policy_samples``), SYNTHETIC gsm8k, at the
stage-2 verdict's sizes (``studies.stage2_verdict.SIZES``):

* :func:`learned` — the capacity-clearing constant λ_s the default learner (averaged
  subgradient, ρ = 1) finds on ``slow_server`` per learner seed (validation split and seeds),
  as ``studies.stage2_verdict.run`` learns it (``flatness``'s companion,
  ``learned_seed<k>.json``);
* :func:`flatness` — the per-seed objective (accuracy − β·latency) of PRADA at the constant
  prices ``LAMS`` (µ = 0) on S validation seeds and S fresh test seeds, each paired against
  λ_s = ``REF`` on the same seeds (``flatness_seed<k>.json``);
* :func:`summarize` — per policy sample: the grid point λ_c nearest the mean clearing price,
  the validation argmax λ_v, and on the fresh test seeds obj(λ_v) − obj(λ_c) with its 95 % t
  interval; over the samples, ``prada_jax.stats.hierarchical_interval`` of that difference
  (policies × 1 × test seeds) (``summary.json``).

The command is ``python -m studies.stage2_price_target`` (its docstring); the records of the
three policy samples are in ``studies/stage2_price_target/results/``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from envs import edge, scenarios
from evals import suite
from prada_jax import stats
from prada_jax.errors import BadInput
from prada_jax.sched.registry import SCHEDULER_NAMES
from studies import stage2_verdict as s2

#: The constant prices λ_s (µ = 0) of the flatness grid and the reference every one is paired
#: against.
LAMS = (0.0, 0.0631, 0.0794, 0.1, 0.1259, 0.1585, 0.1995, 0.3162)
REF = 0.1
SCENARIO = "slow_server"
#: Bootstrap resamples of the pooled interval.
RESAMPLES = 10000


def _policy_env(policy, size: dict) -> dict:
    """The verdict's env for ``policy`` at ``size`` under ``SCENARIO``'s own M, B and speed."""
    env_kw = suite.env_kwargs_from(policy.config, dict(size["env"],
                                                       num_users=size["num_users"]))
    env_kw["train_problems"] = int(policy.config.env.get("problems", 0))
    env_kw["choice_split"] = "validation"
    env_kw.update(scenarios.preset_env(SCENARIO))
    return env_kw


def learned(policy_dir, out: Path, learner_seeds=(0, 1), size: str = "full",
            log=print) -> dict:
    """The capacity-clearing constant pair per learner seed (learner runs under
    ``out/seed<s>``, reused when rerun)."""
    sz = dict(s2.SIZES[size])
    policy = suite.load_policy(str(policy_dir))
    env_kw = _policy_env(policy, sz)
    res = {"policy": str(policy_dir), "scenario": SCENARIO, "synthetic": True, "learned": {}}
    for s in learner_seeds:
        _, r, _, _ = s2.learn_multipliers(Path(out) / f"seed{s}", SCENARIO, Path(policy_dir),
                                          env_kw, sz, False, seed=int(s))
        m = r["multipliers"]
        res["learned"][str(s)] = {"lambda_s": float(m.lambda_s),
                                  "mu_per_mhz": float(m.mu) * 1e6,
                                  "scalars": {k: v for k, v in r["scalars"].items()
                                              if k.startswith("dual/")}}
        log(f"learner seed {s}: λ_s={res['learned'][str(s)]['lambda_s']:.4g}, "
            f"µ={res['learned'][str(s)]['mu_per_mhz']:.4g}/MHz")
    return res


def flatness(policy_dir, seeds: int = 16, test_seed0: int = 32, size: str = "full",
             lams=LAMS, ref: float = REF, log=print) -> dict:
    """Per-seed objective at each price of ``lams`` on ``seeds`` validation seeds and
    ``seeds`` test seeds from offset ``test_seed0``, paired against ``ref`` (one of
    ``lams``)."""
    lams = tuple(float(x) for x in lams)
    if float(ref) not in lams:
        raise BadInput(f"the reference price {ref} is not on the grid {lams}")
    sz = dict(s2.SIZES[size])
    policy = suite.load_policy(str(policy_dir))
    env_kw = _policy_env(policy, sz)
    n = env_kw["train_problems"] or None
    tseed = int(policy.config.env.trace_seed) + suite.HELD_OUT_SEED_OFFSET
    sched = SCHEDULER_NAMES.index("threshold")
    true_reward = policy.meta.get("reward_mode", "coarse") == "true"
    res = {"policy": str(policy_dir), "lams": lams, "ref": float(ref), "seeds": int(seeds),
           "scenario": SCENARIO, "synthetic": True, "size": size, "sets": {}}
    for split, off in (("validation", 0), ("test", int(test_seed0))):
        tr = suite.load_traces("gsm8k", n, tseed, split=split)
        s0 = suite.evaluation_seed0(tr.info, policy, int(seeds), seed0=off)
        p = edge.make_params(tr.traces, **{k: env_kw[k] for k in s2._ENV_KEYS},
                             **scenarios.latency_overrides(env_kw),
                             scenario=scenarios.preset(SCENARIO, sz["scenario_length"]))
        p = p.replace(policy_true_reward=jnp.asarray(true_reward))
        r = s2.Runner(p, int(seeds), sz["slots"], sz["warmup"], policy.apply_fn,
                      policy.params, seed0=s0)
        t0 = time.time()
        obj = r.run_grid(sched, np.asarray(lams), np.zeros(len(lams)))     # [G, S]
        base = obj[lams.index(float(ref))]
        rows = {}
        for lam, o in zip(lams, obj):
            ci = stats.mean_ci(o - base, 0.95)
            rows[str(lam)] = {"objective_mean": float(np.mean(o)), "minus_ref": float(ci.mean),
                              "lo": float(ci.low), "hi": float(ci.high),
                              "per_seed": [float(v) for v in o]}
        res["sets"][split] = {"seed0": s0, "rows": rows, "wall_s": time.time() - t0}
        log(f"{split} (seeds from {s0}): " + ", ".join(
            f"{k}: {v['objective_mean']:.4f} ({v['minus_ref']:+.4f} [{v['lo']:+.4f}, "
            f"{v['hi']:+.4f}])" for k, v in rows.items()))
    return res


def read_records(results_dir) -> dict:
    """``{k: (flatness dict, learned dict)}`` of every policy sample ``k`` with both
    ``flatness_seed<k>.json`` and ``learned_seed<k>.json`` under ``results_dir``."""
    d = Path(results_dir)
    out = {}
    for f in sorted(d.glob("flatness_seed*.json")):
        k = f.stem.removeprefix("flatness_seed")
        lf = d / f"learned_seed{k}.json"
        if lf.is_file():
            try:
                out[int(k)] = (json.loads(f.read_text()), json.loads(lf.read_text()))
            except ValueError as e:
                raise BadInput(f"--out={d}: {f.name} or {lf.name} is not JSON ({e})") from None
    return out


def sample_row(k: int, fl: dict, le: dict) -> tuple[dict, np.ndarray]:
    """One policy sample's row of the summary and its test-seed differences
    obj(λ_v) − obj(λ_c)."""
    clear = [v["lambda_s"] for v in le["learned"].values()]
    lams = [float(x) for x in fl["sets"]["validation"]["rows"]]
    lam_c = min(lams, key=lambda x: abs(x - np.mean(clear)))
    val = {float(x): np.mean(r["per_seed"]) for x, r in fl["sets"]["validation"]["rows"].items()}
    lam_v = max(val, key=val.get)
    test = {float(x): np.asarray(r["per_seed"]) for x, r in fl["sets"]["test"]["rows"].items()}
    lam_t = max(test, key=lambda x: test[x].mean())
    ci = stats.mean_ci(test[lam_v] - test[lam_c], 0.95)
    row = {"policy_sample": int(k), "clearing_lambda_s": clear, "lambda_c": lam_c,
           "validation_argmax": lam_v, "test_argmax": lam_t,
           "test_vchosen_minus_clearing": {"mean": ci.mean, "lo": ci.low, "hi": ci.high,
                                           "n": ci.n},
           "validation_vchosen_minus_clearing": float(val[lam_v] - val[lam_c])}
    return row, test[lam_v] - test[lam_c]


def summarize(records: dict, resamples: int = RESAMPLES, log=print) -> dict:
    """``summary.json`` from :func:`read_records`'s records: one row per policy sample and,
    with ≥ 2 samples of equal seed counts, the pooled interval of obj(λ_v) − obj(λ_c)."""
    rows, diffs = [], []
    for k, (fl, le) in sorted(records.items()):
        row, diff = sample_row(k, fl, le)
        rows.append(row)
        diffs.append(diff)
        ci = row["test_vchosen_minus_clearing"]
        log(f"policy {k}: clearing λ_s "
            f"{', '.join(f'{c:.3f}' for c in row['clearing_lambda_s'])} "
            f"(grid {row['lambda_c']}); validation argmax {row['validation_argmax']} "
            f"(+{row['validation_vchosen_minus_clearing']:.4f}); test argmax "
            f"{row['test_argmax']}; test obj(λ_v) − obj(λ_c) = {ci['mean']:+.4f} "
            f"[{ci['lo']:+.4f}, {ci['hi']:+.4f}]")
    pooled = None
    if len(diffs) >= 2 and len({len(x) for x in diffs}) == 1:
        # policies × 1 (the grid rows have no learner) × test seeds
        pooled = stats.hierarchical_interval(np.asarray(diffs)[:, None, :],
                                             resamples=resamples, seed=0)
        log(f"pooled over {len(diffs)} policy samples: {pooled['mean']:+.4f} "
            f"[{pooled['lo']:+.4f}, {pooled['hi']:+.4f}] (bootstrap "
            f"[{pooled['bootstrap']['lo']:+.4f}, {pooled['bootstrap']['hi']:+.4f}], "
            f"cluster t [{pooled['cluster_t']['lo']:+.4f}, {pooled['cluster_t']['hi']:+.4f}])")
    return {"synthetic": True, "scenario": SCENARIO, "rows": rows,
            "pooled_test_vchosen_minus_clearing": pooled}


def write_json(path: Path, obj: dict) -> None:
    """The records' format (``json.dump(..., indent=1)``, as committed)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
