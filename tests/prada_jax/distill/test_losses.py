"""Losses against NumPy/SciPy references; finite gradients; unbiased reverse-KL estimator."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from scipy.spatial import distance

from prada_jax.distill import losses as L

B, A, V, K = 2, 3, 11, 4


def _data(seed=0, tail_zero=False):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (B, A, V)).astype(np.float32)
    t_logits = rng.normal(0, 2, (B, A, V))
    t_logp = t_logits - special.logsumexp(t_logits, -1, keepdims=True)
    ids = np.argsort(-t_logp, -1)[..., :K].astype(np.int32)
    top = np.take_along_axis(t_logp, ids, -1)
    tail = 1 - np.exp(top).sum(-1)
    if tail_zero:
        top = top - special.logsumexp(top, -1, keepdims=True)
        tail = np.zeros_like(tail)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    return logits, ids, top.astype(np.float32), tail.astype(np.float32), mask, t_logp


def _ref_buckets(logits, ids, top, tail, tau):
    """Plain loops: bucket distributions (student, teacher) for one position."""
    z = logits / tau
    s = np.exp(z - special.logsumexp(z))
    s_b = [s[i] for i in ids] + [1 - sum(s[i] for i in ids)]
    t_b = np.array([np.exp(x / tau) for x in top] + [tail ** (1 / tau)])
    return np.array(s_b), t_b / t_b.sum()


@pytest.mark.parametrize("tau", [1.0, 2.0, 0.5], ids=["t1", "t2", "t0.5"])
@pytest.mark.parametrize("tail_zero", [False, True], ids=["tail", "notail"])
def test_forward_kl_matches_numpy(tau, tail_zero):
    logits, ids, top, tail, mask, _ = _data(1, tail_zero)
    loss, per = jax.jit(L.forward_kl_topk, static_argnames="temperature")(
        logits, ids, top, tail, mask, temperature=tau)
    ref = np.zeros((B, A))
    for b in range(B):
        for a in range(A):
            s_b, t_b = _ref_buckets(logits[b, a], ids[b, a], top[b, a], tail[b, a], tau)
            ref[b, a] = special.rel_entr(t_b, s_b).sum() * mask[b, a]
    np.testing.assert_allclose(per, ref, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(loss, ref.sum() / mask.sum(), rtol=2e-4, atol=1e-5)


def test_forward_kl_full_vocab_equals_exact_kl():
    """k = V, tail 0: the bucket KL is the exact KL(teacher || student) (scipy.stats.entropy)."""
    from scipy.stats import entropy
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(1, 2, V)).astype(np.float32)
    t = rng.dirichlet(np.ones(V), size=(1, 2))
    ids = np.broadcast_to(np.arange(V, dtype=np.int32), (1, 2, V))
    _, per = jax.jit(L.forward_kl_topk)(logits, ids, np.log(t).astype(np.float32),
                                        np.zeros((1, 2), np.float32), np.ones((1, 2)))
    s = special.softmax(logits, -1)
    np.testing.assert_allclose(per[0], [entropy(t[0, i], s[0, i]) for i in range(2)],
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("beta", [0.5, 0.2])
def test_jsd_matches_numpy(beta):
    logits, ids, top, tail, mask, _ = _data(2)
    jsd = jax.jit(L.generalized_jsd_topk, static_argnames=("beta", "include_tail"))
    _, per = jsd(logits, ids, top, tail, mask, beta=beta)
    _, per_nt = jsd(logits, ids, top, tail, mask, beta=beta, include_tail=False)
    for b in range(B):
        for a in range(A):
            if not mask[b, a]:
                assert per[b, a] == 0
                continue
            s_b, t_b = _ref_buckets(logits[b, a], ids[b, a], top[b, a], tail[b, a], 1.0)
            for got, (p, q) in [(per[b, a], (t_b, s_b)),
                                (per_nt[b, a], (t_b[:-1] / t_b[:-1].sum(),
                                                s_b[:-1] / s_b[:-1].sum()))]:
                m = beta * p + (1 - beta) * q
                ref = beta * special.rel_entr(p, m).sum() + \
                    (1 - beta) * special.rel_entr(q, m).sum()
                np.testing.assert_allclose(got, ref, rtol=2e-4, atol=1e-6)
                if beta == 0.5:  # scipy's JS distance is sqrt(JSD), natural log
                    np.testing.assert_allclose(np.sqrt(got), distance.jensenshannon(p, q),
                                               rtol=2e-4, atol=1e-5)
    with pytest.raises(ValueError, match="beta"):
        L.generalized_jsd_topk(logits, ids, top, tail, mask, beta=1.0)


def test_sft_and_token_logprobs():
    logits, *_ , mask, _ = _data(4)
    tgt = np.random.default_rng(0).integers(0, V, (B, A)).astype(np.int32)
    loss, per = jax.jit(L.sft_cross_entropy)(logits, tgt, mask)
    lp = logits - special.logsumexp(logits, -1, keepdims=True)
    ref = -np.take_along_axis(lp, tgt[..., None], -1)[..., 0] * mask
    np.testing.assert_allclose(per, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, ref.sum() / mask.sum(), rtol=1e-5)


def test_finite_gradients_at_extreme_logits():
    logits, ids, top, tail, mask, _ = _data(5)
    extreme = logits * 1e4  # ±1e4-scale logits: near one-hot students
    extreme[0, 0, :] = -1e4
    extreme[0, 0, 3] = 1e4
    tgt = ids[..., 0]
    fns = [
        lambda x: L.forward_kl_topk(x, ids, top, tail, mask, temperature=2.0)[0],
        lambda x: L.forward_kl_topk(x, ids, top, np.zeros_like(tail), mask)[0],
        lambda x: L.generalized_jsd_topk(x, ids, top, tail, mask, 0.3)[0],
        lambda x: L.reverse_kl_pg(x, tgt, top[..., 0], mask)[0],
        lambda x: L.sft_cross_entropy(x, tgt, mask)[0],
    ]
    all_losses = jax.jit(lambda x: jnp.stack([f(x) for f in fns]))
    for x in (extreme, extreme.astype(jnp.bfloat16)):
        v = all_losses(jnp.asarray(x))
        g = jax.jit(jax.jacrev(all_losses))(jnp.asarray(x, jnp.float32))  # [5, B, A, V]
        assert np.all(np.isfinite(np.asarray(v, np.float32))), v
        assert np.all(np.isfinite(np.asarray(g, np.float32))), "non-finite gradient"


def test_reverse_kl_estimator_unbiased_monte_carlo():
    """Small categorical: MC mean of the estimate → KL(s||t); MC mean of the PG gradient →
    the exact gradient of KL(s||t) w.r.t. the student logits."""
    rng = np.random.default_rng(0)
    Vs = 5
    z = rng.normal(size=Vs).astype(np.float32)
    t_logp = np.log(rng.dirichlet(np.ones(Vs))).astype(np.float32)
    s = special.softmax(z)
    exact_kl = float(np.sum(s * (np.log(s) - t_logp)))
    # d/dz_i KL(s||t) = s_i·(log s_i − log t_i − KL), in NumPy (float64)
    exact_grad = s * (np.log(s) - t_logp - exact_kl)
    n = 200_000
    y = rng.choice(Vs, size=n, p=s).astype(np.int32)
    logits = jnp.broadcast_to(jnp.asarray(z), (1, n, Vs))
    f = lambda x: L.reverse_kl_pg(x, y[None], t_logp[y][None], jnp.ones((1, n)))[0]
    est = jax.jit(L.reverse_kl_pg)(logits, y[None], t_logp[y][None], jnp.ones((1, n)))[1]
    g = jax.jit(jax.grad(lambda zz: f(jnp.broadcast_to(zz, (1, n, Vs)))))(jnp.asarray(z))
    se = np.std(np.asarray(est)) / np.sqrt(n)
    assert abs(float(np.mean(est)) - exact_kl) < 4 * se
    np.testing.assert_allclose(g, exact_grad, atol=0.01)
