"""What a stage-2 scenario can show, measured on VALIDATION before a verdict (issue 33 item 5):
``python -m studies.stage2_pooled.headroom --policy=DIR --out=FILE.json --candidates=SPEC;SPEC;...
[--seeds=8] [--size=full]``.

For one screening policy and each candidate scenario this evaluates, on the validation split
with validation seeds (the split and seeds the verdict's choices use; never test), the two rows
that bound what a price can gain: ``PRADA (λ=µ=0)`` (the threshold rule at zero prices, the
scheduler every stage-2 learner trains) and ``Policy (no limits)`` (the policy's nominations
served without capacity or bandwidth limits). Per candidate it reports the headroom (mean over
seeds of no limits − λ=µ=0, objective in PRM units), the per-seed spread of that difference,
the rule's server occupancy (busy units / M), the share of slots in which capacity binds, the
blocked share, and two minimum detectable effects (two-sided t at 5 %, power 80 %):

* ``mde_one_draw``: the paired MDE over the S seeds of this one policy;
* ``mde_pooled_floor``: the MDE of the pooled verdict's gate at P policies (t over P policy
  means, P − 1 df) if the policy means varied only through their L·S evaluation seeds
  (sd of a policy mean = per-seed sd / sqrt(L·S)). A FLOOR: between-policy variance, which one
  policy cannot measure, can only raise it.

A candidate SPEC is ``schedule`` or ``schedule:key=value,key=value`` with ``schedule`` a preset
of ``envs.scenarios`` (its schedule AND its ``PRESET_ENV`` scalars) and keys among
``num_servers``, ``num_users``, ``arrival_rate_hz``, ``bandwidth_hz``, ``server_speed``
(overriding the size's env and the preset's). The env is otherwise ``studies.stage2_verdict``'s: the
policy run's env (its hardware pair included) under the size's overrides. Nothing is learned
here. All traces SYNTHETIC (gsm8k). Exit codes (``prada_jax.cli``): 2 bad input (one line
naming the flag), 1 a bug.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from absl import flags

from envs import edge, scenarios
from evals import suite
from prada_jax import cli, config_utils, latency, stats
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from prada_jax.sched.registry import SCHEDULER_NAMES
from studies import stage2_verdict as s2

#: Env keys a candidate may override (``studies.stage2_verdict``'s env settings plus server_speed).
SPEC_KEYS = ("num_servers", "num_users", "arrival_rate_hz", "bandwidth_hz", "server_speed")
_INT_KEYS = ("num_servers", "num_users")


def parse_candidates(text: str, flag: str = "--candidates") -> list[tuple[str, str, dict]]:
    """``"nominal;nominal:num_servers=4,arrival_rate_hz=6"`` → [(label, preset, overrides)];
    ``BadInput`` naming ``flag`` for an unknown preset or key, a non-positive value, or a
    label listed twice."""

    out, seen = [], set()
    for item in filter(None, (t.strip() for t in str(text).split(";"))):
        name, _, rest = item.partition(":")
        name = name.strip()
        if name not in scenarios.PRESETS:
            raise BadInput(f"{flag}: unknown scenario {name!r} in {item!r}; known: "
                           f"{', '.join(scenarios.PRESETS)}")
        over = {}
        for kv in filter(None, (t.strip() for t in rest.split(","))):
            k, sep, v = kv.partition("=")
            k = k.strip()
            if not sep or k not in SPEC_KEYS:
                raise BadInput(f"{flag}: {kv!r} in {item!r} is not KEY=VALUE with KEY in "
                               f"{SPEC_KEYS}")
            try:
                val = float(v)
            except ValueError:
                raise BadInput(f"{flag}: {kv!r} in {item!r}: not a number") from None
            if not (np.isfinite(val) and val > 0):
                raise BadInput(f"{flag}: {kv!r} in {item!r}: must be a finite number > 0")
            why = config_utils.float32_problem(val)
            if why:
                raise BadInput(f"{flag}: {kv!r} in {item!r}: {why}")
            if k in _INT_KEYS and (val != int(val) or val > suite.MAX_ENV_COUNT):
                raise BadInput(f"{flag}: {kv!r} in {item!r}: must be an integer <= "
                               f"{suite.MAX_ENV_COUNT}")
            over[k] = int(val) if k in _INT_KEYS else val
        label = item.replace(" ", "")
        if label in seen:
            raise BadInput(f"{flag}: {item!r} is listed twice")
        seen.add(label)
        out.append((label, name, over))
    if not out:
        raise BadInput(f"{flag}: no candidate given")
    return out


def pooled_mde_floor(sd_seed: float, policies: int = 3, learner_seeds: int = 2,
                     seeds: int = 8, alpha: float = 0.05, power: float = 0.8) -> float:
    """``stats.min_detectable_effect`` over ``policies`` policy means whose sd is
    ``sd_seed / sqrt(learner_seeds · seeds)`` (no between-policy variance: a floor)."""
    sd_mean = float(sd_seed) / np.sqrt(int(learner_seeds) * int(seeds))
    return stats.min_detectable_effect(sd_mean, int(policies), alpha, power)


def measure(policy_dir: str, candidates, seeds: int = 8, size: str = "full",
            log=print, out: Path | None = None) -> dict:
    """Per candidate the rows λ=µ=0 and no limits on validation (module docstring); with
    ``out`` the JSON is rewritten after every candidate (a long run keeps what it measured)."""

    policy = suite.load_policy(str(policy_dir), flag="--policy")
    sz = dict(s2.SIZES[size])
    env_kw = suite.env_kwargs_from(policy.config, dict(sz.get("env", {}),
                                                       num_users=sz["num_users"]))
    n_problems = int(policy.config.env.get("problems", 0)) or None
    tseed = int(policy.config.env.trace_seed) + suite.HELD_OUT_SEED_OFFSET
    traces = suite.load_traces("gsm8k", n_problems, tseed, split="validation")
    seed0 = suite.evaluation_seed0(traces.info, policy, int(seeds), flag="--seeds")
    sched = SCHEDULER_NAMES.index("threshold")
    true_reward = str(policy.meta.get("reward_mode", "coarse")) == "true"
    where = Path(out).parent if out is not None else Path.cwd()
    res = {"meta": {"synthetic": True, **suite.policy_record(policy_dir, where),
                    "split": "validation",
                    "seed_range": [seed0, seed0 + int(seeds)], "size": size,
                    "slots": sz["slots"], "warmup": sz["warmup"],
                    "scenario_length": sz["scenario_length"],
                    "hardware": env_kw["hardware"], "beta": env_kw["beta"],
                    "mde": "two-sided t at 5 %, power 80 %"}, "candidates": {}}
    t0 = time.perf_counter()
    for label, name, over in candidates:
        env_s = dict(env_kw, **dict(scenarios.preset_env(name), **over))   # spec wins
        p = edge.make_params(traces.traces, **{k: env_s[k] for k in s2._ENV_KEYS},
                             **scenarios.latency_overrides(env_s),
                             hardware=env_s.get("hardware", latency.DEFAULT_PAIR),
                             scenario=scenarios.preset(name, sz["scenario_length"]))
        if hasattr(p, "policy_true_reward"):
            p = p.replace(policy_true_reward=np.asarray(true_reward))
        r = s2.Runner(p, int(seeds), sz["slots"], sz["warmup"], policy.apply_fn,
                      policy.params, seed0=seed0)
        zero = r.run_prada(sched, 0.0, 0.0)
        nolim = r.run(s2.baseline_specs(r.screen)[s2.ROW_NOLIM])
        d = (np.asarray(nolim["objective"], np.float64)
             - np.asarray(zero["objective"], np.float64))
        sd = float(np.std(d, ddof=1))
        rep = {"preset": name, "env": {k: env_s[k] for k in s2._ENV_KEYS + ("hardware",)},
               "server_speed": float(env_s.get("server_speed", 1.0)),
               "headroom": float(np.mean(d)), "headroom_sd_seed": sd,
               "headroom_per_seed": [float(v) for v in d],
               "mde_one_draw": float(stats.min_detectable_effect(sd, d.size)),
               "mde_pooled_floor": pooled_mde_floor(sd),
               "rows": {}}
        for row, m in ((s2.ROW_ZERO, zero), (s2.ROW_NOLIM, nolim)):
            rep["rows"][row] = {k: float(np.nanmean(np.asarray(m[k], np.float64)))
                                for k in ("objective", "accuracy", "latency_mean_s",
                                          "server_util", "capacity_bound_share",
                                          "blocked_rate") if k in m}
        res["candidates"][label] = rep
        if out is not None:
            write_json(Path(out), res, allow_nan=True)
        z = rep["rows"][s2.ROW_ZERO]
        log(f"[{time.perf_counter() - t0:6.0f}s] {label}: headroom {rep['headroom']:+.4f} "
            f"(sd {sd:.4f}; MDE one draw {rep['mde_one_draw']:.4f}, pooled floor "
            f"{rep['mde_pooled_floor']:.4f}); λ=µ=0: objective {z['objective']:.3f}, "
            f"occupancy {z['server_util']:.2f}, capacity binds "
            f"{100 * z.get('capacity_bound_share', float('nan')):.0f}% of slots, blocked "
            f"{100 * z.get('blocked_rate', float('nan')):.0f}%")
    res["meta"]["wall_s"] = time.perf_counter() - t0
    return res


def _define_flags():
    flags.DEFINE_string("policy", None, "Policy folder (train.ppo run or critic refit).")
    flags.DEFINE_string("out", None, "Output JSON file.")
    flags.DEFINE_string("candidates", "nominal", "Candidates, ';'-separated: "
                        "preset[:key=value,...] (keys: " + ", ".join(SPEC_KEYS) + ").")
    flags.DEFINE_integer("seeds", 8, "Validation seeds.")
    flags.DEFINE_enum("size", "full", ["quick", "demo", "full"], "studies.stage2_verdict size.")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    if not F.policy or not Path(F.policy).is_dir():
        raise BadInput(f"--policy={F.policy}: no such policy folder")
    if not F.out:
        raise BadInput("--out is required (a JSON file)")
    config_utils.check_output_file(F.out, "--out")   # a folder there: refused before measuring
    if F.seeds < 2:
        raise BadInput(f"--seeds must be >= 2, got {F.seeds}")
    cands = parse_candidates(F.candidates)
    Path(F.out).parent.mkdir(parents=True, exist_ok=True)
    res = measure(F.policy, cands, F.seeds, F.size, out=Path(F.out))
    write_json(Path(F.out), res, allow_nan=True)
    print(json.dumps({k: {"headroom": v["headroom"], "mde_pooled_floor": v["mde_pooled_floor"]}
                      for k, v in res["candidates"].items()}, indent=1))


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
