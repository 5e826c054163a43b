"""Adapter that runs a single-agent env (obs [D], scalar reward) as a one-user multi-user env.

The PPO trainer's input wrapper (as PureJaxRL keeps its gymnax wrappers in the library): it
knows no env of this project; ``envs.registry`` offers ``make("gymnax")`` through it.

The PPO learner (``prada_jax.rl.learner``) trains on envs of the multi-user shape:
``reset(key, params) -> (obs [U, D], state)`` and ``step(key, state, action [U], params) ->
(obs [U, D], state, reward [U], done [U], info)`` with ``info["decision_mask"]`` [U].
A single-agent env in the gymnax style — ``reset(key, params) -> (obs [D], state)``,
``step(key, state, action, params)`` returning ``(obs [D], state, reward [], terminated [],
truncated [], info)`` (gymnax 1.x, auto-resetting) or ``(obs, state, reward, done, info)``
(gymnax 0.x), a discrete ``action_space(params)`` with ``n`` actions — becomes one with
``U = 1`` through :func:`adapt`:

* the user axis: obs [1, D], reward / done [1], the action [1] is passed on as a scalar;
* the decision mask: every step is a decision (``info["decision_mask"] = [True]``), and the
  adapted env declares ``sparse_decisions = False``, so the learner trains on every sample;
* termination vs truncation: ``info["terminated"]`` / ``info["truncated"]`` [1] from the
  gymnax 1.x step (a 0.x step's ``done`` counts as a termination);
* the final observation: gymnax 1.x resets inside ``step`` and reports the observation the
  cut episode would have continued from as ``info["final_observation"]``; it is passed on as
  [1, D], so a truncated episode (CartPole's 500-step limit) is bootstrapped with V(final
  observation) rather than with the value of the next episode's first observation.

Other numeric scalar ``info`` entries are passed on (the learner logs them as ``env/<name>``).
``adapt`` checks the shapes once (abstractly, ``jax.eval_shape``) and raises
``BadEnvShape`` (a ``BadInput``, exit 2) with one line naming the env function and the shape.

Example::

    import gymnax
    from prada_jax.rl import single_agent
    env, params = single_agent.make_gymnax("CartPole-v1")   # or adapt(*gymnax.make(...))
    setup = trainer.build_setup(config, (env, params))      # config.env.num_users = 1

``prada_jax.rl.trainer.build_setup`` adapts an env whose ``reset`` returns obs [D] itself.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from prada_jax.errors import BadInput

__all__ = ["BadEnvShape", "SingleAgentEnv", "DiscreteSpec", "adapt", "make_gymnax",
           "check_multi_user", "as_multi_user", "env_name", "sparse_decisions"]

_PASSED_ON = ("terminated", "truncated", "final_observation", "discount", "decision_mask")


class BadEnvShape(BadInput):
    """An env's reset/step/action space has a shape or type the learner cannot train on."""


class DiscreteSpec(NamedTuple):
    """Action spec of the adapted env: [U] int32 in {0, ..., num_values − 1}."""

    shape: tuple
    dtype: Any
    num_values: int


def env_name(env: Any) -> str:
    """A readable name of an env object for error messages (``CartPole.step`` etc.)."""
    name = getattr(env, "name", None)
    if isinstance(name, str):
        return name
    return type(env).__name__


def _num_actions(env: Any, params: Any) -> int:
    """n of a discrete gymnax action space (``action_space(params).n``), else BadEnvShape."""
    where = f"{env_name(env)}.action_space"
    fn = getattr(env, "action_space", None)
    if fn is None:
        raise BadEnvShape(f"{where}: the env has no action_space(params); the learner needs "
                          "a discrete action space")
    space = fn(params)
    n = getattr(space, "n", None)
    if n is None:
        n = getattr(space, "num_values", None)
    shape = tuple(getattr(space, "shape", ()) or ())
    if n is None or shape not in ((), (1,)):
        raise BadEnvShape(f"{where}: action space {type(space).__name__} with shape {shape} "
                          "is not discrete (need gymnax Discrete(n), one action per step)")
    if int(n) < 2:
        raise BadEnvShape(f"{where}: a discrete action space needs n >= 2, got {int(n)}")
    return int(n)


class SingleAgentEnv:
    """A single-agent gymnax-style env seen as a multi-user env with one user slot.

    Attributes:
      inner: the wrapped env.
      sparse_decisions: False (every step is a decision; the learner trains on every sample).
      name: the inner env's name.
    """

    sparse_decisions = False

    def __init__(self, inner: Any, num_actions: int):
        self.inner = inner
        self.name = env_name(inner)
        self._num_actions = int(num_actions)

    def reset(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]:
        """-> (obs [1, D], state)."""
        obs, state = self.inner.reset(key, params)
        return jnp.asarray(obs)[None], state

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any):
        """action [1] int32 -> (obs [1, D], state, reward [1], done [1], info); ``info`` has
        ``decision_mask``, ``terminated``, ``truncated`` [1] and, when the inner env reports
        it, ``final_observation`` [1, D]."""
        action = jnp.asarray(getattr(action, "screen", action))
        out = self.inner.step(key, state, jnp.reshape(action, ())
                              if action.size == 1 else action, params)
        if len(out) == 6:
            obs, state, reward, terminated, truncated, info = out
        else:
            obs, state, reward, done, info = out
            terminated = done
            truncated = (info or {}).get("truncated", jnp.zeros((), bool))
        info = dict(info or {})
        terminated = jnp.reshape(jnp.asarray(terminated, bool), (1,))
        truncated = jnp.reshape(jnp.asarray(truncated, bool), (1,)) & ~terminated
        new_info = {"decision_mask": jnp.ones((1,), bool), "terminated": terminated,
                    "truncated": truncated}
        if "final_observation" in info:
            new_info["final_observation"] = jnp.asarray(info["final_observation"])[None]
        for k, v in info.items():
            if k in _PASSED_ON:
                continue
            if isinstance(v, (jax.Array, float, int, bool)) and jnp.ndim(v) == 0:
                new_info[k] = v
        reward = jnp.reshape(jnp.asarray(reward, jnp.float32), (1,))
        return jnp.asarray(obs)[None], state, reward, terminated | truncated, new_info

    def action_spec(self, params: Any) -> DiscreteSpec:
        """[1] int32 in {0, ..., n − 1}."""
        return DiscreteSpec(shape=(1,), dtype=jnp.int32, num_values=self._num_actions)


def _shape(x) -> tuple:
    return tuple(getattr(x, "shape", ()))


def adapt(env: Any, params: Any) -> tuple[SingleAgentEnv, Any]:
    """``(SingleAgentEnv(env), params)`` after checking the env's shapes once (abstractly).

    Raises:
      BadEnvShape: ``reset`` does not return obs [D], ``step`` does not return obs [D] and a
        scalar reward / done, or the action space is not discrete; the one-line message names
        the env function and the shape.
    """
    name = env_name(env)
    n = _num_actions(env, params)
    obs, state = jax.eval_shape(env.reset, jax.random.key(0), params)
    if len(_shape(obs)) != 1:
        raise BadEnvShape(f"{name}.reset: observation shape {_shape(obs)}; the single-agent "
                          "adapter needs obs [D] (a multi-user env returns [U, D])")
    out = jax.eval_shape(lambda k, s: env.step(k, s, jnp.int32(0), params),
                         jax.random.key(0), state)
    if len(out) not in (5, 6):
        raise BadEnvShape(f"{name}.step: returned {len(out)} values; need (obs, state, "
                          "reward, terminated, truncated, info) or (obs, state, reward, done, "
                          "info)")
    if _shape(out[0]) != _shape(obs):
        raise BadEnvShape(f"{name}.step: observation shape {_shape(out[0])} differs from "
                          f"reset's {_shape(obs)}")
    if _shape(out[2]) not in ((), (1,)):
        raise BadEnvShape(f"{name}.step: reward shape {_shape(out[2])}; a single-agent env "
                          "returns a scalar reward")
    for i, what in ((3, "terminated" if len(out) == 6 else "done"),) + (
            ((4, "truncated"),) if len(out) == 6 else ()):
        if _shape(out[i]) not in ((), (1,)):
            raise BadEnvShape(f"{name}.step: {what} shape {_shape(out[i])}; a single-agent "
                              "env returns a scalar")
    return SingleAgentEnv(env, n), params


def make_gymnax(env_id: str, **param_overrides) -> tuple[SingleAgentEnv, Any]:
    """``adapt(*gymnax.make(env_id))`` with ``param_overrides`` replacing EnvParams fields.

    Needs the optional ``gymnax`` extra (``pip install 'prada_jax[gymnax]'``)."""
    try:
        import gymnax  # lazy: gymnax is an optional extra ([gymnax])
    except ImportError:
        raise BadInput(f"env gymnax:{env_id} needs the gymnax extra: pip install "
                       "'prada_jax[gymnax]'") from None
    try:
        env, params = gymnax.make(env_id)
    except (ValueError, KeyError) as e:
        raise BadInput(f"gymnax.make({env_id!r}): {str(e).splitlines()[0][:200]}") from None
    if param_overrides:
        params = params.replace(**param_overrides)
    return adapt(env, params)


def check_multi_user(env: Any, params: Any) -> None:
    """Checks an env of the multi-user shape (obs [U, D], reward / done [U], a discrete
    action spec, ``info["decision_mask"]`` [U]); raises ``BadEnvShape`` naming the function."""
    name = env_name(env)
    obs, state = jax.eval_shape(env.reset, jax.random.key(0), params)
    if len(_shape(obs)) != 2:
        raise BadEnvShape(f"{name}.reset: observation shape {_shape(obs)}; the learner needs "
                          "[U, D] (multi-user) or [D] (single-agent)")
    u = _shape(obs)[0]
    spec_fn = getattr(env, "action_spec", None)
    if spec_fn is not None:
        spec = spec_fn(params)
        n = getattr(spec, "num_values", None)
        if n is None or int(n) < 2:
            raise BadEnvShape(f"{name}.action_spec: {type(spec).__name__} is not a discrete "
                              "spec with num_values >= 2")
    out = jax.eval_shape(lambda k, s: env.step(k, s, jnp.zeros((u,), jnp.int32), params),
                         jax.random.key(0), state)
    if len(out) != 5:
        raise BadEnvShape(f"{name}.step: returned {len(out)} values; a multi-user env "
                          "returns (obs, state, reward, done, info)")
    nobs, _, reward, done, info = out
    if _shape(nobs) != _shape(obs):
        raise BadEnvShape(f"{name}.step: observation shape {_shape(nobs)} differs from "
                          f"reset's {_shape(obs)}")
    if _shape(reward) != (u,):
        raise BadEnvShape(f"{name}.step: reward shape {_shape(reward)}; need [U] = ({u},)")
    if _shape(done) != (u,):
        raise BadEnvShape(f"{name}.step: done shape {_shape(done)}; need [U] = ({u},)")
    if not isinstance(info, dict) or "decision_mask" not in info:
        raise BadEnvShape(f"{name}.step: info has no 'decision_mask' [U] (which users' "
                          "actions were consumed)")
    if _shape(info["decision_mask"]) != (u,):
        raise BadEnvShape(f"{name}.step: info['decision_mask'] shape "
                          f"{_shape(info['decision_mask'])}; need [U] = ({u},)")


def as_multi_user(env: Any, params: Any) -> tuple[Any, Any]:
    """``(env, params)`` of the multi-user shape: a [D]-observation env is adapted
    (:func:`adapt`), a [U, D] one is checked (:func:`check_multi_user`) and returned as is."""
    if isinstance(env, SingleAgentEnv):
        return env, params
    obs, _ = jax.eval_shape(env.reset, jax.random.key(0), params)
    if len(_shape(obs)) == 1:
        return adapt(env, params)
    check_multi_user(env, params)
    return env, params


def sparse_decisions(env: Any) -> bool:
    """The env's declaration: True when only a small share of its user slots decide per step
    (the edge env), so the learner's epochs may run over the decision samples only. An env
    that declares nothing is dense (every sample is trained)."""
    return bool(getattr(env, "sparse_decisions", False))

