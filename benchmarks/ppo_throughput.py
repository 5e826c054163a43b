"""PPO training throughput: env steps per second and the rollout / update split.

    python -m benchmarks.ppo_throughput [--variant=smoke] [--num_envs=16] [--repeats=5]

Builds the learner of ``train/configs/ppo.py[:variant]`` and times, after compilation, (a) one
jitted training chunk (``updates_per_chunk`` × (rollout + GAE + epochs)), and (b) the same
number of rollouts alone (same jitted rollout the chunk uses, vmapped over seeds). Prints
medians over ``--repeats`` calls: env steps/s (one step = one slot of one U-user env),
user decisions/s, and the share of the chunk spent in rollouts vs in GAE + updates.
Trace sets are synthetic.
"""
from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

_VARIANT = flags.DEFINE_string("variant", "", "config variant of train/configs/ppo.py")
_NUM_ENVS = flags.DEFINE_integer("num_envs", None, "override ppo.num_envs")
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 1, "learner states vmapped")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed calls (median reported)")
_JSON = flags.DEFINE_string("json", "", "also write the result to this JSON file")


def run(variant="", num_envs=None, num_seeds=1, repeats=5) -> dict:
    import jax
    import jax.numpy as jnp

    from prada_jax.rl import learner, trainer
    from train.configs import ppo as ppo_configs

    config = ppo_configs.get_config(variant)
    config.num_seeds = num_seeds
    if num_envs:
        config.ppo.num_envs = num_envs
        batch = num_envs * config.ppo.rollout_len * config.env.num_users
        while batch % config.ppo.minibatch_size:
            config.ppo.minibatch_size //= 2
    setup = trainer.build_setup(config)
    s = setup.settings
    chunk = trainer.make_jitted_chunk(setup)
    rollout = learner.make_rollout(s, setup.env, setup.apply_fn, setup.action_fn)

    def _rollouts(states, env_params):
        def one(st):
            def body(carry, key):
                env_state, obs, ep_ret = carry
                env_state, obs, ep_ret, traj, _ = rollout(st.params, env_params, env_state, obs,
                                                           ep_ret, key)
                return (env_state, obs, ep_ret), jnp.sum(traj["decision"])
            keys = jax.random.split(st.key, s.updates_per_chunk)
            _, dec = jax.lax.scan(body, (st.env_state, st.obs, st.ep_return), keys)
            return jnp.sum(dec)
        return jax.vmap(one)(states)

    rollouts = jax.jit(_rollouts)
    states = setup.init_states(config)
    t = time.perf_counter()
    states, m = chunk(states, setup.env_params)
    jax.block_until_ready(m)
    compile_chunk_s = time.perf_counter() - t
    t = time.perf_counter()
    jax.block_until_ready(rollouts(states, setup.env_params))
    compile_rollout_s = time.perf_counter() - t
    chunk_s, roll_s, decisions = [], [], []
    for _ in range(repeats):
        t = time.perf_counter()
        dec = rollouts(states, setup.env_params)
        jax.block_until_ready(dec)
        roll_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        states, m = chunk(states, setup.env_params)
        jax.block_until_ready(m)
        chunk_s.append(time.perf_counter() - t)
        decisions.append(float(jnp.sum(m["decisions"])))
    steps = num_seeds * s.num_envs * s.rollout_len * s.updates_per_chunk
    c, r = statistics.median(chunk_s), statistics.median(roll_s)
    return {
        "variant": variant or "default", "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind, "num_seeds": num_seeds,
        "num_envs": s.num_envs, "num_users": setup.num_users, "rollout_len": s.rollout_len,
        "updates_per_chunk": s.updates_per_chunk, "num_epochs": s.num_epochs,
        "num_minibatches": s.num_minibatches, "repeats": repeats,
        "compile_chunk_s": compile_chunk_s, "compile_rollout_s": compile_rollout_s,
        "chunk_s_median": c, "rollout_s_median": r,
        "env_steps_per_s": steps / c, "user_decisions_per_s": statistics.median(decisions) / c,
        "rollout_only_env_steps_per_s": steps / r,
        "rollout_share": min(r / c, 1.0), "update_share": max(1.0 - r / c, 0.0),
    }


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    res = run(_VARIANT.value, _NUM_ENVS.value, _NUM_SEEDS.value, _REPEATS.value)
    print(json.dumps(res, indent=2))
    print(f"{res['env_steps_per_s']:.0f} env steps/s while training ({res['backend']}, "
          f"{res['num_seeds']} seed(s) x {res['num_envs']} envs x {res['num_users']} users); "
          f"rollout {100 * res['rollout_share']:.0f}% / GAE+update "
          f"{100 * res['update_share']:.0f}% of a chunk")
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    from prada_jax import cli

    cli.run(main)
