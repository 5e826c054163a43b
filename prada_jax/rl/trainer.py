"""Stage-1 PPO run: config + env → learner, and the host loop with curves/checkpoints/resume.

``train_and_evaluate(config, workdir, setup)`` is what ``python -m train.ppo`` calls. The
trainer builds no env: :func:`build_setup` receives ``(env, env_params)`` from its caller, as
PureJaxRL's ``make_train(config)`` receives ``env, env_params`` (the env a config names is
built by ``envs.stage1.build_setup``). A run directory holds::

    <workdir>/config.json        resolved config (the one in force)
    <workdir>/run.json           provenance: when the run started / resumed, what changed
    <workdir>/policy_meta.json   obs_dim, trace-set shape, preset, network sizes (for loaders)
    <workdir>/tb/ (or tb/seed<k>/ when num_seeds > 1)   TensorBoard curves, x = env steps
    <workdir>/checkpoints/<update>/   orbax checkpoints of the whole (seed-stacked) LearnerState

The host loop is ``prada_jax.runloop.run``. Rerunning on an existing workdir first checks the
new config against the stored one (``prada_jax.run_state``; only ``observational_fields`` may
change), then restores the newest intact checkpoint and continues; the result is
bit-identical to an uninterrupted run on CPU (same seed), because the checkpoint holds the
PRNG keys and the env state and the chunk is deterministic.

Reading a run folder back (``policy_meta.json``, ``load_policy``) is ``prada_jax.rl.policy``.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from prada_jax import checkpointing, config_utils, parallel, run_state, runloop
from prada_jax.metric_writer import MetricWriter
from prada_jax.rl import compaction, learner, losses, networks, policy, single_agent
from prada_jax.traces import splits

__all__ = ["validate_config", "build_setup", "train_and_evaluate", "Setup",
           "check_decision_overflow", "observational_fields"]
_TRAIN_TAGS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "total_loss",
               "grad_norm", "explained_variance")


# ----------------------------------------------------------------------------- config

def _batch_size(config) -> int:
    return int(config.ppo.num_envs) * int(config.ppo.rollout_len) * int(config.env.num_users)


def validate_config(config) -> None:
    """Checks every field the trainer uses; raises ``ConfigError`` naming the field.

    The fields that only choose and build an env (``env.name``, ``env.preset``,
    ``env.trace_dir``, ...) are the env builder's (``envs.stage1.validate_env_config``);
    ``env.num_users`` is checked here (it must match the env).
    """
    cu = config_utils
    cu.check_int(config, "seed", minimum=0)
    cu.check_int(config, "num_seeds", minimum=1)
    # Training seeds stay below the validation and test seeds (prada_jax.traces.splits).
    splits.check_training_seeds(int(config.seed), int(config.num_seeds))
    cu.check_int(config, "env.num_users", minimum=1)
    cu.check_choice(config, "net.critic", networks.CRITICS)
    hidden = config.net.hidden
    if not (isinstance(hidden, (tuple, list)) and len(hidden) >= 1
            and all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden)):
        raise cu.ConfigError(f"config.net.hidden must be a non-empty tuple of positive ints, "
                             f"got {hidden!r}")
    cu.check_int(config, "ppo.total_env_steps", "ppo.num_envs", "ppo.rollout_len",
                 "ppo.num_epochs", "ppo.minibatch_size", "ppo.updates_per_chunk", minimum=1)
    cu.check_positive(config, "ppo.lr", "ppo.max_grad_norm", "ppo.adam_eps", "ppo.clip_eps",
                      "ppo.value_clip_eps")
    cu.check_nonnegative(config, "ppo.vf_coef", "ppo.ent_coef")
    cu.check_range(config, "ppo.gamma", 0.0, 1.0)
    cu.check_range(config, "ppo.gae_lambda", 0.0, 1.0)
    cu.check_range(config, "ppo.final_lr_frac", 0.0, 1.0)
    cu.check_choice(config, "ppo.lr_schedule", ("constant", "linear", "cosine"))
    if "decision_capacity" in config.ppo:
        cu.check_range(config, "ppo.decision_capacity", 0.0, 1.0)
        cu.check(float(config.ppo.decision_capacity) > 0.0, "ppo.decision_capacity",
                 f"({config.ppo.decision_capacity}) must be > 0 (a fraction of the batch)")
    batch = _batch_size(config)
    cu.check_divides(config, "ppo.minibatch_size", batch,
                     total_name="the batch ppo.num_envs*ppo.rollout_len*env.num_users")
    per_update = int(config.ppo.num_envs) * int(config.ppo.rollout_len)
    per_chunk = per_update * int(config.ppo.updates_per_chunk)
    cu.check(int(config.ppo.total_env_steps) >= per_chunk, "ppo.total_env_steps",
             f"({config.ppo.total_env_steps}) must cover at least one chunk "
             f"(num_envs*rollout_len*updates_per_chunk = {per_chunk})")
    cu.check_int(config, "log.checkpoint_every", "log.keep_checkpoints", minimum=1)
    if "mesh" in config:
        try:
            parallel.validate_mesh_config(config.mesh)
        except ValueError as e:
            raise cu.ConfigError(str(e)) from e
    cu.check(int(config.log.checkpoint_every) % int(config.ppo.updates_per_chunk) == 0,
             "log.checkpoint_every", f"({config.log.checkpoint_every}) must be a multiple of "
             f"ppo.updates_per_chunk ({config.ppo.updates_per_chunk}): checkpoints are taken "
             "between chunks")


def num_chunks(config) -> int:
    """Chunks in the run: total_env_steps rounded up to whole chunks."""
    per_chunk = (int(config.ppo.num_envs) * int(config.ppo.rollout_len)
                 * int(config.ppo.updates_per_chunk))
    return max(1, math.ceil(int(config.ppo.total_env_steps) / per_chunk))


# ----------------------------------------------------------------------------- setup

def _obs_dim(env, env_params) -> int:
    obs, _ = jax.eval_shape(env.reset, jax.random.key(0), env_params)
    if len(obs.shape) != 2:
        raise ValueError(f"env.reset must return obs [U, D], got shape {obs.shape}")
    return int(obs.shape[1])


class Setup(NamedTuple):
    """Everything derived from a config (no state)."""

    env: Any
    env_params: Any
    trace_info: dict
    settings: learner.PPOSettings
    graphdef: Any
    apply_fn: Callable
    tx: Any
    action_fn: Callable | None
    obs_dim: int
    num_users: int
    total_chunks: int
    num_actions: int = networks.NUM_ACTIONS
    critic: str = "q"
    env_given: bool = True          # False: the env a config names (its trace_info given)

    def init_states(self, config):
        """Seed-stacked fresh ``LearnerState`` (leading axis num_seeds), built by one jitted
        call (an eager vmap dispatches every op of the env reset and network init one by one)."""
        keys = jnp.stack([jax.random.key(int(config.seed) + i)
                          for i in range(int(config.num_seeds))])
        return jax.jit(jax.vmap(self._init_one(config)))(keys)

    def _init_one(self, config):
        hidden = tuple(config.net.hidden)
        sep = bool(config.net.separate_critic)
        obs_dim = self.obs_dim
        num_actions, critic = self.num_actions, self.critic

        def init_params(k):
            return networks.init_network(k, obs_dim, hidden, sep, num_actions, critic)[1]
        return lambda k: learner.init_learner_state(k, self.settings, self.env, self.env_params,
                                                    init_params, self.tx)


def _ppo_settings(config, env, num_users: int) -> learner.PPOSettings:
    """The learner's settings from ``config.ppo``; decision-only and the GAE unroll are
    decided here from the env and the batch shape."""
    batch = _batch_size(config)
    num_minibatches = batch // int(config.ppo.minibatch_size)
    # None (the default): the env decides; only an env that declares sparse decisions (the
    # edge env) gets the compacted decision-only update, any other trains on every sample.
    decision_only = config.ppo.get("decision_only", None)
    if decision_only is None:
        decision_only = single_agent.sparse_decisions(env)
    decision_only = bool(decision_only)
    capacity = (compaction.decision_capacity(batch, float(config.ppo.decision_capacity),
                                             num_minibatches) if decision_only else 0)
    settings = learner.PPOSettings(
        num_envs=int(config.ppo.num_envs), rollout_len=int(config.ppo.rollout_len),
        num_epochs=int(config.ppo.num_epochs),
        num_minibatches=num_minibatches,
        updates_per_chunk=int(config.ppo.updates_per_chunk), gamma=float(config.ppo.gamma),
        gae_lambda=float(config.ppo.gae_lambda),
        loss=losses.PPOLossConfig(
            clip_eps=float(config.ppo.clip_eps), vf_coef=float(config.ppo.vf_coef),
            ent_coef=float(config.ppo.ent_coef), clip_value=bool(config.ppo.clip_value),
            value_clip_eps=float(config.ppo.value_clip_eps),
            normalize_adv=bool(config.ppo.normalize_adv)),
        decision_only=decision_only, decision_capacity=capacity,
        max_grad_norm=float(config.ppo.max_grad_norm),
        diagnostics=bool(config.ppo.diagnostics),
        # Unrolling the reverse GAE scan pays off for wide [E, U] slices (the edge env's
        # 16 × 8); for a handful of samples per slot (CartPole's 4 × 1) the rolled loop is
        # faster on a CPU.
        gae_unroll=(min(int(config.ppo.rollout_len), 8)
                    if int(config.ppo.num_envs) * num_users >= 64 else 1))
    return settings


def build_setup(config, env_and_params: tuple, *, action_fn: Callable | None = None,
                trace_info: dict | None = None) -> Setup:
    """Validates the config and builds network, optimiser and learner settings for the env.

    Args:
      env_and_params: the ``(env, env_params)`` to train on: any env of the pure multi-user
        shape with discrete actions (the action count comes from
        ``env.action_spec(params).num_values``, 2 if the env has none), or a single-agent
        gymnax-style env (obs [D]), adapted by ``prada_jax.rl.single_agent`` (one user slot:
        set ``env.num_users = 1``). Bad shapes raise ``single_agent.BadEnvShape`` (exit 2)
        naming the env function and the shape. The env a config names is built by
        ``envs.stage1.build_setup``.
      action_fn: ``(screen [U], gain [U]) -> env action`` of the rollout (None: the int
        screen is the action).
      trace_info: the env's data record for ``policy_meta.json``; given by the builder of
        the env a config names (a resume then checks the stored ``policy_meta.json``), None
        for a caller's own env (``{"source": "given"}``).

    ``ppo.decision_only`` None (the default) is taken from the env: True only when it
    declares ``sparse_decisions`` (the edge env does); a chunk whose decisions overflow the
    buffer stops the run (``check_decision_overflow``). The decision rate is not measured:
    an undeclared env trains on every sample (every decision counts at any rate) and a wrong
    declaration stops the run, so no decision is ever dropped silently (README "Your own
    env").
    """
    validate_config(config)
    if "mesh" in config:   # several processes: join them before the first JAX computation
        parallel.maybe_initialize_distributed(config.mesh)
    env_given = trace_info is None
    if env_given:
        # A single-agent env (obs [D]) gets the user axis; a bad shape is one line, exit 2.
        env, env_params = single_agent.as_multi_user(*env_and_params)
        trace_info = {"source": "given"}
    else:   # the env a config names (envs.stage1.build_env): multi-user by construction
        env, env_params = env_and_params
    obs_dim = _obs_dim(env, env_params)
    obs_shape = jax.eval_shape(env.reset, jax.random.key(0), env_params)[0].shape
    num_users = int(obs_shape[0])
    if num_users != int(config.env.num_users):
        raise config_utils.ConfigError(
            f"config.env.num_users ({config.env.num_users}) does not match the env's "
            f"{num_users} user slots")
    settings = _ppo_settings(config, env, num_users)
    chunks = num_chunks(config)
    opt_steps = chunks * settings.updates_per_chunk * settings.num_epochs \
        * settings.num_minibatches
    tx = learner.make_optimizer(float(config.ppo.lr), float(config.ppo.max_grad_norm),
                                config.ppo.lr_schedule, total_steps=opt_steps,
                                final_lr_frac=float(config.ppo.final_lr_frac),
                                adam_eps=float(config.ppo.adam_eps), clip=False)
    num_actions = networks.action_count(env, env_params)
    critic = str(config.net.critic)
    graphdef, _ = networks.init_network(jax.random.key(0), obs_dim, tuple(config.net.hidden),
                                        bool(config.net.separate_critic), num_actions, critic)
    apply_fn = networks.make_apply_fn(graphdef)
    return Setup(env=env, env_params=env_params, trace_info=trace_info, settings=settings,
                 graphdef=graphdef, apply_fn=apply_fn, tx=tx, action_fn=action_fn,
                 obs_dim=obs_dim, num_users=num_users, total_chunks=chunks,
                 num_actions=num_actions, critic=critic,
                 env_given=env_given)


def check_decision_overflow(overflow, decisions) -> None:
    """Stops a run whose rollout had more decisions than the decision-only buffer holds
    (they would be dropped from the update): ``ConfigError`` (exit 2) naming the fields.

    Args:
      overflow: [K] decisions left out per update of a chunk.
      decisions: [K] decisions per update.
    """
    overflow = np.asarray(overflow)
    if overflow.size and float(np.max(overflow)) > 0:
        i = int(np.argmax(overflow))
        raise config_utils.ConfigError(
            f"config.ppo.decision_capacity is too small: an update had "
            f"{int(np.asarray(decisions)[i])} decisions and {int(overflow[i])} did not fit the "
            "decision-only buffer; raise ppo.decision_capacity (a fraction of "
            "num_envs*rollout_len*num_users) or set ppo.decision_only=False")


def make_jitted_chunk(setup: Setup) -> Callable:
    """``chunk(states [S, ...], env_params) -> (states, metrics [S, K])``, jitted once,
    state donated, vmapped over seeds.

    With one seed (S = 1) the chunk runs on the state without its seed axis and the axis is
    put back on the outputs: on a CPU the vmapped program over a size-1 axis measured 5-12%
    slower (docs/BENCHMARKS.md, issue 25), and the result is the same computation."""
    chunk = learner.make_train_chunk(setup.settings, setup.env, setup.apply_fn, setup.tx,
                                     setup.action_fn)
    vmapped = jax.vmap(chunk, in_axes=(0, None))

    def seeds_chunk(states, env_params):
        if jax.tree.leaves(states)[0].shape[0] != 1:
            return vmapped(states, env_params)
        squeeze = lambda x: x[0]          # noqa: E731
        expand = lambda x: x[None]        # noqa: E731
        state, metrics = chunk(jax.tree.map(squeeze, states), env_params)
        return jax.tree.map(expand, state), jax.tree.map(expand, metrics)

    return jax.jit(seeds_chunk, donate_argnums=0)


# ----------------------------------------------------------------------------- host loop

def _chunk_scalars(metrics: dict, seed_index: int, wall_s: float | None,
                   steps_in_chunk: int) -> dict:
    """Per-seed scalars of one chunk: means over its updates (NaN-aware for env/*).

    ``train/steps_per_second`` (env steps / s) only when ``wall_s`` is given: the host loop
    passes None for the first chunk of a process, whose time includes compilation."""
    m = {k: np.asarray(v[seed_index], np.float64) for k, v in metrics.items()}
    out = {f"train/{k}": float(np.mean(m[k])) for k in _TRAIN_TAGS if k in m}
    out["train/learning_updates"] = float(len(m["env_steps"]))
    eps = float(np.sum(m["episodes"]))
    if eps > 0:
        out["train/episode_return"] = float(np.sum(m["episode_return_sum"]) / eps)
    out["train/episodes"] = eps
    dec = m["decisions"]
    if dec.sum() > 0 and "nominate_rate" in m:   # diagnostics on
        out["train/nominate_rate"] = float(np.sum(m["nominate_rate"] * dec) / dec.sum())
        out["train/mean_gain"] = float(np.sum(m["mean_gain"] * dec) / dec.sum())
    out["train/decisions_per_update"] = float(np.mean(dec))
    if "decision_overflow" in m:   # decisions left out of the compacted (decision-only) update
        out["train/decision_overflow"] = float(np.sum(m["decision_overflow"]))
        check_decision_overflow(m["decision_overflow"], m["decisions"])
    for k, v in m.items():
        if k.startswith("env/") and np.any(np.isfinite(v)):
            out[k] = float(np.nanmean(v))
    if wall_s is not None:
        out["train/steps_per_second"] = steps_in_chunk / max(wall_s, 1e-9)
    return out


def _place_on_mesh(config, states):
    """Seed-stacked states ``[S, E, ...]``: env fields split over the ``batch`` mesh axis (axis
    1, environments), everything else replicated. No-op without ``config.mesh``."""
    if "mesh" not in config:
        return states
    mesh = parallel.make_mesh(int(config.mesh.num_devices))
    try:
        parallel.check_divisible(int(config.ppo.num_envs), mesh, "config.ppo.num_envs")
    except ValueError as e:
        raise config_utils.ConfigError(str(e)) from e
    logging.info("mesh: %d device(s) on axis %r", mesh.shape[parallel.BATCH_AXIS],
                 parallel.BATCH_AXIS)
    return parallel.place_state(states, mesh, ("env_state", "obs", "ep_return"), axis=1)


def observational_fields(config) -> tuple[str, ...]:
    """Config fields that may change when a run is resumed (they only extend or observe it):
    the ``log`` section, ``ppo.diagnostics`` (it only adds or leaves out logged metrics; the
    training is bit-identical) and, with a constant learning rate, ``ppo.total_env_steps``
    (the linear/cosine schedules are laid out over the total, so there it changes the
    computation). Everything else is compared with the stored ``config.json``
    (``prada_jax.run_state``)."""
    fields = ["log.*", "ppo.diagnostics"]
    if config.ppo.lr_schedule == "constant":
        fields.append("ppo.total_env_steps")
    return tuple(fields)


def train_and_evaluate(config, workdir, setup: Setup | None = None, *,
                       env_and_params: tuple | None = None,
                       max_chunks: int | None = None) -> dict:
    """Trains (or resumes) a run in ``workdir`` with the shared host loop (``prada_jax.runloop``).

    On an existing workdir the stored ``config.json`` is compared with ``config`` before
    anything is written (``prada_jax.run_state``): only ``observational_fields`` may differ
    (recorded in ``run.json``'s provenance); anything else is refused (``ConfigMismatch``,
    exit 2). Then the newest intact checkpoint is restored and training continues; a finished
    run does no work and returns the final scalars stored in its last checkpoint.

    Args:
      config: the ``ml_collections`` config of ``prada_jax/configs/ppo.py``.
      workdir: run directory (created).
      setup: :func:`build_setup`'s result for ``config`` and its env (for the env a config
        names, ``envs.stage1.build_setup``): a launcher builds it once to report bad input
        before anything is written.
      env_and_params: ``(env, env_params)`` to build the setup from when ``setup`` is None
        (:func:`build_setup` with no ``action_fn`` or ``trace_info``).
      max_chunks: stop after this many chunks in *this* call (tests, time-boxed jobs); a
        checkpoint is saved there and the run continues on the next call.

    Returns:
      ``{"update_step", "env_steps", "scalars": [per-seed dict of the last chunk], "states",
      "finished", "stopped_by", "start_update"}``; for a finished run rerun, ``scalars`` are
      the stored final ones.

    Raises:
      ConfigError / ConfigMismatch / CheckpointError (all ``BadInput``): a bad config field, a
        changed computational field, an unusable checkpoint (before anything is written).
      errors.NonFiniteTraining: a train/* metric (or the state at a save) became non-finite;
        the last good checkpoint stays.
    """
    if setup is None:
        if env_and_params is None:
            raise TypeError("train_and_evaluate needs setup or env_and_params: the trainer "
                            "builds no env (envs.stage1.build_setup builds a config's)")
        setup = build_setup(config, env_and_params)
    if not workdir:
        raise config_utils.ConfigError("--workdir is required")
    check = run_state.check_resume(config, workdir, observational_fields(config))
    meta = policy.policy_meta(config, setup)
    if not setup.env_given:   # a caller-given env is the caller's business
        policy.check_policy_meta(Path(workdir), meta)
    workdir = config_utils.prepare_workdir(workdir)
    num_seeds = int(config.num_seeds)
    seeds = meta["seeds"]
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints",
                                      save_every=int(config.log.checkpoint_every),
                                      max_to_keep=int(config.log.keep_checkpoints))
    try:
        states, ckpt_meta, _ = runloop.restore_or_init(ckpt, setup.init_states(config))
    except BaseException:
        ckpt.close()
        raise
    # Only now that the checkpoint restored (a template mismatch or an unusable checkpoint
    # raises above) are config.json, run.json and policy_meta.json written.
    if parallel.is_process_zero():   # several hosts share the workdir: one writer
        run_state.commit(config, workdir, check)
        policy.write_policy_meta(workdir, meta)
    start_update = int(np.asarray(states.update_step)[0])
    if start_update:
        logging.info("resumed %s at update %d", workdir, start_update)
    writers = [MetricWriter(workdir / "tb" if num_seeds == 1 else workdir / "tb" / f"seed{s}")
               for s in seeds]
    if start_update == 0:
        for w in writers:
            w.write_texts(0, {"config": "```\n" + config_utils.config_to_json(config) + "\n```"})
    states = _place_on_mesh(config, states)
    k = setup.settings.updates_per_chunk
    total_updates = setup.total_chunks * k
    chunk_fn = make_jitted_chunk(setup) if start_update < total_updates else None
    steps_per_chunk = setup.settings.num_envs * setup.settings.rollout_len * k
    env_params = setup.env_params

    def scalars_fn(metrics, update, wall_s):
        return [_chunk_scalars(metrics, i, wall_s, steps_per_chunk) for i in range(num_seeds)]

    def env_steps_of(st) -> int:
        return int(np.asarray(st.env_steps)[0])

    def postfix(sc):
        ret = sc[0].get("train/episode_return", float("nan"))
        out = {"ret": f"{ret:.4f}"}
        if "train/approx_kl" in sc[0]:
            out["kl"] = f"{sc[0]['train/approx_kl']:.4f}"
        if "train/steps_per_second" in sc[0]:
            out["sps"] = f"{sc[0]['train/steps_per_second']:.0f}"
        return out

    try:
        res = runloop.run(
            states, lambda st, _: chunk_fn(st, env_params), start=start_update,
            total=total_updates, steps_per_call=k, max_calls=max_chunks, writers=writers,
            ckpt=ckpt, scalars_fn=scalars_fn, x_fn=lambda st, _: env_steps_of(st),
            check=lambda tag: tag.startswith("train/"),
            meta_fn=lambda st, update, sc: {"update_step": update,
                                            "env_steps": env_steps_of(st), "scalars": sc},
            progress=bool(config.log.progress), desc="ppo", unit="upd", postfix_fn=postfix,
            writer_names=[f"seed {s}" for s in seeds], step_name="updates")
    finally:
        for w in writers:
            w.close()
        ckpt.close()
    scalars = res.scalars or list(ckpt_meta.get("scalars") or [{} for _ in seeds])
    return {"update_step": int(np.asarray(res.state.update_step)[0]),
            "env_steps": env_steps_of(res.state), "scalars": scalars, "states": res.state,
            "finished": res.finished, "stopped_by": res.stopped_by,
            "start_update": start_update}
