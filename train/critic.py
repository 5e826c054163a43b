"""Stage-1 critic calibration: measure a trained policy's ΔQ against Monte-Carlo policy
evaluation, and write a policy folder whose critic is refit for the frozen final actor.

``check_and_refit(policy_dir, out, ...)`` is what ``python -m train.critic_refit`` runs:

1. loads the ``train.ppo`` run (one seed) and rebuilds the env it was trained on
   (``envs.stage1.build_env``: the per-user screening MDP, the training reward of its
   ``policy_meta.json``);
2. *before*: on ``eval_states`` decision points visited by the greedy actor on the judged
   split (``split``, default validation: problems the policy did not train on; seeds of that
   split's range, ``prada_jax.traces.splits``), compares the critic's ΔQ with ΔQ_MC of the greedy actor
   (``evals.policy_eval``; exact for the greedy actor in that env, R = 1) and, with
   ``sampling_replicates > 0``, with ΔQ_MC of the sampling policy the critic was trained on;
3. unless ``measure_only``: draws ``fit_states`` other decision points (nine tenths on the
   policy's training problems, seed ``seed``; one tenth on the judged split for early
   stopping), computes MC targets Q(s, 0), Q(s, 1) of the greedy actor, regresses the critic
   (never the actor) on the training tenths, stops on the judged tenth, and writes ``out`` as a policy
   folder every command loads (``config.json``, ``policy_meta.json`` with a ``critic_refit``
   record, ``checkpoints/<step>/`` holding the whole learner state with the new critic);
4. *after*: the same comparison for the refit critic on the same evaluation states.

``out/critic_check.json`` holds every number (``before``, ``after``, ``refit``, sizes, seeds).
Same arguments → same file on CPU. All traces are synthetic unless the policy's are not.
"""
from __future__ import annotations

import copy
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from envs import stage1
from evals import policy_eval as pe
from prada_jax import checkpointing
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from prada_jax.rl import critic_fit
from prada_jax.rl import policy as policy_files
from prada_jax.traces import splits

__all__ = ["check_and_refit", "REPORT_FILE"]

REPORT_FILE = "critic_check.json"


def validate(policy_dir: str, out: str, measure_only: bool) -> None:
    """Bad input before anything is written: raises ``BadInput`` naming the flag."""
    p = Path(policy_dir)
    if not p.is_dir():
        raise BadInput(f"--policy={policy_dir}: no such run directory")
    o = Path(out)
    if o.exists() and not o.is_dir():
        raise BadInput(f"--out={out} exists and is not a folder")
    if not measure_only and o.is_dir() and any(o.iterdir()) and not (o / REPORT_FILE).is_file():
        raise BadInput(f"--out={out} is a non-empty folder that is not a critic refit; use a "
                       "new folder")
    if o.resolve() == p.resolve():
        raise BadInput(f"--out={out} is the --policy folder; the refit writes a new one")


def check_and_refit(policy_dir: str, out: str, *, fit_states: int = 40000,
                    eval_states: int = 6000, sampling_replicates: int = 0, seed: int = 0,
                    steps: int = 4000, measure_only: bool = False, log=print,
                    split: str = "validation") -> dict:
    """Measures (and unless ``measure_only`` refits) the critic of ``policy_dir``; see the
    module docstring. Returns the report dict (also written to ``out/critic_check.json``).

    ``split``: the part of the trace set the critic is judged on and the refit's early stopping
    chooses on (``prada_jax.traces.splits``; default validation, with seeds of that part's
    range). The Monte-Carlo regression targets come from the policy's own training env (its
    ``config.env.split``) and training seeds."""
    splits.check_split_name(split, "--split")
    validate(policy_dir, out, measure_only)
    policy = policy_files.load_checked(str(policy_dir))   # BadInput naming the folder
    config, meta = policy.config, policy.meta
    if int(meta.get("num_seeds", 1)) != 1:
        raise BadInput(f"--policy={policy_dir}: holds {meta['num_seeds']} seeds; the refit "
                       "handles a single-seed run")
    if meta.get("env") != "edge" or meta.get("critic", "q") != "q":
        raise BadInput(f"--policy={policy_dir}: not an edge-env policy with a Q critic "
                       f"(env {meta.get('env')!r}, critic {meta.get('critic')!r})")
    if bool(config.env.contention):
        raise BadInput(f"--policy={policy_dir}: trained with contention (users interact); the "
                       "one-user Monte-Carlo branching needs the per-user MDP")
    t0 = time.time()
    env, params, _ = stage1.build_env(config)        # the policy's training problems
    judge_config = copy.deepcopy(config)
    with judge_config.unlocked():
        judge_config.env.split = split
    judge_env, judge_params, judge_info = stage1.build_env(judge_config)
    judge_seed = splits.seed_base(split) + int(seed)   # validation / test seed range
    gamma = float(config.ppo.gamma)
    apply_fn = policy.apply_fn
    report = {"policy": str(policy_dir), "step": int(meta["step"]),
              "reward_mode": meta.get("reward_mode", "coarse"),
              "traces": meta.get("traces"), "gamma": gamma, "seed": int(seed),
              "env": "the policy's training env (envs.stage1.build_env: per-user MDP, "
                     "no contention)",
              "split": split, "judge_problems": int(judge_info.get("num_problems", -1)),
              "judge_seed0": judge_seed,
              "split_note": f"before/after and early stopping on the {split} split (seeds "
                            f"from {judge_seed}); regression targets on the policy's "
                            f"training problems ({config.env.get('split', 'all')})",
              "eval_states": int(eval_states), "fit_states": int(fit_states),
              "sampling_replicates": int(sampling_replicates)}

    def sample(n, k, env=env, params=params):
        # A user of the demo policy decides about once per 6 slots (measured: 22 926 decision
        # points in 547 slots × 32 envs × 8 users); 7 slots per requested state leave
        # headroom so the states are drawn without replacement (distinct).
        slots = max(200, int(np.ceil(n / 32 / int(params.num_users) * 7)))
        return pe.sample_decision_states(env, params, apply_fn, policy.params, k,
                                         num_states=n, num_envs=32, num_slots=slots)

    ev = sample(int(eval_states), jax.random.key(judge_seed + 1), judge_env, judge_params)
    mc_g = pe.mc_action_values(judge_env, judge_params, apply_fn, policy.params, ev,
                               jax.random.key(judge_seed + 2), gamma=gamma, greedy=True)
    q, logits = pe.critic_values(apply_fn, policy.params, ev.obs)
    nom = logits[:, 1] > logits[:, 0]
    report["before"] = {"greedy": pe.compare(q[:, 1] - q[:, 0], mc_g, nom),
                        "unfinished": mc_g.unfinished}
    log(f"[{time.time() - t0:6.1f}s] before: {_summary(report['before']['greedy'])}")
    if sampling_replicates > 0:
        mc_s = pe.mc_action_values(judge_env, judge_params, apply_fn, policy.params, ev,
                                   jax.random.key(judge_seed + 3), gamma=gamma, greedy=False,
                                   replicates=int(sampling_replicates))
        report["before"]["sampling"] = pe.compare(q[:, 1] - q[:, 0], mc_s, nom)
        log(f"[{time.time() - t0:6.1f}s] before (sampling policy, R={sampling_replicates}): "
            f"{_summary(report['before']['sampling'])}")
    if measure_only:
        _write_report(Path(out), report)
        return report

    # Early stopping chooses on the judged split: a tenth of the states come from it.
    n_val = max(1, int(fit_states) // 10)
    fit = sample(int(fit_states) - n_val, jax.random.key(int(seed) + 10))
    mc_f = pe.mc_action_values(env, params, apply_fn, policy.params, fit,
                               jax.random.key(int(seed) + 11), gamma=gamma, greedy=True)
    y = pe.fit_targets(mc_f)
    val = sample(n_val, jax.random.key(judge_seed + 10), judge_env, judge_params)
    mc_v = pe.mc_action_values(judge_env, judge_params, apply_fn, policy.params, val,
                               jax.random.key(judge_seed + 11), gamma=gamma, greedy=True)
    new_params, info = critic_fit.refit_critic(
        apply_fn, policy.params, fit.obs, y, jax.random.key(int(seed) + 12),
        steps=int(steps), val_obs=val.obs, val_targets=pe.fit_targets(mc_v))
    log(f"[{time.time() - t0:6.1f}s] refit: best held-out loss at step {info['best_step']} "
        f"of {steps}")
    q2, logits2 = pe.critic_values(apply_fn, new_params, ev.obs)
    assert np.array_equal(logits2, logits), "the refit changed the actor"
    report["refit"] = dict(info, steps=int(steps), targets="MC Q(s,0), Q(s,1) of the greedy "
                           "actor (R=1, exact in the per-user MDP)", held_out=int(n_val),
                           held_out_split=split)
    report["after"] = {"greedy": pe.compare(q2[:, 1] - q2[:, 0], mc_g, nom)}
    if sampling_replicates > 0:
        report["after"]["sampling"] = pe.compare(q2[:, 1] - q2[:, 0], mc_s, nom)
    log(f"[{time.time() - t0:6.1f}s] after: {_summary(report['after']['greedy'])}")
    _write_policy(Path(policy_dir), Path(out), config, meta, new_params, report)
    _write_report(Path(out), report)
    return report


def _summary(c: dict) -> str:
    return (f"sign agree {c['sign_agree']:.3f}, pearson {c['pearson']:.3f}, bias "
            f"{c['bias']:+.4f}; actor nominations {c['nominations']}: critic ΔQ>0 "
            f"{c['nom_critic_positive']:.3f}, MC mean {c['nom_mc_mean']:+.4f}, critic mean "
            f"{c['nom_critic_mean']:+.4f}; gain/state actor {c['rule_gain']['actor']:+.4f}, "
            f"actor∧critic {c['rule_gain']['actor_and_critic']:+.4f}, critic "
            f"{c['rule_gain']['critic']:+.4f}")


def _write_report(out: Path, report: dict) -> None:
    write_json(out / REPORT_FILE, report, indent=1, sort_keys=True)


def _write_policy(src: Path, out: Path, config, meta: dict, new_params, report: dict) -> None:
    """``out`` as a ``train.ppo`` run folder: the source's config.json and run.json, its
    policy_meta.json plus ``critic_refit``, and its newest checkpoint's whole learner state with
    the critic parameters replaced (saved under the same step)."""
    setup = stage1.build_setup(config)
    template = setup.init_states(config)
    step = int(meta["step"])
    src_ckpt = checkpointing.Checkpointer(src / "checkpoints", create=False)
    try:
        state, ckpt_meta = src_ckpt.restore(template, step=step)
    finally:
        src_ckpt.close()
    state = state.replace(params=jax.tree.map(lambda x: jnp.asarray(x)[None], new_params))
    if out.exists() and (out / "checkpoints").exists():
        shutil.rmtree(out / "checkpoints")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "run.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    keep = {k: v for k, v in meta.items() if k not in ("step", "seed", "checkpoint_meta")}
    keep["critic_refit"] = {
        "source": str(src), "source_step": step,
        "what": "critic torso and Q head regressed on Monte-Carlo Q(s,0), Q(s,1) of the frozen "
                "greedy actor (train.critic); actor unchanged",
        "fit_states": report["fit_states"], "steps": report["refit"]["steps"],
        "best_step": report["refit"]["best_step"], "seed": report["seed"]}
    policy_files.write_policy_meta(out, keep)
    ck = checkpointing.Checkpointer(out / "checkpoints", max_to_keep=1)
    try:
        ck.save(step, state, meta=dict(ckpt_meta, critic_refit=True), force=True)
    finally:
        ck.close()
