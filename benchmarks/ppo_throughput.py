"""PPO training throughput: env steps per second and where a chunk's time goes.

    python -m benchmarks.ppo_throughput [--variant=smoke] [--num_envs=16] [--repeats=5]
                                        [--compare]

Builds the learner of ``prada_jax/configs/ppo.py[:variant]`` and times, after compilation, (a) one
jitted training chunk (``updates_per_chunk`` × (rollout + GAE + epochs)), (b) the same number
of rollouts alone (the jitted rollout the chunk uses, vmapped over seeds) and (c) rollouts +
GAE. Prints medians over ``--repeats`` calls: env steps/s (one step = one slot of one U-user
env), user decisions/s, the rollout / GAE / update shares of a chunk (from the medians of
(a)-(c); shares of a shared, noisy machine), XLA's FLOP count of the compiled chunk per env
step (``cost_analysis()``; it counts the body of each scan/while loop ONCE, not once per
iteration, so it is far below the work done) and an analytic network FLOP count per env step
(2·params per forward; rollout forwards + epochs × 3 forwards per trained sample).

``--compare`` times the full-batch update (``ppo.decision_only=False``) and the decision-only
update of the same config in one process, alternating calls, and prints the speed ratio.
Trace sets are synthetic.
"""
from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.common import save_json
from envs import stage1
from prada_jax import cli, config_utils
from prada_jax.rl import learner, networks, trainer
from prada_jax.configs import ppo as ppo_configs

_VARIANT = flags.DEFINE_string("variant", "", "config variant of prada_jax/configs/ppo.py")
_NUM_ENVS = flags.DEFINE_integer("num_envs", None, "override ppo.num_envs")
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 1, "learner states vmapped")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed calls (median reported)")
_COMPARE = flags.DEFINE_boolean("compare", False, "full-batch vs decision-only update")
_JSON = flags.DEFINE_string("json", "", "also write the result to this JSON file")


def jax_tree_first(tree):
    """Seed 0 of a seed-stacked pytree."""
    return jax.tree.map(lambda x: x[0], tree)


def _flops(compiled) -> float | None:
    try:
        ca = compiled.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        return float(ca["flops"]) if ca and ca.get("flops") else None
    except Exception:  # noqa: BLE001 - cost analysis is optional on some backends
        return None


class _Bench:
    """One config's jitted chunk, rollouts-only and rollouts+GAE functions, compiled."""

    def __init__(self, variant="", num_envs=None, num_seeds=1, decision_only=None):
        config = ppo_configs.get_config(variant)
        config.num_seeds = num_seeds
        if decision_only is not None:
            config.ppo.decision_only = bool(decision_only)
        if num_envs:
            # keep the config's minibatch count (the optimiser steps per update)
            batch0 = config.ppo.num_envs * config.ppo.rollout_len * config.env.num_users
            n_mb = max(1, batch0 // config.ppo.minibatch_size)
            config.ppo.num_envs = num_envs
            batch = num_envs * config.ppo.rollout_len * config.env.num_users
            config.ppo.minibatch_size = max(1, batch // n_mb)
            while batch % config.ppo.minibatch_size:
                config.ppo.minibatch_size -= 1
        self.config = config
        setup = stage1.build_setup(config)
        self.setup = setup
        s = self.s = setup.settings
        self.chunk = trainer.make_jitted_chunk(setup)
        rollout = learner.make_rollout(s, setup.env, setup.apply_fn, setup.action_fn)

        def _rollouts(states, env_params, with_gae):
            def one(st):
                def body(carry, key):
                    env_state, obs, ep_ret = carry
                    env_state, obs, ep_ret, traj, _ = rollout(st.params, env_params, env_state,
                                                               obs, ep_ret, key)
                    out = jnp.sum(traj["decision"])
                    if with_gae:
                        lg, q = setup.apply_fn(st.params, obs)
                        adv, _ = learner.rollout_gae(traj, networks.value_from_critic(lg, q),
                                                     s.gamma, s.gae_lambda, s.gae_unroll)
                        out = out + 0 * jnp.sum(adv).astype(out.dtype)
                    return (env_state, obs, ep_ret), out
                keys = jax.random.split(st.key, s.updates_per_chunk)
                _, dec = jax.lax.scan(body, (st.env_state, st.obs, st.ep_return), keys)
                return jnp.sum(dec)
            return jax.vmap(one)(states)

        self.rollouts = jax.jit(lambda st, p: _rollouts(st, p, False))
        self.rollouts_gae = jax.jit(lambda st, p: _rollouts(st, p, True))
        self.states = setup.init_states(config)
        # One compile: the compiled chunk is both costed by XLA and called.
        t = time.perf_counter()
        self.chunk = self.chunk.lower(self.states, setup.env_params).compile()
        self.compile_chunk_s = time.perf_counter() - t
        self.flops = _flops(self.chunk)
        self.states, m = self.chunk(self.states, setup.env_params)
        jax.block_until_ready(m)
        t = time.perf_counter()
        jax.block_until_ready(self.rollouts(self.states, setup.env_params))
        jax.block_until_ready(self.rollouts_gae(self.states, setup.env_params))
        self.compile_rollout_s = time.perf_counter() - t
        self.chunk_s, self.roll_s, self.gae_s, self.decisions, self.overflow = [], [], [], [], []
        self.steps = num_seeds * s.num_envs * s.rollout_len * s.updates_per_chunk

    def time_once(self):
        p = self.setup.env_params
        t = time.perf_counter()
        jax.block_until_ready(self.rollouts(self.states, p))
        self.roll_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        jax.block_until_ready(self.rollouts_gae(self.states, p))
        self.gae_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        self.states, m = self.chunk(self.states, p)
        jax.block_until_ready(m)
        self.chunk_s.append(time.perf_counter() - t)
        self.decisions.append(float(np.sum(m["decisions"])))
        self.overflow.append(float(np.max(m["decision_overflow"])))

    def analytic_flops_per_env_step(self) -> float:
        """Network FLOPs per env step: 2·P per user forward (P = parameters, both torsos and
        heads) in the rollout, plus epochs × 3 forwards (forward + backward) per trained
        sample (all E·T·U samples, or the K compacted ones)."""
        s = self.s
        p = networks.count_params(jax_tree_first(self.states.params))
        u = self.setup.num_users
        n = s.num_envs * s.rollout_len * u
        trained = s.decision_capacity if s.decision_only else n
        per_update = 2.0 * p * (n + s.num_envs * u + 3 * s.num_epochs * trained)
        return per_update / (s.num_envs * s.rollout_len)

    def result(self, variant) -> dict:
        s = self.s
        c, r = statistics.median(self.chunk_s), statistics.median(self.roll_s)
        g = max(statistics.median(self.gae_s), r)
        return {
            "variant": variant or "default", "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind, "num_seeds": int(self.config.num_seeds),
            "num_envs": s.num_envs, "num_users": self.setup.num_users,
            "rollout_len": s.rollout_len, "updates_per_chunk": s.updates_per_chunk,
            "num_epochs": s.num_epochs, "num_minibatches": s.num_minibatches,
            "decision_only": s.decision_only, "decision_capacity": s.decision_capacity,
            "repeats": len(self.chunk_s),
            "compile_chunk_s": self.compile_chunk_s, "compile_rollout_s": self.compile_rollout_s,
            "chunk_s_median": c, "rollout_s_median": r, "rollout_gae_s_median": g,
            "chunk_s_all": self.chunk_s,
            "env_steps_per_s": self.steps / c,
            "user_decisions_per_s": statistics.median(self.decisions) / c,
            "decision_fraction": statistics.median(self.decisions)
            / (self.steps * self.setup.num_users),
            "max_decision_overflow": max(self.overflow),
            "rollout_only_env_steps_per_s": self.steps / r,
            "rollout_share": min(r / c, 1.0), "gae_share": min(max(g - r, 0.0) / c, 1.0),
            "update_share": max(1.0 - g / c, 0.0),
            "xla_flops_per_chunk": self.flops,
            "xla_flops_per_env_step": (self.flops / self.steps if self.flops else None),
            "analytic_flops_per_env_step": self.analytic_flops_per_env_step(),
        }


def run(variant="", num_envs=None, num_seeds=1, repeats=5, decision_only=None) -> dict:
    """Times one config (``decision_only`` None = the config's default)."""
    b = _Bench(variant, num_envs, num_seeds, decision_only)
    for _ in range(repeats):
        b.time_once()
    return b.result(variant)


def compare(variant="", num_envs=None, num_seeds=1, repeats=5) -> dict:
    """Full-batch vs decision-only update of the same config, alternating calls in one process
    (machine load hits both alike). ``speedup`` = ratio of the median chunk times."""
    full = _Bench(variant, num_envs, num_seeds, decision_only=False)
    dec = _Bench(variant, num_envs, num_seeds, decision_only=True)
    for _ in range(repeats):
        full.time_once()
        dec.time_once()
    a, b = full.result(variant), dec.result(variant)
    pairs = [x / y for x, y in zip(full.chunk_s, dec.chunk_s)]
    return {"before_full_batch": a, "after_decision_only": b,
            "speedup": a["chunk_s_median"] / b["chunk_s_median"],
            "speedup_paired_median": statistics.median(pairs),
            "speedup_paired_min": min(pairs), "speedup_paired_max": max(pairs),
            # the top-level fields of the default (decision-only) path, for the suite table
            **{k: v for k, v in b.items()}}


def _line(res: dict) -> str:
    fl = res.get("xla_flops_per_env_step")
    return (f"{res['env_steps_per_s']:.0f} env steps/s while training ({res['backend']}, "
            f"{res['num_seeds']} seed(s) x {res['num_envs']} envs x {res['num_users']} users, "
            f"decision_only={res['decision_only']}); rollout {100 * res['rollout_share']:.0f}% "
            f"/ GAE {100 * res['gae_share']:.0f}% / update {100 * res['update_share']:.0f}% "
            f"of a chunk; FLOP per env step: analytic {res['analytic_flops_per_env_step']:.3g}, "
            f"XLA (loop bodies once) " + (f"{fl:.3g}" if fl else "n/a"))


def main(argv):
    config_utils.reject_extra_argv(argv)
    if _COMPARE.value:
        res = compare(_VARIANT.value, _NUM_ENVS.value, _NUM_SEEDS.value, _REPEATS.value)
        print(json.dumps(res, indent=2))
        print(_line(res["before_full_batch"]))
        print(_line(res["after_decision_only"]))
        print(f"decision-only / full-batch speed: {res['speedup']:.2f}x (paired median "
              f"{res['speedup_paired_median']:.2f}x, range {res['speedup_paired_min']:.2f}-"
              f"{res['speedup_paired_max']:.2f})")
    else:
        res = run(_VARIANT.value, _NUM_ENVS.value, _NUM_SEEDS.value, _REPEATS.value)
        print(json.dumps(res, indent=2))
        print(_line(res))
    save_json(_JSON.value, res)


if __name__ == "__main__":
    cli.run(main)
