"""The PPO learner on gymnax CartPole-v1 against a minimal one-file reference PPO, same process.

    python -m benchmarks --only ppo_gymnax [--repeats N] [--quick]

(``--repeats`` = alternated pairs, at least 5; ``--quick``: 2 pairs of 122 updates.)

The reference (``reference_train``) follows PureJaxRL's PPO structure (Lu et al., "Discovered
Policy Optimisation", 2022; github.com/luchris429/purejaxrl): one jitted ``train(key)`` made of
nested ``lax.scan``s (updates → env steps / reverse GAE / epochs → minibatches), separate
64-64 tanh actor and critic MLPs (orthogonal init √2, heads 0.01 and 1.0), clipped surrogate,
clipped value loss, entropy bonus, per-minibatch advantage normalisation, Adam (ε 1e-5) with
the learning rate annealed linearly to 0 and global-norm clipping 0.5, and no metrics beyond
the episode return. It is written here from the papers' description, not copied. One
deliberate difference from PureJaxRL: a truncated episode (CartPole's 500-step limit) is
bootstrapped with V(final observation), as the learner does (gymnax 1.x reports both), so
both arms run the same algorithm.

The learner arm is what a user runs: ``trainer.build_setup(config, (env, params))`` with the
``gymnax`` config variant (the same hyperparameters: 4 envs × 128 steps, 4 epochs × 4
minibatches) on ``prada_jax.rl.single_agent.make_gymnax("CartPole-v1")``, then the jitted chunks of
``trainer.make_jitted_chunk`` called in a loop, the metrics of every chunk fetched to the host
(as the host loop does; no checkpoints or TensorBoard files).

Both are compiled first (compile excluded); then each repeat runs one whole training of each
arm from a fresh state, alternating which arm goes first, and times it with the wall clock and
the process CPU clock (``time.process_time``, all threads of the process). Reported: env
steps/s of both (medians), the speed ratio learner / reference of every pair by wall time
and by CPU time with their medians and ranges, the ratio of each arm's least CPU time over
the pairs, each arm's final return (mean return of the episodes that finished in the
last 10 updates; of the last pair, and of every pair in the JSON), and the executed HLO ops
per update of both compiled programs (``executed_hlo_ops``). The machine may be
shared: pairs are alternated tightly so load changes hit both arms alike, and CPU time is
less disturbed by other processes than wall time; read the ratios, not the rates.
"""
from __future__ import annotations

import os
import re
import statistics
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from prada_jax.rl import single_agent
from prada_jax.configs import ppo as ppo_configs
from prada_jax.rl import trainer
from prada_jax.stats import mean_ci

__all__ = ["RefConfig", "reference_train", "learner_setup", "run", "executed_hlo_ops", "ratio_ci"]


class RefConfig(NamedTuple):
    """Hyperparameters of the reference (PureJaxRL's CartPole-v1 values)."""

    num_envs: int = 4
    num_steps: int = 128
    num_updates: int = 976
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64


# ----------------------------------------------------------------------------- reference

def _dense_init(key, d_in, d_out, scale):
    return {"w": jax.nn.initializers.orthogonal(scale)(key, (d_in, d_out), jnp.float32),
            "b": jnp.zeros((d_out,), jnp.float32)}


def _init_net(key, obs_dim: int, num_actions: int, hidden: int):
    k = jax.random.split(key, 6)
    s2 = float(np.sqrt(2.0))
    return {"a1": _dense_init(k[0], obs_dim, hidden, s2), "a2": _dense_init(k[1], hidden, hidden, s2),
            "a3": _dense_init(k[2], hidden, num_actions, 0.01),
            "c1": _dense_init(k[3], obs_dim, hidden, s2), "c2": _dense_init(k[4], hidden, hidden, s2),
            "c3": _dense_init(k[5], hidden, 1, 1.0)}


def _net(p, x):
    """x [..., D] -> (logits [..., A], value [...])."""
    def lin(q, h):
        return h @ q["w"] + q["b"]
    a = jnp.tanh(lin(p["a2"], jnp.tanh(lin(p["a1"], x))))
    c = jnp.tanh(lin(p["c2"], jnp.tanh(lin(p["c1"], x))))
    return lin(p["a3"], a), lin(p["c3"], c)[..., 0]


def _critic(p, x):
    def lin(q, h):
        return h @ q["w"] + q["b"]
    return lin(p["c3"], jnp.tanh(lin(p["c2"], jnp.tanh(lin(p["c1"], x)))))[..., 0]


def _ref_loss(cfg: RefConfig):
    """The reference's PPO loss on a minibatch ``b``: clipped surrogate, clipped value loss,
    entropy bonus, advantages normalised per minibatch."""
    def loss_fn(params, b):
        logits, value = _net(params, b["obs"])
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, b["action"][:, None], axis=-1)[:, 0]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1).mean()
        v_clip = b["value"] + jnp.clip(value - b["value"], -cfg.clip_eps, cfg.clip_eps)
        v_loss = 0.5 * jnp.maximum(jnp.square(value - b["ret"]),
                                   jnp.square(v_clip - b["ret"])).mean()
        ratio = jnp.exp(logp - b["logp"])
        adv = (b["adv"] - b["adv"].mean()) / (b["adv"].std() + 1e-8)
        pg = -jnp.minimum(ratio * adv,
                          jnp.clip(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * adv).mean()
        return pg + cfg.vf_coef * v_loss - cfg.ent_coef * entropy

    return loss_fn


def _ref_gae(cfg: RefConfig, traj: dict, last_v):
    """Advantages [T, E] by reverse GAE; a truncated step bootstraps with V(final obs)."""
    def gae_step(c, t):
        gae, next_v = c
        nv = jnp.where(t["term"], 0.0, jnp.where(t["trunc"], t["final_v"], next_v))
        delta = t["reward"] + cfg.gamma * nv - t["value"]
        gae = delta + cfg.gamma * cfg.gae_lambda * (1.0 - (t["term"] | t["trunc"])) * gae
        return (gae, t["value"]), gae

    _, adv = jax.lax.scan(gae_step, (jnp.zeros_like(last_v), last_v), traj,
                          reverse=True, unroll=16)
    return adv


def make_reference_train(cfg: RefConfig, env, env_params):
    """``train(key) -> (params, ep_return_sum [U], episodes [U])`` (U = num_updates): the whole
    training in one pure function (jit it)."""
    obs_dim = int(env.observation_space(env_params).shape[0])
    num_actions = int(env.action_space(env_params).n)
    batch = cfg.num_envs * cfg.num_steps
    mb = batch // cfg.num_minibatches
    sched = optax.linear_schedule(cfg.lr, 0.0, cfg.num_updates * cfg.update_epochs
                                  * cfg.num_minibatches)
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                     optax.adam(sched, eps=1e-5))
    grad_fn = jax.grad(_ref_loss(cfg))

    def train(key):
        key, k_net, k_reset = jax.random.split(key, 3)
        params = _init_net(k_net, obs_dim, num_actions, cfg.hidden)
        opt_state = tx.init(params)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(k_reset, cfg.num_envs), env_params)

        def update_step(carry, _):
            params, opt_state, env_state, obs, ep_ret, key = carry

            def env_step(c, _):
                env_state, obs, ep_ret, key = c
                key, k_act, k_env = jax.random.split(key, 3)
                logits, value = _net(params, obs)
                action = jax.random.categorical(k_act, logits)
                logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None],
                                           axis=-1)[:, 0]
                nobs, env_state, reward, term, trunc, info = jax.vmap(
                    env.step, in_axes=(0, 0, 0, None))(jax.random.split(k_env, cfg.num_envs),
                                                       env_state, action, env_params)
                final_v = _critic(params, info["final_observation"])
                ep_ret = ep_ret + reward
                done = term | trunc
                tr = dict(obs=obs, action=action, logp=logp, value=value, reward=reward,
                          term=term, trunc=trunc, final_v=final_v,
                          ep_sum=jnp.sum(jnp.where(done, ep_ret, 0.0)), ep_n=jnp.sum(done))
                return (env_state, nobs, jnp.where(done, 0.0, ep_ret), key), tr

            (env_state, obs, ep_ret, key), traj = jax.lax.scan(
                env_step, (env_state, obs, ep_ret, key), None, cfg.num_steps)
            last_v = _critic(params, obs)
            adv = _ref_gae(cfg, traj, last_v)
            data = dict(obs=traj["obs"], action=traj["action"], logp=traj["logp"],
                        value=traj["value"], adv=adv, ret=adv + traj["value"])
            data = jax.tree.map(lambda x: x.reshape((batch,) + x.shape[2:]), data)

            def epoch(c, k):
                perm = jax.random.permutation(k, batch)
                mbs = jax.tree.map(lambda x: jnp.take(x, perm, axis=0).reshape(
                    (cfg.num_minibatches, mb) + x.shape[1:]), data)

                def minibatch(c, b):
                    params, opt_state = c
                    updates, opt_state = tx.update(grad_fn(params, b), opt_state, params)
                    return (optax.apply_updates(params, updates), opt_state), None

                return jax.lax.scan(minibatch, c, mbs)[0], None

            key, k_ep = jax.random.split(key)
            (params, opt_state), _ = jax.lax.scan(
                epoch, (params, opt_state), jax.random.split(k_ep, cfg.update_epochs))
            out = (jnp.sum(traj["ep_sum"]), jnp.sum(traj["ep_n"]))
            return (params, opt_state, env_state, obs, ep_ret, key), out

        carry = (params, opt_state, env_state, obs, jnp.zeros(cfg.num_envs), key)
        carry, (ep_sum, ep_n) = jax.lax.scan(update_step, carry, None, cfg.num_updates)
        return carry[0], ep_sum, ep_n

    return train


def reference_train(key, cfg: RefConfig = RefConfig(), env_id: str = "CartPole-v1"):
    """Trains the reference once (compiles each call); returns ``(params, ep_sum, episodes)``."""
    import gymnax  # lazy: gymnax is an optional extra ([gymnax])

    env, params = gymnax.make(env_id)
    return jax.jit(make_reference_train(cfg, env, params))(key)


# ----------------------------------------------------------------------------- learner

def learner_setup(num_updates: int, updates_per_chunk: int = 61, seed: int = 0, **ppo):
    """``(config, setup)`` of the learner on CartPole-v1 (the ``gymnax`` config variant,
    ``num_updates`` rounded up to whole chunks; ``ppo`` overrides ``config.ppo`` fields)."""
    config = ppo_configs.get_config("gymnax")
    config.seed = seed
    config.ppo.updates_per_chunk = updates_per_chunk
    chunks = -(-num_updates // updates_per_chunk)
    config.ppo.total_env_steps = 512 * updates_per_chunk * chunks
    config.log.checkpoint_every = updates_per_chunk
    for k, v in ppo.items():
        config.ppo[k] = v
    env, params = single_agent.make_gymnax("CartPole-v1")
    return config, trainer.build_setup(config, (env, params))


def _final_return(ep_sum, ep_n, last: int = 10) -> float:
    s, n = np.asarray(ep_sum)[-last:].sum(), np.asarray(ep_n)[-last:].sum()
    return float(s / n) if n else float("nan")


_FREE_OPS = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}


def executed_hlo_ops(hlo_text: str) -> int:
    """Operations one call of a compiled program executes: the top-level instructions of the
    optimised HLO (``compiled.as_text()``; fusions count once, parameter / tuple / constant /
    bitcast not at all), each inside a ``while`` body multiplied by the loop's known trip
    count (nested loops multiply). A proxy for the per-call dispatch work of XLA's CPU
    runtime, which dominates at CartPole's tiny array sizes; not a FLOP count."""
    comps: dict[str, list[str]] = {}
    entry, cur = None, None
    for line in hlo_text.splitlines():
        m = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if m and not line.startswith(" "):
            cur = m.group(2)
            comps[cur] = []
            entry = cur if m.group(1) else entry
        elif line.startswith("}"):
            cur = None
        elif cur is not None:
            comps[cur].append(line)

    def count(name: str) -> int:
        total = 0
        for line in comps.get(name, ()):
            m = re.match(r"\s*(ROOT )?%?[\w.\-]+ = .*? ([a-z][\w\-]*)\(", line)
            if not m or m.group(2) in _FREE_OPS:
                continue
            total += 1
            if m.group(2) == "while":
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                total += (int(trips.group(1)) if trips else 1) * count(body)
            elif m.group(2) == "call":
                callee = re.search(r"to_apply=%?([\w.\-]+)", line)
                total += count(callee.group(1)) if callee else 0
        return total

    return count(entry) if entry else 0


def ratio_ci(ratios) -> list[float]:
    """``[geometric mean, low, high]`` of paired speed ratios: the 95% Student-t interval of
    the mean log ratio (``prada_jax.stats.mean_ci``), mapped back by exp (NaN bounds with
    fewer than two pairs). A ratio's interval that holds 1 is parity, not a difference."""
    ci = mean_ci(np.log(np.asarray(ratios, np.float64)))
    return [float(np.exp(ci.mean)), float(np.exp(ci.low)), float(np.exp(ci.high))]


def _pair_summary(rows: list[dict], steps: int) -> dict:
    """Rates, paired speed ratios (wall and CPU, median / range / geometric-mean CI) and
    final returns of ``run``'s alternated pairs; ``steps`` env steps per training."""
    arms = ("learner", "reference")
    ratios = [r["reference"]["wall_s"] / r["learner"]["wall_s"] for r in rows]
    ratios_cpu = [r["reference"]["cpu_s"] / r["learner"]["cpu_s"] for r in rows]
    geo = {"wall": ratio_ci(ratios), "cpu": ratio_ci(ratios_cpu)}
    med = {a: statistics.median(r[a]["wall_s"] for r in rows) for a in arms}
    cpu_min = {a: min(r[a]["cpu_s"] for r in rows) for a in arms}
    returns = {a: [r[a]["final_return"] for r in rows] for a in arms}
    return {
        "learner_env_steps_per_s": steps / med["learner"],
        "reference_env_steps_per_s": steps / med["reference"],
        # learner speed / reference speed (> 1: the learner is faster), per pair
        "ratio_paired_median": statistics.median(ratios),
        "ratio_paired_min": min(ratios), "ratio_paired_max": max(ratios),
        "ratio_cpu_paired_median": statistics.median(ratios_cpu),
        "ratio_cpu_paired_min": min(ratios_cpu), "ratio_cpu_paired_max": max(ratios_cpu),
        # geometric mean of the paired ratios with its 95% Student-t interval (on log ratios)
        "ratio_geomean_ci": geo["wall"], "ratio_cpu_geomean_ci": geo["cpu"],
        # the least CPU time of each arm over the pairs (the run least disturbed by load)
        "ratio_cpu_min_times": cpu_min["reference"] / cpu_min["learner"],
        "learner_cpu_s_min": cpu_min["learner"], "reference_cpu_s_min": cpu_min["reference"],
        "learner_final_return": rows[-1]["learner"]["final_return"],
        "reference_final_return": rows[-1]["reference"]["final_return"],
        "learner_final_returns": returns["learner"],
        "reference_final_returns": returns["reference"],
    }


def run(pairs: int = 5, num_updates: int = 976, updates_per_chunk: int = 61,
        seed: int = 0) -> dict:
    """Alternated pairs of whole trainings (learner vs reference), compile excluded."""
    import gymnax  # lazy: gymnax is an optional extra ([gymnax])

    config, setup = learner_setup(num_updates, updates_per_chunk, seed)
    n_chunks = setup.total_chunks
    updates = n_chunks * updates_per_chunk
    cfg = RefConfig(num_updates=updates)
    env, env_params = gymnax.make("CartPole-v1")
    ref = jax.jit(make_reference_train(cfg, env, env_params))
    chunk = trainer.make_jitted_chunk(setup)
    init = jax.jit(jax.vmap(setup._init_one(config)))
    keys = jnp.stack([jax.random.key(int(config.seed))])

    t = time.perf_counter()
    ref_c = ref.lower(jax.random.key(seed)).compile()
    ref_compile = time.perf_counter() - t
    t = time.perf_counter()
    states = init(keys)
    chunk_c = chunk.lower(states, setup.env_params).compile()
    learner_compile = time.perf_counter() - t
    ops_per_update = {"learner": executed_hlo_ops(chunk_c.as_text()) / updates_per_chunk,
                      "reference": executed_hlo_ops(ref_c.as_text()) / updates}

    def learner_once():
        st = init(keys)
        sums, ns = [], []
        for _ in range(n_chunks):
            st, m = chunk_c(st, setup.env_params)
            sums.append(np.asarray(m["episode_return_sum"])[0])   # host fetch per chunk
            ns.append(np.asarray(m["episodes"])[0])
        return np.concatenate(sums), np.concatenate(ns)

    def ref_once():
        _, s, n = ref_c(jax.random.key(seed))
        return np.asarray(s), np.asarray(n)

    def timed(fn):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        return time.perf_counter() - w, time.process_time() - c, out

    steps = updates * 512
    rows = []
    for i in range(pairs):
        order = (("learner", learner_once), ("reference", ref_once))
        if i % 2:
            order = order[::-1]
        row = {}
        for name, fn in order:
            w, c, out = timed(fn)
            row[name] = {"wall_s": w, "cpu_s": c, "final_return": _final_return(*out)}
        rows.append(row)
    return {
        "env": "CartPole-v1", "env_steps": steps, "updates": updates, "pairs": pairs,
        **_pair_summary(rows, steps),
        "learner_compile_s": learner_compile, "reference_compile_s": ref_compile,
        "learner_hlo_ops_per_update": ops_per_update["learner"],
        "reference_hlo_ops_per_update": ops_per_update["reference"],
        "load_avg_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "rows": rows,
    }


def _gci(g) -> str:
    return f"{g[0]:.3f}x [{g[1]:.3f}, {g[2]:.3f}]"


def format_result(r: dict) -> str:
    return (f"CartPole-v1, {r['updates']} updates = {r['env_steps']} env steps per training, "
            f"{r['pairs']} alternated pairs (compile excluded)\n"
            f"  learner   {r['learner_env_steps_per_s']:.4g} env steps/s, final return "
            f"{r['learner_final_return']:.1f}\n"
            f"  reference {r['reference_env_steps_per_s']:.4g} env steps/s, final return "
            f"{r['reference_final_return']:.1f}\n"
            f"  learner / reference speed, median of the {r['pairs']} per-pair ratios: wall "
            f"{r['ratio_paired_median']:.3f}x (range {r['ratio_paired_min']:.3f}-"
            f"{r['ratio_paired_max']:.3f}), CPU time {r['ratio_cpu_paired_median']:.3f}x "
            f"(range {r['ratio_cpu_paired_min']:.3f}-{r['ratio_cpu_paired_max']:.3f}); "
            f"least CPU times {r['ratio_cpu_min_times']:.3f}x\n"
            f"  geometric mean of the paired ratios [95% CI]: wall "
            f"{_gci(r['ratio_geomean_ci'])}, CPU time {_gci(r['ratio_cpu_geomean_ci'])}\n"
            f"  executed HLO ops per update (executed_hlo_ops): learner "
            f"{r['learner_hlo_ops_per_update']:.0f}, reference "
            f"{r['reference_hlo_ops_per_update']:.0f}")

