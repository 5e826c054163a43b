"""Config validation, specs, registry and the action forms of the edge env."""
import math

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
    assert env.step is edge.step and env.reset is edge.reset
    with pytest.raises(ValueError, match="unknown env"):
        make("gridworld")
