"""Config validation, specs, registry and the action forms of the edge env."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, make
from prada_jax.traces.testing import random_traces

TRACES = random_traces(seed=0, problems=3, depth=3, feature_dim=4)


@pytest.mark.parametrize("kw,field", [
    (dict(num_servers=0), "num_servers"), (dict(num_servers=-2), "num_servers"),
    (dict(bandwidth_hz=0.0), "bandwidth_hz"), (dict(bandwidth_hz=-1e6), "bandwidth_hz"),
    (dict(tau_s=0.0), "tau_s"), (dict(tau_s=-0.05), "tau_s"),
    (dict(arrival_rate_hz=-1.0), "arrival_rate_hz"), (dict(lambda_s=-0.1), "lambda_s"),
    (dict(mu=-1e-9), "mu"), (dict(num_users=0), "num_users"), (dict(beta=-1.0), "beta"),
    (dict(reward_mode="fine"), "reward_mode"), (dict(scheduler="greedy"), "scheduler"),
    (dict(initial_users=99), "initial_users"), (dict(rsd_threshold=1.5), "rsd_threshold"),
    (dict(feature_dim=5), "feature dim"), (dict(edge_eta=0.0), "latency.edge_eta"),
    (dict(tau_s=math.nan), "tau_s"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        edge.make_params(TRACES, **kw)


def test_replace_traces_checks_feature_dim():
    p = edge.make_params(TRACES)
    with pytest.raises(ValueError, match="feature dim"):
        edge.replace_traces(p, random_traces(seed=1, feature_dim=6))


def test_registry_and_specs():
    env, p = make("edge", traces=TRACES, num_users=5)
    assert env.observation_spec(p).shape == (5, 6)
    assert env.action_spec(p).num_values == 2 and env.action_spec(p).shape == (5,)
    obs, state = env.reset(jax.random.key(0), p)
    assert obs.shape == (5, 6) and obs.dtype == jnp.float32
    n = np.asarray(state.node)
    np.testing.assert_allclose(obs[:, :4], TRACES.feat[n])
    np.testing.assert_allclose(obs[:, 4], TRACES.depth[n])
    np.testing.assert_allclose(obs[:, 5], TRACES.ctx_tokens[n] * 1e-3, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown env"):
        make("gridworld")


def test_vmap_over_envs_and_gain_reaches_the_threshold_rule():
    """A huge carried gain makes the threshold rule offload; a negative one keeps it local."""
    p = edge.make_params(TRACES, num_users=4, scheduler="threshold", snr_threshold_db=-math.inf,
                         arrival_rate_hz=0.0)
    keys = jax.random.split(jax.random.key(0), 3)
    _, states = jax.vmap(edge.reset, in_axes=(0, None))(keys, p)
    step = jax.jit(jax.vmap(edge.step, in_axes=(0, 0, 0, None)))
    for gain, want in ((10.0, 2), (-1.0, 0)):
        s = states
        seen = []
        for t in range(30):
            act = edge.EdgeAction(jnp.ones((3, 4), jnp.int32), jnp.full((3, 4), gain))
            _, s, r, d, info = step(jax.random.split(jax.random.key(t), 3), s, act, p)
            dec = np.asarray(info["decision"])
            seen.append(dec[np.asarray(info["nominated"])])
        seen = np.concatenate(seen)
        assert seen.size > 0 and np.all(seen == want)
