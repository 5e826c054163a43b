"""Masked per-user GAE against a NumPy decision-list reference and the λ=1 closed form."""
import jax
import numpy as np
import pytest

from prada_jax.rl.gae import masked_gae


def _reference_gae(r, v, m, term, trunc, nv, last_v, gamma, lam):
    """Plain Python: collect each user column's decisions forward, then a backward loop."""
    T, B = r.shape
    adv = np.zeros((T, B))
    for b in range(B):
        records, cur = [], None
        for t in range(T):
            if m[t, b]:
                cur = {"t": t, "v": v[t, b], "R": 0.0, "end": None, "boot": 0.0}
                records.append(cur)
            if cur is not None:
                cur["R"] += r[t, b]
                if term[t, b]:
                    cur["end"] = "term"
                    cur = None
                elif trunc[t, b]:
                    cur["end"], cur["boot"] = "trunc", nv[t, b]
                    cur = None
            elif term[t, b] or trunc[t, b]:
                pass  # rewards of an episode that made no decision in this rollout: dropped
        next_adv = 0.0
        for i in reversed(range(len(records))):
            rec = records[i]
            if rec["end"] == "term":
                boot, next_adv = 0.0, 0.0
            elif rec["end"] == "trunc":
                boot, next_adv = rec["boot"], 0.0
            elif i + 1 < len(records):
                boot = records[i + 1]["v"]
            else:
                boot, next_adv = last_v[b], 0.0
            a = rec["R"] + gamma * boot - rec["v"] + gamma * lam * next_adv
            adv[rec["t"], b] = a
            next_adv = a
    return adv


# One jitted GAE for every case: γ and λ are traced arguments (not static), so the parametrized
# cases of one shape share a program; eagerly, every op would compile on its own.
_gae = jax.jit(masked_gae)


def _inputs(seed, T=14, B=6, p_dec=0.5, p_term=0.12, p_trunc=0.06):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(T, B)).astype(np.float32)
    v = rng.normal(size=(T, B)).astype(np.float32)
    m = rng.random((T, B)) < p_dec
    term = rng.random((T, B)) < p_term
    trunc = (rng.random((T, B)) < p_trunc) & ~term
    nv = rng.normal(size=(T, B)).astype(np.float32)
    last_v = rng.normal(size=B).astype(np.float32)
    return r, v, m, term, trunc, nv, last_v


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (1.0, 1.0), (0.7, 0.5)],
                         ids=["g099_l095", "lam0", "g1_l1", "g07_l05"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_gae_matches_numpy_loop(seed, gamma, lam):
    r, v, m, term, trunc, nv, last_v = _inputs(seed)
    adv, ret = _gae(r, v, m, term, trunc, nv, last_v, gamma, lam)
    ref = _reference_gae(r, v, m, term, trunc, nv, last_v, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), np.where(m, ref + v, 0.0), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(adv)[~m] == 0)


def test_lambda_one_gamma_one_is_return_to_episode_end_minus_value():
    """Closed form: with γ = λ = 1 the advantage of a decision at slot t is the sum of rewards
    from t to the end of its episode (termination, truncation or rollout end) plus the
    bootstrap there (0, next value, last value) minus V(s_t)."""
    r, v, m, term, trunc, nv, last_v = _inputs(5, T=20, B=5)
    adv = np.asarray(_gae(r, v, m, term, trunc, nv, last_v, 1.0, 1.0)[0])
    T, B = r.shape
    for b in range(B):
        for t in np.flatnonzero(m[:, b]):
            ends = np.flatnonzero(term[t:, b] | trunc[t:, b])
            if ends.size:
                e = t + ends[0]
                boot = 0.0 if term[e, b] else nv[e, b]
            else:
                e, boot = T - 1, last_v[b]
            expected = r[t:e + 1, b].sum() + boot - v[t, b]
            np.testing.assert_allclose(float(adv[t, b]), expected, rtol=1e-5, atol=1e-5)


def test_lambda_zero_is_one_step_td_on_dense_decisions():
    """Closed form: every slot a decision, no episode ends: δ_t = r_t + γ V_{t+1} − V_t."""
    rng = np.random.default_rng(3)
    T, B, gamma = 9, 4, 0.9
    r, v = rng.normal(size=(T, B)), rng.normal(size=(T, B))
    last_v = rng.normal(size=B)
    z = np.zeros((T, B), bool)
    adv, _ = _gae(r, v, ~z, z, z, np.zeros((T, B)), last_v, gamma, 0.0)
    v_next = np.concatenate([v[1:], last_v[None]])
    np.testing.assert_allclose(np.asarray(adv), r + gamma * v_next - v, rtol=1e-5, atol=1e-5)


def test_batch_axes_are_independent():
    r, v, m, term, trunc, nv, last_v = _inputs(7, T=10, B=6)
    adv, _ = _gae(r, v, m, term, trunc, nv, last_v, 0.95, 0.9)
    adv3, _ = _gae(r.reshape(10, 2, 3), v.reshape(10, 2, 3), m.reshape(10, 2, 3),
                         term.reshape(10, 2, 3), trunc.reshape(10, 2, 3), nv.reshape(10, 2, 3),
                         last_v.reshape(2, 3), 0.95, 0.9)
    np.testing.assert_allclose(np.asarray(adv3).reshape(10, 6), np.asarray(adv), atol=1e-6)
