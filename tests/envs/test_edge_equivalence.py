"""JAX edge env vs the independent NumPy reference on the same pre-drawn randomness."""
import jax
import numpy as np
import pytest

from envs import edge
from envs.edge_numpy import EdgeEnvNumPy, consts_from_jax
from envs.testing import rollout
from prada_jax.sched import SCHEDULER_NAMES
from prada_jax.traces.testing import random_traces

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


def _at(tree, *idx):
    return jax.tree.map(lambda v: np.asarray(v)[idx], tree)


def _run_pair(sched, cfg, seed, compare=(0,)):
    params = edge.make_params(TRACES, num_users=U, scheduler=sched, **cfg)
    rng = np.random.default_rng(seed)
    screens = rng.integers(0, 2, (S, T, U)).astype(np.int32)
    gains = rng.normal(0.05, 0.1, (S, T, U)).astype(np.float32)
    keys = jax.random.split(jax.random.key(seed), S)
    obs0, noise0, noises, _, (obs, r, d, info) = jax.device_get(
        rollout(keys, params, screens, gains))
    finished = 0
    for s in compare:
        ref = EdgeEnvNumPy(TRACES, dict(FULL_DEFAULTS, scheduler=sched, **cfg),
                           consts_from_jax(params.latency))
        np.testing.assert_allclose(obs0[s], ref.reset(vars(_at(noise0, s))), rtol=1e-5,
                                   atol=1e-6)
        for t in range(T):
            obs_r, r_r, d_r, info_r = ref.step(screens[s, t], gains[s, t],
                                               vars(_at(noises, s, t)))
            msg = f"{sched} env {s} slot {t}"
            np.testing.assert_array_equal(info["decision"][s, t], info_r["decision"], msg)
            np.testing.assert_array_equal(d[s, t], d_r, msg)
            np.testing.assert_allclose(r[s, t], r_r, rtol=1e-4, atol=1e-6, err_msg=msg)
            np.testing.assert_allclose(obs[s, t], obs_r, rtol=1e-5, atol=1e-6, err_msg=msg)
            for k, v in info_r.items():
                np.testing.assert_allclose(info[k][s, t], v, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{msg} info[{k}]")
            finished += int(d_r.sum())
        assert ref.arrived == ref.finished + ref.blocked + sum(
            u.phase != "empty" for u in ref.users)
    return finished


@pytest.mark.parametrize("sched", SCHEDULER_NAMES)
def test_same_outcomes_as_numpy_reference(sched):
    assert _run_pair(sched, CONFIGS["tight"], seed=0) >= 20


@pytest.mark.parametrize("sched", ["threshold", "rsd", "random", "threshold_fifo"])
def test_same_outcomes_priced_config(sched):
    assert _run_pair(sched, CONFIGS["priced"], seed=1) >= 20
