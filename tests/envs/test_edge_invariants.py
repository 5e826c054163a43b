"""Invariants of the edge env over long random runs: every scheduler, several seeds."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from envs import edge
from envs import testing as env_testing
from envs.testing import rollout
from prada_jax.sched import SCHEDULER_NAMES
from prada_jax.traces.testing import random_traces

# Same shapes as tests/envs/test_edge_equivalence.py so both share one compiled rollout.
U, T, SEEDS = 8, 240, 3
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
# Tight resources and heavy load, so queues form, limits bind and arrivals are blocked.
STRESS = dict(num_users=U, num_servers=2, bandwidth_hz=2.5e6, arrival_rate_hz=10.0,
              max_wait_slots=6, reward_mode="true", server_kv_cache=True)


def _run(sched, seed0=0, traces=TRACES):
    """Random screening actions (p=0.6 nominate) and gains, SEEDS envs of T slots."""
    params = edge.make_params(traces, scheduler=sched, **STRESS)
    rng = np.random.default_rng(seed0)
    screens = (rng.uniform(size=(SEEDS, T, U)) < 0.6).astype(np.int32)
    gains = rng.normal(0.05, 0.1, (SEEDS, T, U)).astype(np.float32)
    keys = jax.random.split(jax.random.key(seed0), SEEDS)
    _, _, _, final, outs = jax.device_get(rollout(keys, params, screens, gains))
    return params, (final, outs)


@pytest.mark.parametrize("sched", SCHEDULER_NAMES)
def test_invariants_hold_every_slot(sched):
    params, (final, (obs, r, d, info)) = _run(sched)
    # Hard limits.
    assert info["server_in_use"].max() <= 2
    assert np.all(info["bandwidth_in_use_hz"] <= 2.5e6 * (1 + 1e-6))
    # No user is lost: arrived = finished + in flight + blocked, in every slot.
    np.testing.assert_array_equal(info["arrived"],
                                  info["finished"] + info["in_flight"] + info["blocked_total"])
    assert info["finished"][:, -1].min() > 10
    # Each finished user's latency is processing + communication + queueing (and > 0).
    lat = info["user_latency_s"][d]
    split = (info["user_processing_s"] + info["user_communication_s"]
             + info["user_queueing_s"])[d]
    np.testing.assert_allclose(split, lat, rtol=1e-5, atol=1e-5)
    assert np.all(lat > 0)
    # Latency counts whole slots.
    np.testing.assert_allclose(lat / 0.05, np.round(lat / 0.05), atol=1e-3)
    # No NaN anywhere.
    chex.assert_tree_all_finite((obs, r, {k: np.asarray(v, np.float64) for k, v in info.items()}))
    # Rewards only where a step resolved; steps of finished users ≥ 1.
    assert np.all(info["user_steps"][d] >= 1)
    if sched == "keep_local":
        assert info["server_in_use"].max() == 0
    if sched in ("offload_all", "fifo_greedy"):
        assert info["server_in_use"].max() == 2  # the limit binds: the test is not vacuous
        assert info["blocked"].sum() > 0 and info["queue_len"].max() > 0


def test_same_key_identical_and_different_key_differs():
    _, a = _run("threshold", seed0=5)
    _, b = _run("threshold", seed0=5)
    chex.assert_trees_all_equal(a, b)
    _, c = _run("threshold", seed0=6)
    assert not np.array_equal(a[1][1], c[1][1])


@pytest.mark.slow  # eager rollouts (≈ 20 s); default: the NumPy-reference tests; make test-all
def test_jit_and_eager_agree():
    """Advance to a busy slot with the jitted step, then compare one slot op by op."""
    params = edge.make_params(TRACES, scheduler="threshold", **STRESS)
    key = jax.random.key(11)
    step_jit = jax.jit(edge.step)
    _, state = jax.jit(edge.reset)(key, params)
    for t in range(12):
        state = step_jit(jax.random.fold_in(key, t), state, jnp.ones(U, jnp.int32), params)[1]
    assert int(jnp.sum(state.phase == edge.QUEUE_PHASE)) + int(
        jnp.sum(state.phase == edge.DECIDE)) > 0
    k = jax.random.fold_in(key, 12)
    act = jnp.arange(U) % 2
    with jax.disable_jit():
        out_e = edge.step(k, state, act, params)
    out_j = step_jit(k, state, act, params)
    chex.assert_trees_all_close(out_e, out_j, rtol=1e-6, atol=1e-6)


def test_observation_and_carried_gain():
    """obs0 shows each initial user's root node; a huge carried gain makes the threshold rule
    run every nomination now, a negative one keeps every nomination local."""
    params = edge.make_params(TRACES, scheduler="threshold", num_users=U, arrival_rate_hz=4.0,
                              snr_threshold_db=-np.inf, num_servers=U, bandwidth_hz=1e12)
    keys = jax.random.split(jax.random.key(3), SEEDS)
    screens = np.ones((SEEDS, T, U), np.int32)
    for gain, want in ((10.0, 2), (-1.0, 0)):
        gains = np.full((SEEDS, T, U), gain, np.float32)
        obs0, noise0, _, _, (obs, r, d, info) = jax.device_get(
            rollout(keys, params, screens, gains))
        seen = info["decision"][info["nominated"]]
        assert seen.size > 50 and np.all(seen == want)
    node = TRACES.root[noise0.problem]
    np.testing.assert_allclose(obs0[..., :4], TRACES.feat[node])
    np.testing.assert_allclose(obs0[..., 4], TRACES.depth[node])
    np.testing.assert_allclose(obs0[..., 5], TRACES.ctx_tokens[node] * 1e-3, rtol=1e-6)


def test_one_compile_serves_another_trace_set_of_same_shapes():
    other = TRACES.replace(prm=np.clip(TRACES.prm + 0.1, 0, 1).astype(np.float32),
                           feat=(TRACES.feat * 2).astype(np.float32))
    _run("threshold")
    before = env_testing.TRACE_COUNT[0]
    _, (_, out_other) = _run("threshold", traces=other)
    assert env_testing.TRACE_COUNT[0] == before
    _, (_, out_same) = _run("threshold")
    assert not np.allclose(out_other[0], out_same[0])  # the new trace set is really read


def test_poisson_inverse_cdf_matches_scipy():
    keys = jax.random.split(jax.random.key(0), 8000)
    draw = jax.jit(jax.vmap(edge.poisson_inverse_cdf, in_axes=(0, None)))  # rate: an argument
    for rate in (0.2, 1.5):
        n = np.asarray(draw(keys, jnp.float32(rate)))
        counts = np.bincount(n, minlength=8)[:8] / n.size
        np.testing.assert_allclose(counts, stats.poisson.pmf(np.arange(8), rate), atol=0.015)
    assert np.all(np.asarray(draw(keys, jnp.float32(0.0))) == 0)


def test_env_enforces_limits_against_a_rogue_scheduler(monkeypatch):
    """A scheduler that asks to run everything at once: the env still keeps ≤ M and ≤ B."""
    def rogue(x, free_units, free_bw_hz, sp):
        return jnp.full(x.candidate.shape, 2, jnp.int8)

    monkeypatch.setattr(edge, "SCHEDULERS", (rogue,) * 6)
    params = edge.make_params(TRACES, scheduler="threshold", **STRESS)
    step = jax.jit(lambda *a: edge.step(*a))  # a fresh function: traced with the rogue rule
    key = jax.random.key(21)
    _, state = edge.reset(key, params)
    in_use, bw, demoted = [], [], 0
    for t in range(60):
        _, state, _, _, info = step(jax.random.fold_in(key, t), state, jnp.ones(U, jnp.int32),
                                    params)
        in_use.append(int(info["server_in_use"]))
        bw.append(float(info["bandwidth_in_use_hz"]))
        demoted += int(np.sum(np.asarray(info["decision"]) == 1))
    assert max(in_use) == 2 and max(bw) <= 2.5e6 * (1 + 1e-6)
    assert demoted > 0  # the rogue rule really over-asked and was cut back
