"""The wait cost uses the server units of this slot (M_t); ``degraded`` cuts units at every M."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, scenarios
from envs.edge_numpy import EdgeEnvNumPy, schedule
from prada_jax.sched.base import LOCAL, QUEUE, SchedInputs, SchedParams
from prada_jax.sched.threshold import threshold_decide, wait_cost
from prada_jax.traces.testing import random_traces

U = 8
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)


def _m_t(m, factor):
    """Plain-Python M_t of ``envs.scenarios``: floor(M · factor + 1/2) in float32."""
    return int(math.floor(float(np.float32(m) * np.float32(factor)) + 0.5))


def _one_candidate(gain, queue_len, m_t):
    f = lambda v: jnp.asarray([v], jnp.float32)  # noqa: E731
    return SchedInputs(candidate=jnp.asarray([True]), gain=f(gain), delay_s=f(0.1),
                       bandwidth_hz=f(1e6), wait_slots=jnp.asarray([0], jnp.int32),
                       ctx_tokens=jnp.asarray([100], jnp.int32), snr=f(10.0), draft_prm=f(0.5),
                       u_rand=f(0.5), queue_len=jnp.asarray(queue_len, jnp.int32),
                       comm_s=f(0.0), num_servers_t=m_t)


_decide = jax.jit(threshold_decide)
_wait_cost = jax.jit(wait_cost)


def test_rule_queues_against_the_units_of_the_slot():
    """M = 4 nominal, M_t = 1 this slot, 3 waiting: c = β·τ·(1 + 3/1) = 0.04; a gain of
    0.02 beats the nominal cost β·τ·(1 + 3/4) = 0.0175 but not the slot's, so with no free
    unit the request is kept local."""
    beta, tau, q = 0.2, 0.05, 3
    sp = SchedParams(beta=beta, tau_s=tau, num_servers=4)
    gain = 0.02
    c_slot = beta * tau * (1 + q / 1)
    c_nominal = beta * tau * (1 + q / 4)
    assert c_nominal < gain < c_slot
    x = _one_candidate(gain, q, jnp.asarray(1, jnp.int32))
    assert float(_wait_cost(x, sp)) == pytest.approx(c_slot, rel=1e-6)
    assert int(_decide(x, 0, 1e9, sp)[0]) == LOCAL
    # Without M_t the inputs fall back to the nominal M (hand-built inputs): queued.
    assert int(_decide(x.replace(num_servers_t=None), 0, 1e9, sp)[0]) == QUEUE
    # Every unit taken: M_t floored at 1, the cost stays finite.
    x0 = _one_candidate(gain, q, jnp.asarray(0, jnp.int32))
    assert float(_wait_cost(x0, sp)) == pytest.approx(c_slot, rel=1e-6)


def test_numpy_reference_uses_the_units_of_the_slot():
    cand = [dict(i=0, gain=0.02, delay=0.1, bw=1e6, wait=0, comm=0.0, draft_prm=0.5, u=0.5)]
    cfg = dict(beta=0.2, tau_s=0.05, num_servers=4, max_wait_slots=20, lambda_s=0.0, mu=0.0,
               queue_len=3)
    assert schedule("threshold", cand, 0, 1e9, dict(cfg, num_servers_t=1))[0] == LOCAL
    assert schedule("threshold", cand, 0, 1e9, dict(cfg, num_servers_t=4))[0] == QUEUE


def test_env_hands_the_scheduler_m_t():
    """Along a rollout whose schedule takes 3 of 4 units half the time, the cost the threshold
    rule charges equals β·τ·(1 + queue/M_t) computed by hand from the schedule."""
    length = 20
    t_idx = np.arange(length)
    servers = np.where(t_idx % length < 10, 1.0, 0.25).astype(np.float32)
    scn = scenarios.static(length)._replace(servers=servers)
    params = edge.make_params(TRACES, num_users=U, scheduler="threshold", num_servers=4,
                              bandwidth_hz=8e6, arrival_rate_hz=40.0, beta=0.2,
                              max_wait_slots=8, scenario=scn)

    @jax.jit
    def slot(key, state, params):
        """The slot's M_t, the wait cost the rule charges and the next state (one compile)."""
        noise = edge.draw_noise(key, params)
        cs = edge.candidate_set(state, action, params, noise)
        nxt = edge.step_with_noise(state, action, params, noise)[1]
        return cs.x.num_servers_t, wait_cost(cs.x, edge.sched_params(params)), nxt

    key = jax.random.key(0)
    _, state = jax.jit(edge.reset)(key, params)
    action = jnp.ones((U,), jnp.int32)
    beta, tau = float(params.beta), float(params.tau_s)
    seen_cut_with_queue = 0
    for t in range(60):
        key, k = jax.random.split(key)
        got_m_t, got_cost, next_state = slot(k, state, params)
        m_t = _m_t(4, servers[t % length])
        q = int(np.sum(np.asarray(state.phase) == edge.QUEUE_PHASE))
        assert int(got_m_t) == m_t
        want = beta * tau * (1.0 + q / max(m_t, 1))
        assert float(got_cost) == pytest.approx(want, rel=1e-6)
        seen_cut_with_queue += int(m_t < 4 and q > 0)
        state = next_state
    assert seen_cut_with_queue > 5  # the claim was exercised


_slot_conditions = jax.jit(edge.slot_conditions)


@pytest.mark.parametrize("m", list(range(1, 17)) + [32, 64])
def test_degraded_cuts_capacity_at_every_m(m):
    n = 100
    scn = scenarios.preset("degraded", n)
    params = edge.make_params(TRACES, num_users=U, num_servers=m, scenario=scn)
    ref = EdgeEnvNumPy(TRACES, dict(num_users=U, scheduler="threshold", num_servers=m,
                                    arrival_rate_hz=1.0, bandwidth_hz=1e6, scenario=scn))
    bad = [t for t in range(n) if scn.bandwidth[t] < 1]
    assert bad
    for t in (0, bad[0], bad[-1], n - 1):
        jax_m = int(_slot_conditions(params, t)["num_servers"])
        assert jax_m == ref._cond(t)[2] == _m_t(m, scn.servers[t])
        assert jax_m < m if t in bad else jax_m == m
