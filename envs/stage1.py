"""The stage-1 (PPO) env a ``prada_jax/configs/ppo.py`` config names, built for the trainer.

The PPO trainer (``prada_jax.rl.trainer``) builds no env: its ``build_setup(config,
env_and_params, action_fn=..., trace_info=...)`` receives one, as PureJaxRL's
``make_train(config)`` receives ``env, env_params``. This module is what the launchers
(``train.ppo``, ``train.main``), the critic refit and the evaluations use to build the env
of a config: the edge env of ``envs.edge`` (the per-user screening MDP unless
``env.contention``) or the library's toy env, its trace set, and the action the policy's
nominations become (an ``envs.edge.EdgeAction`` carrying the critic's ΔQ as the gain when
``env.pass_gain``).

    setup = stage1.build_setup(config)                # validates, builds the env
    trainer.train_and_evaluate(config, workdir, setup)
"""
from __future__ import annotations

import math
from pathlib import Path

from envs import registry
from envs.edge import SERVER_MODELS, EdgeAction
from prada_jax import config_utils, latency, parallel
from prada_jax.rl import toy_env, trainer
from prada_jax.traces import splits, synthetic
from prada_jax.traces.loader import load_config_traces

__all__ = ["validate_env_config", "hardware_of", "build_env", "edge_action", "action_fn_of",
           "build_setup"]


def validate_env_config(config) -> None:
    """Checks the fields that choose and build the env (``env.name``, ``env.preset``,
    ``env.trace_dir``, ...); raises ``ConfigError`` naming the field. ``env.num_users`` is
    the trainer's (``prada_jax.rl.trainer.validate_config``: it must match the env)."""
    cu = config_utils
    cu.check_choice(config, "env.name", ("edge", "toy"))
    cu.check_choice(config, "env.reward_mode", ("coarse", "true"))
    cu.check_int(config, "env.trace_seed", minimum=0)
    cu.check_int(config, "env.problems", minimum=0)
    splits.check_split_name(config.env.split, "config.env.split")
    cu.check_positive(config, "env.num_servers", "env.bandwidth_hz", "env.tau_s")
    cu.check_nonnegative(config, "env.arrival_rate_hz", "env.beta")
    if config.env.name == "edge" and not config.env.trace_dir:
        cu.check_choice(config, "env.preset", sorted(synthetic.PRESETS))
    latency.check_pair(hardware_of(config), "config.env.hardware")
    cu.check_choice(config, "env.server_model", SERVER_MODELS)
    if config.env.trace_dir and not Path(config.env.trace_dir).is_dir():
        raise cu.ConfigError(f"config.env.trace_dir {config.env.trace_dir!r} is not a "
                             "directory")


def hardware_of(config) -> str:
    """The config's hardware pair (``env.hardware``; a config.json stored before the field
    existed reads as ``paper``: ``config_utils.ADDED_FIELDS``)."""
    return str(config.env.hardware)


def build_env(config, traces=None):
    """``(env, env_params, trace_info)`` for the config (traces loaded if not given, by
    ``prada_jax.traces.loader.load_config_traces``)."""
    if config.env.name == "toy":
        env, params = toy_env.make(num_users=int(config.env.num_users),
                                   threshold=float(config.env.toy_threshold))
        return env, params, {"source": "toy", "benchmark": "toy", "synthetic": True}
    info = None
    if traces is None:
        traces, info = load_config_traces(config)
    kw = dict(num_users=int(config.env.num_users), reward_mode=config.env.reward_mode,
              beta=float(config.env.beta), tau_s=float(config.env.tau_s),
              hardware=hardware_of(config), server_model=str(config.env.server_model))
    if config.env.contention:
        kw.update(scheduler=config.env.scheduler, num_servers=int(config.env.num_servers),
                  bandwidth_hz=float(config.env.bandwidth_hz),
                  arrival_rate_hz=float(config.env.arrival_rate_hz))
    else:
        # The per-user screening MDP: every nomination is served at once, nothing is lost to
        # outage, and a finished user's slot is refilled at the end of the slot (an arrival
        # rate far above the slot rate; "blocked" arrivals are then meaningless).
        u = int(config.env.num_users)
        kw.update(scheduler="offload_all", num_servers=u, bandwidth_hz=1e15,
                  arrival_rate_hz=100.0 * u / float(config.env.tau_s),
                  snr_threshold_db=-math.inf)
    env, params = registry.make("edge", traces=traces, **kw)
    if info is None:
        info = {"source": "given", "num_nodes": traces.num_nodes,
                "num_problems": traces.num_problems, "feature_dim": traces.feature_dim}
    return env, params, info


def edge_action(screen, gain):
    """The edge env's action of a nomination: ``EdgeAction(screen, gain)`` (the critic's ΔQ
    travels with it to the server's scheduler)."""
    return EdgeAction(screen=screen, gain=gain)


def action_fn_of(env_params, pass_gain: bool):
    """The trainer's ``action_fn`` for an env: :func:`edge_action` for the edge env (its params
    hold traces) when ``pass_gain``, else None (the int screen is the action)."""
    if pass_gain and hasattr(env_params, "traces"):
        return edge_action
    return None


def build_setup(config, traces=None) -> trainer.Setup:
    """Validates the config and builds its env, then the trainer's ``Setup`` for it
    (``prada_jax.rl.trainer.build_setup``); writes nothing.

    ``traces``: the trace set to use instead of loading the config's."""
    trainer.validate_config(config)
    validate_env_config(config)
    if "mesh" in config:   # several processes: join them before the first JAX computation
        parallel.maybe_initialize_distributed(config.mesh)
    env, env_params, trace_info = build_env(config, traces)
    return trainer.build_setup(config, (env, env_params),
                               action_fn=action_fn_of(env_params, bool(config.env.pass_gain)),
                               trace_info=trace_info)
