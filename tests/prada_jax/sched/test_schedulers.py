"""Stage-2 schedulers: exhaustive enumeration, plain-Python references, feasibility, soft rule."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.edge_numpy import schedule as ref_schedule
from prada_jax import sched
from prada_jax.sched import IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams


_decide = jax.jit(sched.threshold_decide)
_fill = jax.jit(sched.greedy_fill)
_soft = jax.jit(sched.threshold_soft)


def _np_inputs(x):
    return jax.tree.map(np.asarray, x)


def _inputs(rng, c=6, p_cand=0.8, wait_max=4):
    return SchedInputs(
        candidate=jnp.asarray(rng.uniform(size=c) < p_cand),
        gain=jnp.asarray(rng.normal(0.05, 0.1, size=c), jnp.float32),
        delay_s=jnp.asarray(rng.uniform(0.005, 0.2, size=c), jnp.float32),
        bandwidth_hz=jnp.asarray(rng.uniform(1e5, 3e6, size=c), jnp.float32),
        wait_slots=jnp.asarray(rng.integers(0, wait_max, size=c), jnp.int32),
        ctx_tokens=jnp.asarray(rng.integers(10, 500, size=c), jnp.int32),
        snr=jnp.asarray(rng.exponential(10, size=c), jnp.float32),
        draft_prm=jnp.asarray(rng.uniform(size=c), jnp.float32),
        u_rand=jnp.asarray(rng.uniform(size=c), jnp.float32),
        queue_len=jnp.asarray(rng.integers(0, 5), jnp.int32),
        comm_s=jnp.asarray(rng.uniform(0.0, 0.05, size=c), jnp.float32))


def _sp(rng, **kw):
    base = dict(lambda_s=float(rng.uniform(0, 0.05)), mu=float(rng.uniform(0, 2e-8)), beta=0.3,
                tau_s=0.05, num_servers=3, max_wait_slots=3, rsd_threshold=0.7)
    base.update(kw)
    return SchedParams(**{k: jnp.asarray(v) for k, v in base.items()})


def _cands(x):
    x = _np_inputs(x)
    return [dict(i=i, gain=float(x.gain[i]), delay=float(x.delay_s[i]),
                 bw=float(x.bandwidth_hz[i]), wait=int(x.wait_slots[i]),
                 comm=float(x.comm_s[i]), draft_prm=float(x.draft_prm[i]), u=float(x.u_rand[i]))
            for i in range(x.candidate.shape[0]) if bool(x.candidate[i])]


def _cfg(sp, x):
    return dict(lambda_s=float(sp.lambda_s), mu=float(sp.mu), beta=float(sp.beta),
                tau_s=float(sp.tau_s), num_servers=int(sp.num_servers),
                max_wait_slots=int(sp.max_wait_slots), rsd_threshold=float(sp.rsd_threshold),
                queue_len=int(x.queue_len))


def test_threshold_maximises_lagrangian_by_enumeration():
    """With ample resources, the hard rule's decisions maximise Σ_i u_i(d_i) over all 3^C
    decision vectors, u(local)=0, u(queue)=w̄ − p, u(immediate)=w − p with the admission price
    p = λ_s + µ·b, w = ΔQ − β·C (coarse-trained policy: only communication C is added) and
    w̄ = w − β·τ·(1+q) (plain Python)."""
    rng = np.random.default_rng(0)
    for trial in range(30):
        x = _inputs(rng, c=4, p_cand=1.0, wait_max=1)
        sp = _sp(rng, max_wait_slots=100)
        got = np.asarray(_decide(x, jnp.int32(100), jnp.float32(1e12), sp))
        q = int(x.queue_len) / 3
        gain, comm, bw = (np.asarray(a, np.float64) for a in (x.gain, x.comm_s, x.bandwidth_hz))
        lam, mu = float(sp.lambda_s), float(sp.mu)
        best, best_d = -np.inf, None
        for d in itertools.product((LOCAL, QUEUE, IMMEDIATE), repeat=4):
            total = 0.0
            for i, di in enumerate(d):
                w, p = gain[i] - 0.3 * comm[i], lam + mu * bw[i]
                if di == QUEUE:
                    total += w - 0.3 * 0.05 * (1 + q) - p
                elif di == IMMEDIATE:
                    total += w - p
            if total > best + 1e-9:
                best, best_d = total, d
        np.testing.assert_array_equal(got, best_d, err_msg=f"trial {trial}")


@pytest.mark.parametrize("name", sched.SCHEDULER_NAMES)
def test_scheduler_matches_reference_and_is_feasible(name):
    fn = sched.SCHEDULERS[sched.scheduler_index(name)]
    jfn = jax.jit(fn)
    rng = np.random.default_rng(1)
    for trial in range(25):
        x = _inputs(rng, c=7)
        sp = _sp(rng)
        free_u = int(rng.integers(0, 4))
        free_b = float(rng.uniform(0, 6e6))
        got = np.asarray(jfn(x, jnp.int32(free_u), jnp.float32(free_b), sp))
        ref = ref_schedule(name, _cands(x), free_u, free_b, _cfg(sp, x))
        want = np.array([ref.get(i, LOCAL) for i in range(7)])
        x = _np_inputs(x)
        cand = np.asarray(x.candidate)
        np.testing.assert_array_equal(got[cand], want[cand], err_msg=f"{name} trial {trial}")
        imm = (got == IMMEDIATE) & cand
        assert imm.sum() <= free_u
        assert np.asarray(x.bandwidth_hz)[imm].sum() <= free_b * (1 + 1e-6)
        expired = np.asarray(x.wait_slots) >= int(sp.max_wait_slots)
        assert not np.any((got == QUEUE) & expired)


def test_greedy_fill_against_loop_and_exhaustive_bound():
    rng = np.random.default_rng(2)
    for _ in range(40):
        c = 6
        want = rng.uniform(size=c) < 0.7
        bw = rng.uniform(1, 10, size=c).astype(np.float32)
        order = rng.permutation(c).astype(np.int32)
        fu, fb = int(rng.integers(0, 5)), float(rng.uniform(0, 25))
        got = np.asarray(_fill(jnp.asarray(want), jnp.asarray(order), jnp.asarray(bw),
                               jnp.int32(fu), jnp.float32(fb)))
        units, left, ref = fu, fb, np.zeros(c, bool)
        for i in order:
            if want[i] and units >= 1 and bw[i] <= left:
                ref[i], units, left = True, units - 1, left - bw[i]
        np.testing.assert_array_equal(got, ref)
        # Greedy is maximal: no rejected request fits in what is left.
        rest_units, rest_bw = fu - got.sum(), fb - bw[got].sum()
        for i in np.flatnonzero(want & ~got):
            assert not (rest_units >= 1 and bw[i] <= rest_bw + 1e-5)


def test_soft_rule_limits_and_demand():
    rng = np.random.default_rng(3)
    x = _inputs(rng, c=8, p_cand=0.75, wait_max=5)
    sp = _sp(rng)
    probs, du, db = _soft(x, sp, 0.05)
    probs = np.asarray(probs)
    cand = np.asarray(x.candidate)
    np.testing.assert_allclose(probs[cand].sum(-1), 1.0, rtol=1e-6)
    assert np.all(probs[~cand] == 0)
    admit = probs[:, IMMEDIATE] + probs[:, QUEUE]  # the price is charged to every admission
    np.testing.assert_allclose(float(du), admit.sum(), rtol=1e-6)
    np.testing.assert_allclose(float(db), (admit * np.asarray(x.bandwidth_hz)).sum(), rtol=1e-5)
    # T → 0 recovers the hard rule (ample resources, so no repair).
    cold, _, _ = _soft(x, sp, 1e-6)
    hard = np.asarray(_decide(x, jnp.int32(100), jnp.float32(1e12), sp))
    np.testing.assert_array_equal(np.argmax(np.asarray(cold), -1)[cand], hard[cand])
    # Raising the price of a server unit lowers the demand (and the gradient says so).
    g_lam = jax.jit(jax.grad(lambda lam: _soft(x, sp.replace(lambda_s=lam), 0.05)[1]))(
        jnp.float32(0.01))
    assert float(g_lam) < 0
    g_mu = jax.jit(jax.grad(lambda m: _soft(x, sp.replace(mu=m), 0.05)[2]))(jnp.float32(0.0))
    assert float(g_mu) < 0


def test_threshold_rule_temperature_validation():
    rng = np.random.default_rng(4)
    with pytest.raises(ValueError, match="temperature"):
        sched.threshold_rule(_inputs(rng), 1, 1e6, _sp(rng), temperature=-1.0)


def test_scheduler_index_errors():
    with pytest.raises(ValueError, match="scheduler must be one of"):
        sched.scheduler_index("greedy")
    with pytest.raises(ValueError, match="scheduler index"):
        sched.scheduler_index(17)


def test_prefix_admit_and_priority_rank_against_loops():
    rng = np.random.default_rng(5)
    adm = jax.jit(sched.prefix_admit)
    for _ in range(30):
        want = rng.uniform(size=7) < 0.7
        bw = rng.uniform(1, 10, size=7).astype(np.float32)
        fu, fb = int(rng.integers(0, 6)), float(rng.uniform(0, 40))
        got = np.asarray(adm(jnp.asarray(want), jnp.asarray(bw), jnp.int32(fu), jnp.float32(fb)))
        cu, cb, ref = 0, 0.0, np.zeros(7, bool)
        for i in range(7):
            if want[i]:
                cu, cb = cu + 1, cb + bw[i]
                ref[i] = cu <= fu and cb <= fb + 1e-6
        np.testing.assert_array_equal(got, ref)
        assert got.sum() <= fu and bw[got].sum() <= fb + 1e-4
        if want.sum() <= fu and bw[want].sum() <= fb - 1e-4:
            np.testing.assert_array_equal(got, want)
    k1 = rng.integers(0, 3, size=9).astype(np.float32)
    k2 = rng.integers(0, 2, size=9).astype(np.float32)
    rank = np.asarray(sched.priority_rank(jnp.asarray(k1), jnp.asarray(k2)))
    np.testing.assert_array_equal(np.argsort(rank), np.lexsort((np.arange(9), k2, k1)))


def test_large_slot_loop_fill_equals_plain_python_greedy():
    """The fill (vectorised passes, prada_jax.sched.fill) must admit exactly what a plain-Python
    greedy pass in rank order admits, on small and larger slots."""
    import jax
    from prada_jax.sched import base

    rng = np.random.default_rng(7)
    for c in (64, 104):
        want = rng.uniform(size=c) < 0.7
        rank = rng.permutation(c).astype(np.int32)
        bw = rng.uniform(1e5, 2e6, size=c).astype(np.float32)
        units, free_bw = 17, np.float32(1.5e7)
        got = np.asarray(jax.jit(base.greedy_fill_ranked)(want, rank, bw, units, free_bw))
        ref = np.zeros(c, bool)
        left_u, left_b = units, free_bw
        for i in np.argsort(rank):
            if want[i] and left_u >= 1 and bw[i] <= left_b:
                ref[i] = True
                left_u -= 1
                left_b = np.float32(left_b - bw[i])
        np.testing.assert_array_equal(got, ref)
