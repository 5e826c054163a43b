"""``make(name, **overrides) -> (env, default_params)``: the env functions as a NamedTuple."""
from __future__ import annotations

from typing import Callable, NamedTuple

from envs import edge
from prada_jax.rl import single_agent
from prada_jax.traces.testing import random_traces


class Env(NamedTuple):
    """The pure functions of one environment (gymnax style, params passed explicitly)."""

    reset: Callable
    step: Callable
    observation_spec: Callable
    action_spec: Callable
    make_params: Callable
    step_with_noise: Callable
    draw_noise: Callable
    # Few user slots decide per slot (20-24% in the edge env): the PPO learner may run its
    # epochs over the decision samples only (``ppo.decision_only``, docs/ppo.md).
    sparse_decisions: bool = True


def _edge(traces=None, **overrides):
    if traces is None:
        # Placeholder structure-only traces (random, not calibrated, not benchmark data):
        # callers pass a real or synthetic TraceSet for anything that reports numbers.
        traces = random_traces(seed=0, problems=32, depth=6, feature_dim=8)
    env = Env(reset=edge.reset, step=edge.step, observation_spec=edge.observation_spec,
              action_spec=edge.action_spec, make_params=edge.make_params,
              step_with_noise=edge.step_with_noise, draw_noise=edge.draw_noise)
    return env, edge.make_params(traces, **overrides)


def _gymnax(env_id: str = "CartPole-v1", **param_overrides):

    return single_agent.make_gymnax(env_id, **param_overrides)


_REGISTRY = {"edge": _edge, "gymnax": _gymnax}


def make(name: str, **overrides):
    """Returns ``(env, default_params)``.

    Args:
      name: ``"edge"`` or ``"gymnax"`` (a single-agent gymnax env through
        ``prada_jax.rl.single_agent``; needs the ``[gymnax]`` extra).
      overrides: for "edge", ``traces=TraceSet`` plus any ``envs.edge.make_params`` keyword
        (``num_users``, ``scheduler``, ``num_servers``, ...); for "gymnax", ``env_id``
        (default "CartPole-v1") plus EnvParams fields to replace.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown env {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**overrides)
