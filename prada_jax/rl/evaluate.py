"""Fixed-policy rollouts and reference screening rules for judging a trained policy.

* ``make_rollout_eval``: one jitted function that runs any policy of a common parametric form
  (a network's greedy action, or Bernoulli(p) nominations — p = 0 is all-keep, p = 1
  all-nominate) for a fixed number of slots in vmapped envs and returns sums: finished user
  episodes, their returns, decisions, nominations and the env's ``user_*`` metrics. One compile
  serves every policy compared, and all policies see the same random numbers for the same key.
* ``oracle_labels`` / ``fit_label_classifier``: the oracle-label baseline of issue 4 — per trace
  node, offload iff the LLM step's PRM gain minus its compute cost beats the draft's
  (``cand_prm[n,1] − β·server_s > cand_prm[n,0]``; the draft's own delay is paid either way),
  and a classifier of the same architecture fitted to those labels on the observation
  features the policy sees.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from prada_jax import latency as lat
from prada_jax.rl import learner, networks
from prada_jax.rl.screen import screen_and_gain

__all__ = ["make_rollout_eval", "summarize", "node_observations", "oracle_labels",
           "fit_label_classifier"]


def make_rollout_eval(env: Any, apply_fn: Callable, num_envs: int, num_slots: int,
                      action_fn: Callable | None = None) -> Callable:
    """``eval_fn(key, env_params, params, use_net, p_nominate) -> dict of sums``.

    The action of a user slot is ``argmax logits`` of ``apply_fn(params, obs)`` when
    ``use_net`` else ``uniform < p_nominate``; with ``action_fn`` (e.g. ``EdgeAction``) the
    gain attached is the network's ΔQ. Returned sums (float32 scalars): ``episodes``,
    ``return_sum``, ``decisions``, ``nominations`` and ``env/<name>`` ``(sum, count)`` pairs as
    in ``prada_jax.rl.learner`` (``user_*`` per finished user).
    """
    def eval_fn(key, env_params, params, use_net, p_nominate):
        reset_key, run_key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), env_params)

        def _slot(carry, k):
            state, obs, ep_ret, sums = carry
            act_key, env_key = jax.random.split(k)
            greedy, gain = screen_and_gain(apply_fn, params, obs)
            rand = (jax.random.uniform(act_key, greedy.shape) < p_nominate).astype(jnp.int32)
            screen = jnp.where(use_net, greedy, rand)
            action = screen if action_fn is None else jax.vmap(action_fn)(screen, gain)
            obs, state, reward, done, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(env_key, num_envs), state, action, env_params)
            term = info.get("terminated", done).astype(bool)
            fin = term | info.get("truncated", jnp.zeros_like(term)).astype(bool)
            ep_ret = ep_ret + reward
            dec = info["decision_mask"].astype(jnp.float32)
            env_m = jax.vmap(learner._info_metrics)(info, fin)  # noqa: SLF001
            new = {"episodes": jnp.sum(fin), "return_sum": jnp.sum(jnp.where(fin, ep_ret, 0.0)),
                   "decisions": jnp.sum(dec), "nominations": jnp.sum(dec * screen)}
            new.update({f"env/{k}": (jnp.sum(v[0]), jnp.sum(v[1])) for k, v in env_m.items()
                        if k.startswith("user_") or k == "offload_rate"})
            sums = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), sums, new)
            return (state, obs, jnp.where(fin, 0.0, ep_ret), sums), None

        init_sums = _zero_sums(env, env_params, apply_fn, params, action_fn, obs, state)
        carry = (state, obs, jnp.zeros(obs.shape[:2], jnp.float32), init_sums)
        (_, _, _, sums), _ = jax.lax.scan(_slot, carry, jax.random.split(run_key, num_slots))
        return sums

    return eval_fn


def _zero_sums(env, env_params, apply_fn, params, action_fn, obs, state):
    info = jax.eval_shape(
        lambda: jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(jax.random.key(0), obs.shape[0]), state,
            (jnp.zeros(obs.shape[:2], jnp.int32) if action_fn is None else jax.vmap(action_fn)(
                jnp.zeros(obs.shape[:2], jnp.int32), jnp.zeros(obs.shape[:2]))),
            env_params)[4])
    names = jax.eval_shape(lambda: jax.vmap(learner._info_metrics)(  # noqa: SLF001
        info, jnp.zeros(obs.shape[:2], bool)))
    z = jnp.float32(0.0)
    sums = {"episodes": z, "return_sum": z, "decisions": z, "nominations": z}
    sums.update({f"env/{k}": (z, z) for k in names
                 if k.startswith("user_") or k == "offload_rate"})
    return sums


def summarize(sums: dict) -> dict:
    """Means from ``eval_fn`` sums: ``episode_return`` (mean over finished user episodes),
    ``nominate_rate`` (per decision), ``episodes``, and ``env/<name>`` means."""
    s = jax.device_get(sums)
    out = {"episodes": float(s["episodes"]),
           "episode_return": float(s["return_sum"]) / max(float(s["episodes"]), 1.0),
           "nominate_rate": float(s["nominations"]) / max(float(s["decisions"]), 1.0)}
    for k, v in s.items():
        if k.startswith("env/"):
            out[k] = float(v[0]) / float(v[1]) if float(v[1]) > 0 else float("nan")
    return out


def node_observations(env_params) -> np.ndarray:
    """[N, F + 2] the edge env's observation of every trace node (features, depth,
    context tokens · ctx_scale), as ``envs.edge`` builds it for a user at that node."""
    tr = env_params.traces
    return np.concatenate([np.asarray(tr.feat, np.float32),
                           np.asarray(tr.depth, np.float32)[:, None],
                           (np.asarray(tr.ctx_tokens, np.float32)
                            * float(env_params.ctx_scale))[:, None]], axis=1)


def oracle_labels(env_params) -> np.ndarray:
    """[N] bool: offloading node n's step beats keeping the draft under the coarse reward,
    i.e. ``cand_prm[n,1] − β·server_s(n) > cand_prm[n,0]`` (server compute of the uploaded
    context and the LLM step; no server cache)."""
    tr = env_params.traces
    server_s = lat.server_delay_s(env_params.latency, jnp.asarray(tr.ctx_tokens),
                                  jnp.zeros_like(jnp.asarray(tr.ctx_tokens)),
                                  jnp.asarray(tr.cand_tokens)[:, 1])
    cand = np.asarray(tr.cand_prm, np.float64)
    return cand[:, 1] - float(env_params.beta) * np.asarray(server_s, np.float64) > cand[:, 0]


def fit_label_classifier(key, obs: np.ndarray, labels: np.ndarray, hidden, *,
                         steps: int = 3000, lr: float = 3e-3, batch: int = 4096,
                         separate_critic: bool = True):
    """Fits the policy head of an ``ActorCritic`` (same architecture as the policy) to
    ``labels`` by cross-entropy (Adam, minibatches drawn uniformly over nodes).

    Returns ``(params, train_accuracy)``; use with the policy's ``apply_fn`` (greedy argmax).
    """
    init_key, data_key = jax.random.split(key)
    graphdef, params = networks.init_network(init_key, obs.shape[1], tuple(hidden),
                                             separate_critic)
    apply_fn = networks.make_apply_fn(graphdef)
    x = jnp.asarray(obs, jnp.float32)
    y = jnp.asarray(labels, jnp.int32)
    tx = optax.adam(lr)
    opt_state = tx.init(params)

    def _loss(p, xb, yb):
        logits, _ = apply_fn(p, xb)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, yb))

    @jax.jit
    def _train(params, opt_state, key):
        def _step(carry, k):
            params, opt_state = carry
            idx = jax.random.randint(k, (min(batch, x.shape[0]),), 0, x.shape[0])
            g = jax.grad(_loss)(params, x[idx], y[idx])
            upd, opt_state = tx.update(g, opt_state, params)
            return (optax.apply_updates(params, upd), opt_state), None
        (params, opt_state), _ = jax.lax.scan(_step, (params, opt_state),
                                              jax.random.split(key, steps))
        return params

    params = _train(params, opt_state, data_key)
    logits, _ = apply_fn(params, x)
    acc = float(jnp.mean((jnp.argmax(logits, -1) == y).astype(jnp.float32)))
    return params, acc
