"""JAX edge env vs the independent NumPy reference on the same pre-drawn randomness."""
import pytest

from envs import edge
from prada_jax.sched import SCHEDULER_NAMES
from prada_jax.traces.testing import random_traces
from tests.helpers.edge_pair import jax_rollout, random_actions, replay_on_numpy

# Same shapes as tests/envs/test_edge_invariants.py so both share one compiled rollout.
S, T, U = 3, 240, 8
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)

CONFIGS = {
    # Tight resources, long queues, server KV cache, true reward.
    "tight": dict(num_servers=2, bandwidth_hz=3e6, arrival_rate_hz=8.0, max_wait_slots=5,
                  reward_mode="true", server_kv_cache=True),
    # Default-sized resources, priced multipliers, no downlink, coarse reward.
    "priced": dict(arrival_rate_hz=6.0, lambda_s=0.01, mu=1e-8, downlink=False, beta=0.5),
}
FULL_DEFAULTS = dict(num_users=U, tau_s=0.05, beta=0.2, lambda_s=0.0, mu=0.0, num_servers=4,
                     bandwidth_hz=20e6, arrival_rate_hz=4.0, initial_users=U, default_gain=0.05,
                     max_wait_slots=20, rsd_threshold=0.7, reward_mode="coarse",
                     server_kv_cache=False, downlink=True, ctx_scale=1e-3)


def _run_pair(sched, cfg, seed, compare=(0,)):
    params = edge.make_params(TRACES, num_users=U, scheduler=sched, **cfg)
    screens, gains = random_actions(seed, (S, T, U))
    out = jax_rollout(seed, params, screens, gains)
    finished = 0
    for s in compare:
        n, ref, _ = replay_on_numpy(TRACES, dict(FULL_DEFAULTS, scheduler=sched, **cfg), params,
                                    screens, gains, out, env=s, label=f"{sched} env {s}",
                                    check_obs=True)
        finished += n
        assert ref.arrived == ref.finished + ref.blocked + sum(
            u.phase != "empty" for u in ref.users)
    return finished


@pytest.mark.parametrize("sched", SCHEDULER_NAMES)
def test_same_outcomes_as_numpy_reference(sched):
    assert _run_pair(sched, CONFIGS["tight"], seed=0) >= 20


@pytest.mark.parametrize("sched", ["threshold", "rsd", "random", "threshold_fifo"])
def test_same_outcomes_priced_config(sched):
    assert _run_pair(sched, CONFIGS["priced"], seed=1) >= 20
