"""The PPO learner: one jitted chunk = several (rollout → masked GAE → minibatch epochs) updates.

Works with any environment of the pure multi-user shape (docs/design.md §4 and §9 "Environments"):

* ``env.reset(key, params) -> (obs [U, D], state)``
* ``env.step(key, state, action, params) -> (obs [U, D], state, reward [U], done [U], info)``
  with ``info["decision_mask"] [U]`` (the user's action was consumed this slot), optionally
  ``info["terminated"]`` / ``info["truncated"]`` [U] (default: ``done`` / all False),
  optionally ``info["final_observation"]`` [U, D] (for an auto-resetting env: the observation
  the cut episode would have continued from; a truncated user is bootstrapped with its value,
  not with the value of the next episode's first observation), and any other numeric per-slot
  metrics (logged as ``env/<name>``, averaged over slots and envs).

The env handles user turnover itself (new users arrive in freed slots); the learner never
resets an env after initialisation. Per-user GAE follows ``prada_jax.rl.gae``.

Structure (``make_train_chunk``)::

    train_chunk(state, env_params) =
      scan over updates_per_chunk:
        rollout: noise and env keys of all slots drawn at once, then
                 scan over rollout_len of (policy on [E, U, D] → vmap(env.step) over E)
        masked GAE (reverse scan over slots, vectorised over [E, U])
        (decision_only) compact the decision samples into a fixed buffer of K with a mask
        scan over num_epochs: shuffle the samples, scan over minibatches: optax step

The env batch axis E is leading in every array of the state, so it can be sharded later.
Several seeds: ``jax.vmap(train_chunk, in_axes=(0, None))`` over a stacked ``LearnerState``.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from prada_jax.rl import compaction
from prada_jax.rl import gae as gae_lib
from prada_jax.rl import losses
from prada_jax.rl import networks

__all__ = ["PPOSettings", "LearnerState", "make_optimizer", "init_learner_state",
           "make_train_chunk", "make_rollout", "RESERVED_INFO",
           "rollout_gae", "sample_action", "sample_action_gumbel"]

RESERVED_INFO = ("decision_mask", "terminated", "truncated", "final_observation")


class PPOSettings(NamedTuple):
    """Static sizes and coefficients of the learner (hashable; closed over by the chunk).

    num_envs: E, environments run in parallel per seed.
    rollout_len: T, env slots per update.
    num_epochs: passes over each rollout.
    num_minibatches: minibatches per epoch; the E·T·U samples (or, with ``decision_only``,
      the ``decision_capacity`` compacted samples) are split evenly.
    updates_per_chunk: updates per jitted call.
    gamma: discount per decision.
    gae_lambda: GAE λ.
    loss: PPO loss coefficients.
    decision_only: run the epochs over the decision samples only, compacted into a buffer of
      ``decision_capacity`` (non-decision samples carry no loss; only the shuffle and the
      minibatch composition differ from the full update). A rollout with more decisions than
      the capacity keeps ``decision_capacity`` of them (a run from a random start, see
      ``compaction.compact_decisions``) and reports the number dropped as the
      ``decision_overflow`` metric.
    decision_capacity: K, samples in the compacted buffer (a multiple of num_minibatches;
      ``compaction.decision_capacity``).
    max_grad_norm: clip gradients to this global L2 norm inside the learner, reusing the norm
      it reports as ``grad_norm`` (one norm pass); None = ``tx`` clips (if at all).
    gae_unroll: unroll factor of the reverse GAE scan.
    diagnostics: compute the metrics that only observe the update (``approx_kl``,
      ``clip_frac``, ``explained_variance``, ``nominate_rate``, ``mean_gain``); False leaves
      them out of the metrics and trains bit-identically.
    """

    num_envs: int
    rollout_len: int
    num_epochs: int
    num_minibatches: int
    updates_per_chunk: int
    gamma: float
    gae_lambda: float
    loss: losses.PPOLossConfig
    decision_only: bool = False
    decision_capacity: int = 0
    max_grad_norm: float | None = None
    gae_unroll: int = 1
    diagnostics: bool = True


@struct.dataclass
class LearnerState:
    """Everything a run needs to continue exactly (checkpointed whole).

    params: network parameters (``nnx.State``).
    opt_state: optax state.
    env_state: env state, leading axis E.
    obs: [E, U, D] current observations.
    key: typed PRNG key for the next update.
    ep_return: [E, U] reward accumulated by each user's current episode.
    env_steps: int32 env slots simulated so far (summed over envs).
    update_step: int32 updates done.
    """

    params: Any
    opt_state: Any
    env_state: Any
    obs: jax.Array
    key: jax.Array
    ep_return: jax.Array
    env_steps: jax.Array
    update_step: jax.Array


def make_optimizer(lr: float, max_grad_norm: float, schedule: str = "constant",
                   total_steps: int | None = None, final_lr_frac: float = 0.0,
                   adam_eps: float = 1e-5, clip: bool = True) -> optax.GradientTransformation:
    """Adam with global-norm gradient clipping and an optional learning-rate schedule.

    Args:
      lr: peak learning rate.
      max_grad_norm: clip gradients to this global L2 norm.
      clip: include the clipping in the transformation; False when the learner clips itself
        (``PPOSettings.max_grad_norm``, one norm pass instead of two).
      schedule: "constant", "linear" (to ``final_lr_frac·lr``) or "cosine" (to the same).
      total_steps: optimiser steps over the run (needed by "linear"/"cosine").
    """
    if schedule == "constant":
        lr_fn: Any = lr
    elif schedule in ("linear", "cosine"):
        if not total_steps or total_steps < 1:
            raise ValueError(f"make_optimizer: schedule '{schedule}' needs total_steps >= 1")
        if schedule == "linear":
            lr_fn = optax.linear_schedule(lr, lr * final_lr_frac, total_steps)
        else:
            lr_fn = optax.cosine_decay_schedule(lr, total_steps, alpha=final_lr_frac)
    else:
        raise ValueError(f"make_optimizer: unknown schedule '{schedule}' "
                         "(constant, linear, cosine)")
    adam = optax.adam(lr_fn, eps=adam_eps)
    if not clip:
        return adam
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), adam)


def init_learner_state(key: jax.Array, settings: PPOSettings, env: Any, env_params: Any,
                       init_params_fn: Callable[[jax.Array], Any],
                       tx: optax.GradientTransformation) -> LearnerState:
    """Fresh learner state for one seed (vmap over keys for several seeds).

    Args:
      key: typed PRNG key of this seed.
      init_params_fn: ``key -> params`` (e.g. ``lambda k: networks.init_network(k, ...)[1]``).
    """
    net_key, reset_key, run_key = jax.random.split(key, 3)
    params = init_params_fn(net_key)
    opt_state = tx.init(params)
    reset_keys = jax.random.split(reset_key, settings.num_envs)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, env_params)
    # An env may return the same array as observation and inside its state; copy it so the
    # state can be donated to the jitted chunk without aliasing one buffer twice.
    obs = jnp.copy(obs)
    return LearnerState(params=params, opt_state=opt_state, env_state=env_state, obs=obs,
                        key=run_key, ep_return=jnp.zeros(obs.shape[:2], jnp.float32),
                        env_steps=jnp.int32(0), update_step=jnp.int32(0))


def _info_metrics(info: dict, finished: jax.Array) -> dict:
    """Per-slot env metrics as ``name -> (sum, count)`` for one env and one slot.

    * scalar leaves (per-slot or cumulative counters): ``(value, 1)``;
    * [U] leaves named ``user_*`` (valid where a user finished, as in the edge env):
      summed over the users that finished this slot, counted per finished user;
    * ``offload_rate`` is derived as Σ user_offloads / Σ user_steps over finished users when
      the env reports both; other [U] leaves are skipped (not meaningful as means).
    Names are the dict paths joined by "/".
    """
    out = {}
    flat, _ = jax.tree_util.tree_flatten_with_path(
        {k: v for k, v in info.items() if k not in RESERVED_INFO})
    fin = finished.astype(jnp.float32)
    for path, leaf in flat:
        name = "/".join(str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p))))
                        for p in path)
        leaf = jnp.asarray(leaf)
        if not (jnp.issubdtype(leaf.dtype, jnp.number) or leaf.dtype == bool):
            continue
        leaf = leaf.astype(jnp.float32)
        if leaf.ndim == 0:
            out[name] = (leaf, jnp.float32(1.0))
        elif name.split("/")[-1].startswith("user_") and leaf.shape == fin.shape:
            out[name] = (jnp.sum(leaf * fin), jnp.sum(fin))
    if "user_offloads" in info and "user_steps" in info and "offload_rate" not in out:
        out["offload_rate"] = (jnp.sum(jnp.asarray(info["user_offloads"], jnp.float32) * fin),
                               jnp.sum(jnp.asarray(info["user_steps"], jnp.float32) * fin))
    return out


def sample_action(key: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A draw of the categorical policy and its log-probability: logits [..., A] ->
    (action [...] int32, log π(action) [...]).

    The same draw as ``distrax.Categorical(logits).sample(seed=key)`` (Gumbel-max on the same
    key) without its softmax and validity checks, which cost a fifth of a CartPole env step.
    """
    action = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), action[..., None],
                               axis=-1)[..., 0]
    return action, logp


def sample_action_gumbel(gumbel: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The categorical draw from pre-drawn noise: argmax(logits + gumbel) (the Gumbel-max
    trick, as ``jax.random.categorical`` does with its own noise) and its log-probability.

    Args:
      gumbel: [..., A] standard Gumbel noise (``jax.random.gumbel``), one row per draw.
      logits: [..., A] policy logits.

    Returns:
      (action [...] int32, log π(action) [...]).
    """
    action = jnp.argmax(logits + gumbel, axis=-1).astype(jnp.int32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), action[..., None],
                               axis=-1)[..., 0]
    return action, logp


def make_rollout(settings: PPOSettings, env: Any, apply_fn: Callable,
                 action_fn: Callable[[jax.Array, jax.Array], Any] | None = None) -> Callable:
    """``rollout(params, env_params, env_state, obs, ep_return, key) -> (env_state, obs,
    ep_return, traj, slot_metrics)``: ``rollout_len`` slots of the stochastic policy in
    ``num_envs`` envs. ``traj`` holds [T, E, U(, D)] arrays (obs, action, logp, value, q_taken,
    gain, reward, decision, terminated, truncated, and ``trunc_value`` = V(final observation)
    when the env reports ``info["final_observation"]``); ``slot_metrics`` [T] sums.

    Without ``action_fn`` the env never sees the critic, so the loop over slots runs the
    policy only and the critic (value, Q of the action taken, gain, and V of the final
    observations) is evaluated after it, batched over all T·E·U samples: the per-slot loop is
    sequential, and on a CPU each of its small matmuls costs about as much as a batched one.
    With ``action_fn`` (the edge env's ``EdgeAction`` carries the critic's ΔQ) the critic runs
    in the loop.

    The rollout's randomness is drawn before the loop from ``key``: Gumbel noise [T, E, U, A]
    for the actions (``sample_action_gumbel``) and the env keys [T, E]."""
    s = settings
    critic_in_loop = action_fn is not None
    if action_fn is None:
        action_fn = lambda screen, gain: screen  # noqa: E731

    def _policy(params, obs):
        return apply_fn(params, obs)

    def _critic_outputs(logits, q, action):
        return dict(value=networks.value_from_critic(logits, q),
                    q_taken=networks.taken_critic(q, action), gain=networks.gain_from_critic(q))

    def rollout(params, env_params, env_state, obs, ep_return, key):
        # All the randomness of the rollout is drawn before the slot loop, in two batched
        # calls: Gumbel noise for every action and a key for every (slot, env). Inside the
        # sequential loop each draw would be a separate threefry hash (on a CPU a rolled loop
        # of its own), which costs more than the policy's matmuls at small batches.
        act_key, env_key = jax.random.split(key)
        num_actions = jax.eval_shape(_policy, params, obs)[0].shape[-1]
        gumbel = jax.random.gumbel(act_key, (s.rollout_len,) + obs.shape[:-1] + (num_actions,))
        env_keys = jax.random.split(env_key, (s.rollout_len, s.num_envs))

        def _env_step(carry, xs):
            env_state, obs, ep_return = carry
            noise, env_keys = xs
            logits, q = _policy(params, obs)                       # [E, U, A]
            action, logp = sample_action_gumbel(noise, logits)     # [E, U]
            transition = dict(obs=obs, action=action, logp=logp)
            if critic_in_loop:
                transition.update(_critic_outputs(logits, q, action))
                gain = transition["gain"]
            else:
                gain = jnp.zeros(action.shape, jnp.float32)        # unused by the default
            env_action = jax.vmap(action_fn)(action, gain)
            next_obs, env_state, reward, done, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None))(env_keys, env_state, env_action, env_params)
            decision = info["decision_mask"].astype(bool)
            terminated = info.get("terminated", done).astype(bool)
            truncated = info.get("truncated", jnp.zeros_like(terminated)).astype(bool)
            ep_return = ep_return + reward
            finished = terminated | truncated
            ep_sum = jnp.sum(jnp.where(finished, ep_return, 0.0))
            ep_count = jnp.sum(finished)
            ep_return = jnp.where(finished, 0.0, ep_return)
            transition.update(reward=reward.astype(jnp.float32), decision=decision,
                              terminated=terminated, truncated=truncated)
            if "final_observation" in info:
                # The observation the cut episode would have continued from (its V is read
                # by GAE only where truncated; the env has already reset that user slot).
                final_obs = jnp.asarray(info["final_observation"])
                if critic_in_loop:
                    f_logits, f_q = _policy(params, final_obs)
                    transition["trunc_value"] = networks.value_from_critic(f_logits, f_q)
                else:
                    transition["final_obs"] = final_obs
            env_m = jax.vmap(_info_metrics)(info, finished)   # name -> ([E], [E])
            slot_metrics = dict(ep_sum=ep_sum, ep_count=ep_count, **{
                "env/" + k: (jnp.sum(v[0]), jnp.sum(v[1])) for k, v in env_m.items()})
            return (env_state, next_obs, ep_return), (transition, slot_metrics)

        (env_state, obs, ep_return), (traj, slot_metrics) = jax.lax.scan(
            _env_step, (env_state, obs, ep_return), (gumbel, env_keys))
        if not critic_in_loop:
            # The critic of every sample in one batched pass (same parameters as the loop).
            traj.update(_critic_outputs(*_policy(params, traj["obs"]), traj["action"]))
            if "final_obs" in traj:
                f_logits, f_q = _policy(params, traj.pop("final_obs"))
                traj["trunc_value"] = networks.value_from_critic(f_logits, f_q)
        return env_state, obs, ep_return, traj, slot_metrics

    return rollout


def rollout_gae(traj: dict, last_value: jax.Array, gamma: float, lam: float,
                unroll: int = 1) -> tuple[jax.Array, jax.Array]:
    """Per-user GAE of a rollout (``make_rollout``'s ``traj``): advantages and λ-returns [T, E, U].

    The bootstrap of a truncated user is ``traj["trunc_value"]`` (V of the env's final
    observation of the cut episode) where the env reports one, else the value of the next
    slot's observation of that user slot; the end of the rollout bootstraps with
    ``last_value`` [E, U].
    """
    next_values = jnp.concatenate([traj["value"][1:], last_value[None]], axis=0)
    if "trunc_value" in traj:
        next_values = jnp.where(traj["truncated"], traj["trunc_value"], next_values)
    return gae_lib.masked_gae(traj["reward"], traj["value"], traj["decision"],
                              traj["terminated"], traj["truncated"], next_values, last_value,
                              gamma, lam, unroll=unroll)


def _clip_by_norm(grads, g_norm, max_norm: float):
    """``optax.clip_by_global_norm`` with the norm given (same arithmetic, no second pass)."""
    trigger = jnp.squeeze(g_norm < max_norm)
    return jax.tree.map(
        lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm), grads)


def make_train_chunk(settings: PPOSettings, env: Any, apply_fn: Callable,
                     tx: optax.GradientTransformation,
                     action_fn: Callable[[jax.Array, jax.Array], Any] | None = None
                     ) -> Callable[[LearnerState, Any], tuple[LearnerState, dict]]:
    """Builds the pure ``train_chunk(state, env_params) -> (state, metrics)`` for one seed.

    Args:
      settings: static learner settings.
      env: object with pure ``reset`` / ``step`` (see module docstring).
      apply_fn: ``(params, obs [..., D]) -> (logits [..., A], critic [..., A] or [..., 1])``.
      tx: optax optimiser.
      action_fn: ``(screen [U] int32, gain [U] float32) -> env action``; default passes the
        screening decision only. The edge env's ``EdgeAction(screen, gain)`` carries the
        critic's ΔQ to the stage-2 scheduler.

    Returns:
      ``train_chunk``; metrics are a dict of [updates_per_chunk] arrays: ``policy_loss``,
      ``value_loss``, ``entropy``, ``approx_kl``, ``clip_frac``, ``total_loss``,
      ``grad_norm`` (means over epochs × minibatches), ``explained_variance``,
      ``episode_return_sum`` / ``episodes`` (finished user episodes in the rollout),
      ``decisions``, ``decision_overflow`` (decisions left out of the compacted update; 0
      without ``decision_only``), ``nominate_rate`` (fraction of decisions with action ≠ 0),
      ``mean_gain`` (mean ΔQ at decisions), ``env_steps``, and ``env/<name>`` env metrics
      (see ``_info_metrics``; NaN when the rollout had nothing to average).
      ``approx_kl``, ``clip_frac``, ``explained_variance``, ``nominate_rate`` and
      ``mean_gain`` only with ``settings.diagnostics``.
    """
    s = settings
    _rollout = make_rollout(settings, env, apply_fn, action_fn)

    def _policy(params, obs):
        return apply_fn(params, obs)

    def _loss_fn(params, batch):
        logits, q = _policy(params, batch["obs"])
        return losses.ppo_loss(logits, q, batch["action"], batch["logp"], batch["q_taken"],
                               batch["adv"], batch["ret"], batch["decision"], s.loss,
                               diagnostics=s.diagnostics)

    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)

    def _update_minibatch(carry, batch):
        params, opt_state = carry
        (_, metrics), grads = grad_fn(params, batch)
        g_norm = optax.global_norm(grads)
        if s.max_grad_norm is not None:
            grads = _clip_by_norm(grads, g_norm, s.max_grad_norm)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = dict(metrics, grad_norm=g_norm)
        return (params, opt_state), metrics

    def _update_epoch(carry, epoch_key, flat):
        n = flat["action"].shape[0]
        if s.decision_only:
            # argsort of uniform keys: a uniformly random order, about half the CPU time of
            # jax.random.permutation's rounds of sorting.
            perm = jnp.argsort(jax.random.uniform(epoch_key, (n,)))
        else:
            perm = jax.random.permutation(epoch_key, n)
        shuffled = jax.tree.map(
            lambda x: jnp.take(x, perm, axis=0).reshape((s.num_minibatches, -1) + x.shape[1:]),
            flat)
        return jax.lax.scan(_update_minibatch, carry, shuffled)

    def _update_step(state: LearnerState, env_params):
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        env_state, obs, ep_return, traj, slot_metrics = _rollout(
            state.params, env_params, state.env_state, state.obs, state.ep_return, rollout_key)
        logits_last, q_last = _policy(state.params, obs)
        last_value = networks.value_from_critic(logits_last, q_last)   # [E, U]
        adv, ret = rollout_gae(traj, last_value, s.gamma, s.gae_lambda, s.gae_unroll)
        dec = traj["decision"].astype(jnp.float32)
        n_dec = jnp.maximum(jnp.sum(dec), 1.0)
        diag = {}
        if s.diagnostics:
            # Explained variance of the trained prediction Q(s, a) against its λ-return.
            ret_mean = jnp.sum(ret * dec) / n_dec
            var_ret = jnp.sum(jnp.square(ret - ret_mean) * dec) / n_dec
            resid = (ret - traj["q_taken"]) * dec
            var_res = jnp.sum(jnp.square(resid - jnp.sum(resid) / n_dec) * dec) / n_dec
            diag = dict(
                explained_variance=jnp.where(
                    var_ret > 0, 1.0 - var_res / jnp.maximum(var_ret, 1e-12), 0.0),
                nominate_rate=jnp.sum((traj["action"] != 0) * dec) / n_dec,
                mean_gain=jnp.sum(traj["gain"] * dec) / n_dec)

        flat = {k: traj[k].reshape((-1,) + traj[k].shape[3:])
                for k in ("obs", "action", "logp", "q_taken", "decision")}
        flat["adv"] = adv.reshape(-1)
        flat["ret"] = ret.reshape(-1)
        overflow = jnp.int32(0)
        if s.decision_only:
            # The compaction key is derived from the epoch key, so the rollout (and the run
            # without decision_only) draws the same random numbers.
            compact_key = jax.random.fold_in(epoch_key, 1)
            flat, overflow = compaction.compact_decisions(flat, s.decision_capacity, compact_key)
        epoch_keys = jax.random.split(epoch_key, s.num_epochs)
        (params, opt_state), mb_metrics = jax.lax.scan(
            lambda c, k: _update_epoch(c, k, flat), (state.params, state.opt_state), epoch_keys)
        metrics = {k: jnp.mean(v) for k, v in mb_metrics.items()}
        env_steps = state.env_steps + s.rollout_len * s.num_envs
        metrics.update(
            **diag,
            episode_return_sum=jnp.sum(slot_metrics["ep_sum"]),
            episodes=jnp.sum(slot_metrics["ep_count"]).astype(jnp.float32),
            decisions=jnp.sum(dec),
            decision_overflow=overflow.astype(jnp.float32),
            env_steps=env_steps,
            # NaN where the rollout held nothing to average (e.g. no user finished).
            **{k: jnp.where(jnp.sum(v[1]) > 0, jnp.sum(v[0]) / jnp.maximum(jnp.sum(v[1]), 1.0),
                            jnp.nan)
               for k, v in slot_metrics.items() if k.startswith("env/")},
        )
        new_state = state.replace(params=params, opt_state=opt_state, env_state=env_state,
                                  obs=obs, key=key, ep_return=ep_return, env_steps=env_steps,
                                  update_step=state.update_step + 1)
        return new_state, metrics

    def train_chunk(state: LearnerState, env_params) -> tuple[LearnerState, dict]:
        return jax.lax.scan(lambda st, _: _update_step(st, env_params), state, None,
                            length=s.updates_per_chunk)

    return train_chunk
