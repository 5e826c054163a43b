"""docs/design.md §6 value accounting (each cost charged once) and exact ties at the price kink."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge
from prada_jax import sched
from prada_jax.errors import BadInput
from prada_jax.sched import IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams
from prada_jax.sched import oracle
from prada_jax.traces import synthetic

_decide = jax.jit(sched.threshold_decide)
_advantages = jax.jit(sched.advantages)
_wait_cost = jax.jit(sched.threshold.wait_cost)


def _policy(state, params):
    """Privileged nomination rule: nominate iff the LLM's step scores higher (gain > 0)."""
    cp = params.traces.cand_prm[state.node]
    gain = (cp[:, 1] - cp[:, 0]).astype(jnp.float32)
    return edge.EdgeAction(screen=(gain > 0).astype(jnp.int32), gain=gain)


def _run(params, slots=60, envs=2, seed=0):
    """Decisions [T, E, U] and candidate sets of ``slots`` slots (same noise for any params;
    params are a jit argument, so every scheduler shares one compilation)."""
    return _rollout(params, jnp.int32(seed), slots=slots, envs=envs)


@functools.partial(jax.jit, static_argnames=("slots", "envs"))
def _rollout(params, seed, slots, envs):
    def one(key, state):
        k_n, k = jax.random.split(key)
        noise = edge.draw_noise(k_n, params)
        action = _policy(state, params)
        cs = edge.candidate_set(state, action, params, noise)
        _, state, _, _, info = edge.step_with_noise(state, action, params, noise)
        return state, (info["decision"], cs.x)

    def scan_fn(states, key):
        states, out = jax.vmap(one)(jax.random.split(key, envs), states)
        return states, out

    _, states = jax.vmap(edge.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(seed), envs), params)
    _, out = jax.lax.scan(scan_fn, states, jax.random.split(jax.random.key(seed + 1), slots))
    return out


def test_prada_at_zero_price_equals_fifo_with_ample_resources_and_no_comm():
    """Ample servers and bandwidth, (near-)zero communication delay, λ_s = µ = 0: PRADA serves
    exactly the policy's nominations, slot by slot the same decisions as FIFO-greedy. The old
    rule (w = ΔQ − β·D, server compute charged a second time) would keep some of them local."""
    traces, _ = synthetic.generate("gsm8k", seed=0, problems=40)
    kw = dict(num_users=6, num_servers=6, bandwidth_hz=1e12, arrival_rate_hz=20.0,
              bits_per_token=1e-9, snr_threshold_db=-np.inf)
    prada = edge.make_params(traces, scheduler="threshold", **kw)
    fifo = edge.make_params(traces, scheduler="fifo_greedy", **kw)
    d_prada, x = _run(prada)
    d_fifo, _ = _run(fifo)
    d_prada, d_fifo = np.asarray(d_prada), np.asarray(d_fifo)
    nominated = np.asarray(x.candidate)
    assert nominated.sum() > 50  # the comparison is not vacuous
    np.testing.assert_array_equal(d_prada, d_fifo)
    assert np.all(d_prada[nominated] == IMMEDIATE)
    # Discrimination: the double-charging rule keeps a share of these nominations local.
    old_w = np.asarray(x.gain) - float(prada.beta) * np.asarray(x.delay_s)
    assert np.sum(nominated & (old_w < 0)) > 0


def test_true_trained_policy_gets_no_communication_charge():
    x = SchedInputs(candidate=jnp.array([True, True]), gain=jnp.array([0.01, 0.01], jnp.float32),
                    delay_s=jnp.array([0.5, 0.5], jnp.float32),
                    bandwidth_hz=jnp.array([1e5, 1e5], jnp.float32),
                    wait_slots=jnp.zeros(2, jnp.int32), ctx_tokens=jnp.zeros(2, jnp.int32),
                    snr=jnp.ones(2), draft_prm=jnp.zeros(2), u_rand=jnp.zeros(2),
                    queue_len=jnp.int32(0), comm_s=jnp.array([0.0, 0.2], jnp.float32))
    sp = SchedParams(beta=0.2)
    w, w_bar, g = _advantages(x, sp)
    np.testing.assert_allclose(np.asarray(w), [0.01, 0.01 - 0.2 * 0.2], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(w - w_bar), 0.2 * 0.05, rtol=1e-6)
    # Coarse: the 2nd request's communication outweighs its gain; true: nothing is added.
    np.testing.assert_array_equal(np.asarray(_decide(x, 4, 1e9, sp)), [IMMEDIATE, LOCAL])
    sp_true = sp.replace(policy_true_reward=True)
    np.testing.assert_array_equal(np.asarray(_decide(x, 4, 1e9, sp_true)),
                                  [IMMEDIATE, IMMEDIATE])


def test_unknown_policy_reward_mode_is_bad_input():
    traces, _ = synthetic.generate("gsm8k", seed=0, problems=5)
    with pytest.raises(BadInput, match="policy_reward_mode"):
        edge.make_params(traces, policy_reward_mode="dense")


def _slot(rng, c, equal=False):
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    gain = np.full(c, 0.0731) if equal else rng.normal(0.05, 0.05, size=c)
    comm = np.full(c, 0.0137) if equal else rng.uniform(0, 0.05, size=c)
    return SchedInputs(
        candidate=jnp.ones(c, bool), gain=f32(gain), delay_s=f32(comm + 0.1),
        bandwidth_hz=f32(rng.uniform(1e5, 2e6, size=c)), wait_slots=jnp.zeros(c, jnp.int32),
        ctx_tokens=jnp.zeros(c, jnp.int32), snr=jnp.ones(c, jnp.float32),
        draft_prm=jnp.zeros(c, jnp.float32), u_rand=jnp.zeros(c, jnp.float32),
        queue_len=jnp.int32(int(rng.integers(0, 7))), comm_s=f32(comm))


def _no_idle_unit_while_queued(d, x, free_units, free_bw):
    imm = d == IMMEDIATE
    units_left = free_units - imm.sum()
    bw_left = free_bw - np.asarray(x.bandwidth_hz, np.float64)[imm].sum()
    for i in np.flatnonzero(d == QUEUE):
        assert not (units_left >= 1 and float(x.bandwidth_hz[i]) <= bw_left - 1.0), (d, i)


def test_equal_requests_tie_exactly_at_the_kink():
    """λ_s = β·τ·(1+q) (where the LP dual and the learned price sit): 14 equal requests, 10
    free units, ample bandwidth: all 10 units run one (the old rule's separately rounded
    g and w̄ left units idle), the rest queue or stay local, all alike."""
    rng = np.random.default_rng(0)
    for beta in (0.2, 0.3, 0.7):
        x = _slot(rng, 14, equal=True)
        x = x.replace(bandwidth_hz=jnp.full(14, 1e5, jnp.float32))
        sp = SchedParams(beta=beta, num_servers=4)
        c = sched.threshold.wait_cost(x, sp)
        for lam in (c, c * 0.5, jnp.float32(0.0)):
            d = np.asarray(_decide(x, 10, 1e9, sp.replace(lambda_s=lam)))
            assert (d == IMMEDIATE).sum() == 10, (beta, lam, d)
            rest = d[d != IMMEDIATE]
            assert np.all(rest == rest[0])


def test_kink_random_slots_against_exhaustive_enumeration():
    """Random small slots at the kink price: never a free unit while a request that fits waits;
    at λ_s = µ = 0 with ample bandwidth the rule is the exact slot optimum (enumeration)."""
    rng = np.random.default_rng(1)
    n = 7  # c candidates padded with non-candidates to one shape (one compile)
    for trial in range(40):
        c = int(rng.integers(2, n + 1))
        x = _slot(rng, c)
        x = jax.tree.map(lambda a: a if a.ndim == 0 else jnp.pad(a, (0, n - c)), x)
        x = x.replace(candidate=jnp.arange(n) < c)
        sp = SchedParams(beta=0.3, num_servers=3)
        free_units = int(rng.integers(0, c + 1))
        lam = _wait_cost(x, sp)
        d = np.asarray(_decide(x, free_units, 3e6, sp.replace(lambda_s=lam)))
        _no_idle_unit_while_queued(d, x, free_units, 3e6)
        d0 = np.asarray(_decide(x, free_units, 1e12, sp.replace(lambda_s=jnp.float32(0.0))))
        assert np.all(d[c:] == LOCAL) and np.all(d0[c:] == LOCAL)
        w, w_bar, _ = (np.asarray(a)[:c] for a in _advantages(x, sp))
        best = oracle.enumerate_slot(w, w_bar, None, free_units)
        got = oracle.slot_value(d0[:c], w, w_bar)
        assert got == pytest.approx(best.value, abs=1e-6), trial
