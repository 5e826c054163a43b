"""Does the trained screening policy beat the baselines? (issue 4, "Learning")

    python -m benchmarks.ppo_learning --workdir=DIR [--num_slots=1500] [--num_envs=16]

Loads every seed of a ``train.ppo`` run, rebuilds its env (same trace set), and evaluates with
the same random numbers: the trained policy (greedy), all-keep, all-nominate, random screening
(p = 0.5), and a classifier of the same architecture fitted to oracle labels on the same
features (offload iff the LLM step's PRM gain minus β·server compute beats the draft's). Prints
a table of the mean coarse return per finished user episode and writes
``<workdir>/eval_learning.json``. Numbers on synthetic trace sets are synthetic.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags

from envs import stage1
from prada_jax import cli, config_utils
from prada_jax.rl import evaluate, policy, trainer

_WORKDIR = flags.DEFINE_string("workdir", None, "train.ppo run directory")
_NUM_SLOTS = flags.DEFINE_integer("num_slots", 1500, "slots per evaluation rollout")
_NUM_ENVS = flags.DEFINE_integer("num_envs", 16, "envs per evaluation rollout")
_EVAL_SEED = flags.DEFINE_integer("eval_seed", 1234, "seed of the evaluation rollouts")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default latest)")


def run(workdir, num_slots=1500, num_envs=16, eval_seed=1234, step=None) -> dict:
    workdir = Path(workdir)
    trainer.config_utils.check_run_dir(workdir, "--workdir",
                                       files=("config.json", "policy_meta.json"),
                                       kind="train.ppo run")
    config = trainer.config_utils.read_config_json(workdir)
    meta = policy.read_policy_meta(workdir)
    env, env_params, trace_info = stage1.build_env(config)
    policies = [policy.load_policy(workdir, step=step, seed_index=i)[0]
                for i in range(int(meta["num_seeds"]))]
    apply_fn = policies[0].apply_fn
    action_fn = stage1.action_fn_of(env_params, bool(config.env.pass_gain))
    eval_fn = jax.jit(evaluate.make_rollout_eval(env, apply_fn, num_envs, num_slots, action_fn))
    key = jax.random.key(eval_seed)

    labels = evaluate.oracle_labels(env_params)
    obs = evaluate.node_observations(env_params)
    t0 = time.perf_counter()
    clf_params, clf_acc = evaluate.fit_label_classifier(
        jax.random.key(eval_seed + 1), obs, labels, tuple(config.net.hidden),
        separate_critic=bool(config.net.separate_critic))
    fit_s = time.perf_counter() - t0
    dummy = policies[0].params
    rows = {}

    def _eval(name, params, use_net, p):
        t = time.perf_counter()
        rows[name] = evaluate.summarize(eval_fn(key, env_params, params, use_net, p))
        rows[name]["eval_s"] = time.perf_counter() - t

    _eval("all_keep", dummy, False, 0.0)
    _eval("all_nominate", dummy, False, 1.0)
    _eval("random_p0.5", dummy, False, 0.5)
    _eval("oracle_label_classifier", clf_params, True, 0.0)
    for pol in policies:
        _eval(f"ppo_seed{pol.meta['seed']}", pol.params, True, 0.0)
    ppo = [rows[f"ppo_seed{p.meta['seed']}"]["episode_return"] for p in policies]
    base = {k: rows[k]["episode_return"] for k in ("all_keep", "all_nominate", "random_p0.5")}
    oracle = rows["oracle_label_classifier"]["episode_return"]
    # Coarse returns are negative (every step pays its draft's compute), so a plain ratio of
    # returns is meaningless. "Reaches 90% of the classifier" is judged on the screening gain
    # over the best constant policy: (ppo − best_const) >= 0.9 · (classifier − best_const).
    best_const = max(base["all_keep"], base["all_nominate"])
    gain_ratio = [(r - best_const) / (oracle - best_const) if oracle != best_const
                  else float("nan") for r in ppo]
    verdict = {
        "beats_every_baseline_all_seeds": bool(all(r > max(base.values()) for r in ppo)),
        "return_minus_classifier_per_seed": [r - oracle for r in ppo],
        "gain_over_best_constant_vs_classifier_per_seed": gain_ratio,
        "reaches_90pct_of_classifier_all_seeds": bool(
            oracle > best_const and all(g >= 0.9 for g in gain_ratio)),
    }
    result = {"workdir": str(workdir), "step": policies[0].meta["step"],
              "seeds": [p.meta["seed"] for p in policies], "trace_info": trace_info,
              "synthetic": bool(trace_info.get("synthetic", True)),
              "reward_mode": config.env.reward_mode, "eval": {"num_slots": num_slots,
              "num_envs": num_envs, "eval_seed": eval_seed},
              "oracle_labels": {"positive_rate": float(np.mean(labels)),
                                "classifier_train_accuracy": clf_acc, "fit_s": fit_s},
              "rows": rows, "verdict": verdict}
    (workdir / "eval_learning.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv):
    config_utils.reject_extra_argv(argv)
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    res = run(_WORKDIR.value, _NUM_SLOTS.value, _NUM_ENVS.value, _EVAL_SEED.value, _STEP.value)
    tag = " (SYNTHETIC traces)" if res["synthetic"] else ""
    print(f"policy evaluation{tag}: {res['trace_info'].get('source')}, step {res['step']}, "
          f"seeds {res['seeds']}, {res['eval']['num_envs']} envs x {res['eval']['num_slots']} "
          "slots")
    print(f"{'policy':28s} {'return/episode':>15s} {'nominate':>9s} {'correct':>8s} "
          f"{'latency_s':>9s} {'episodes':>9s}")
    for name, r in res["rows"].items():
        print(f"{name:28s} {r['episode_return']:15.5f} {r['nominate_rate']:9.3f} "
              f"{r.get('env/user_correct', float('nan')):8.3f} "
              f"{r.get('env/user_latency_s', float('nan')):9.3f} {r['episodes']:9.0f}")
    print(f"oracle labels: {res['oracle_labels']['positive_rate']:.3f} positive, classifier "
          f"train accuracy {res['oracle_labels']['classifier_train_accuracy']:.3f}")
    print("verdict:", json.dumps(res["verdict"]))


if __name__ == "__main__":
    cli.run(main)
