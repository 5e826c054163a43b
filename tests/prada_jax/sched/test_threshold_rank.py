"""The threshold rule's repair ranks by one stable sort (``fill.sorted_rank``) above
``threshold.SORT_ABOVE`` candidates and by C² comparisons below: on random slots full of exact
ties the decisions (default, forced sort, forced pairwise) equal the pairwise form rebuilt here
from the same pieces (the rule before the change) and a plain-Python greedy written here on
values (priced gain, wait cost, liveness) computed here from the definitions."""
import jax
import jax.numpy as jnp
import numpy as np

from prada_jax import sched
from prada_jax.sched import IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams
from prada_jax.sched import base, fill, threshold


def _pairwise_rule(x, free_units, free_bw_hz, sp):
    """The rule as it was before the sort: same pieces, pairwise rank."""
    g, c, live = threshold._priced(x, sp)
    want_imm = threshold.hard_choice(g, c, live) == IMMEDIATE
    queue_ok = (g - c) > 0
    lost = jnp.where(queue_ok, c, g)
    rank = base.priority_rank(jnp.where(want_imm, -lost, jnp.inf),
                              jnp.where(want_imm, -g, jnp.inf))
    admitted = base.greedy_fill_ranked(want_imm, rank, x.bandwidth_hz, free_units, free_bw_hz)
    queue = live & ~admitted & queue_ok
    return jnp.where(admitted, IMMEDIATE, jnp.where(queue, QUEUE, LOCAL)).astype(jnp.int8)


_new = jax.jit(sched.threshold_decide)
_sorted = jax.jit(lambda x, fu, fb, sp: sched.threshold_decide(x, fu, fb, sp, fill.sorted_rank))
_old = jax.jit(_pairwise_rule)


def _tied_slot(rng, c):
    """Candidates drawn from a few exact values, so many are equal in g, lost and b."""
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return SchedInputs(
        candidate=jnp.asarray(rng.uniform(size=c) < 0.85),
        gain=f32(rng.choice([-0.05, 0.0, 0.02, 0.05, 0.1, 0.25], size=c)),
        delay_s=f32(rng.choice([0.1, 0.2], size=c)),
        bandwidth_hz=f32(rng.choice([1e6, 2e6, 3e6], size=c)),
        wait_slots=jnp.asarray(rng.integers(0, 4, size=c), jnp.int32),
        ctx_tokens=jnp.full(c, 100, jnp.int32), snr=jnp.ones(c, jnp.float32),
        draft_prm=f32(rng.uniform(size=c)), u_rand=f32(rng.uniform(size=c)),
        queue_len=jnp.asarray(rng.integers(0, 6), jnp.int32),
        comm_s=f32(rng.choice([0.0, 0.05], size=c)))


def _sp(rng):
    return SchedParams(**{k: jnp.asarray(v) for k, v in dict(
        lambda_s=float(rng.choice([0.0, 0.01, 0.05])), mu=float(rng.choice([0.0, 1e-8])),
        beta=0.2, tau_s=0.05, num_servers=2, max_wait_slots=3, rsd_threshold=0.7).items()})


def _priced_numpy(x, sp):
    """g, c, live written out from docs/dual.md's definitions in float32 NumPy (not taken from
    the code under test): w = gain − β·comm (the coarse reward did not charge communication),
    g = w − λ_s − µ·b, c = β·τ·(1 + queue_len / M), live = candidate and waited < max."""
    f = np.float32
    beta, tau = f(np.asarray(sp.beta)), f(np.asarray(sp.tau_s))
    assert not bool(np.asarray(sp.policy_true_reward))
    w = np.asarray(x.gain, f) - beta * np.asarray(x.comm_s, f)
    g = w - (f(np.asarray(sp.lambda_s)) + f(np.asarray(sp.mu)) * np.asarray(x.bandwidth_hz, f))
    c = beta * tau * (f(1.0) + f(int(x.queue_len)) / f(int(np.asarray(sp.num_servers))))
    live = np.asarray(x.candidate) & (np.asarray(x.wait_slots) < int(np.asarray(sp.max_wait_slots)))
    return g, f(c), live


def _python_rule(x, free_units, free_bw, sp):
    """Plain-Python greedy from the module docstring on values computed here
    (:func:`_priced_numpy`): run-now wanters by (lost desc, g desc, slot asc)."""
    g, c, live = _priced_numpy(x, sp)
    n = g.shape[0]
    want = [i for i in range(n) if live[i] and g[i] >= max(g[i] - c, np.float32(0))]
    lost = {i: (c if g[i] - c > 0 else g[i]) for i in want}
    order = sorted(want, key=lambda i: (-lost[i], -g[i], i))
    units, bw = int(free_units), float(free_bw)
    b = np.asarray(x.bandwidth_hz, np.float64)
    d = np.full(n, LOCAL, np.int8)
    for i in order:
        if units >= 1 and b[i] <= bw:
            d[i], units, bw = IMMEDIATE, units - 1, bw - b[i]
    for i in range(n):
        if d[i] != IMMEDIATE and live[i] and g[i] - c > 0:
            d[i] = QUEUE
    return d


def test_sorted_rank_rule_equals_pairwise_rule_and_python_greedy_on_tied_slots():
    rng = np.random.default_rng(11)
    assert 64 <= threshold.SORT_ABOVE < 200  # both paths of the default are covered below
    for c in (7, 64, 200):
        n_tied = 0
        for _ in range(40):
            x = _tied_slot(rng, c)
            sp = _sp(rng)
            fu = jnp.int32(rng.integers(0, 6))
            fb = jnp.float32(rng.choice([2e6, 5e6, 9e6, 1e9]))
            new = np.asarray(_new(x, fu, fb, sp))
            np.testing.assert_array_equal(new, np.asarray(_old(x, fu, fb, sp)))
            np.testing.assert_array_equal(new, np.asarray(_sorted(x, fu, fb, sp)))
            np.testing.assert_array_equal(new, _python_rule(x, fu, fb, sp))
            g = _priced_numpy(x, sp)[0]
            n_tied += len(g) - len(np.unique(g))
        assert n_tied >= 40  # the slots do exercise ties (≥ one repeated g per slot on average)


def test_ties_go_to_the_lower_user_slot():
    """Four identical requests, room for two: slots 0 and 1 run now, 2 and 3 queue."""
    f32 = lambda v: jnp.full(4, v, jnp.float32)  # noqa: E731
    x = SchedInputs(candidate=jnp.ones(4, bool), gain=f32(0.3), delay_s=f32(0.1),
                    bandwidth_hz=f32(1e6), wait_slots=jnp.zeros(4, jnp.int32),
                    ctx_tokens=jnp.full(4, 100, jnp.int32), snr=f32(1.0), draft_prm=f32(0.5),
                    u_rand=f32(0.5), queue_len=jnp.int32(0), comm_s=f32(0.0))
    sp = SchedParams(num_servers=jnp.asarray(2), max_wait_slots=jnp.asarray(3))
    for fn in (_new, _sorted, _old):
        d = np.asarray(fn(x, jnp.int32(2), jnp.float32(1e9), sp))
        np.testing.assert_array_equal(d, [IMMEDIATE, IMMEDIATE, QUEUE, QUEUE])
