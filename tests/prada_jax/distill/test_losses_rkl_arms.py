"""The reverse-KL loss arms of issue 44 against independent references: the exact per-token
reverse KL against a NumPy sum over the vocabulary (value and gradient), and the single-sample
estimators' expected gradient, enumerated over every joint sample of a tiny batch, against the
exact KL's gradient (unbiasedness; a baseline that includes the token's own advantage fails)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax.distill import losses


def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _full_export(lt):
    """A top-k export that holds the whole distribution: k = V, tail 0."""
    ids = np.argsort(-lt, axis=-1).astype(np.int32)
    return ids, np.take_along_axis(lt, ids, -1).astype(np.float32), np.zeros(lt.shape[:-1],
                                                                              np.float32)


def test_exact_reverse_kl_equals_numpy_sum_over_vocabulary():
    rng = np.random.default_rng(0)
    B, A, V = 3, 5, 47
    zs = rng.normal(size=(B, A, V)) * 2
    lt = _np_log_softmax(rng.normal(size=(B, A, V)) * 3)
    mask = (rng.random((B, A)) < 0.7).astype(np.int32)
    mask[0, 0] = 1
    ids, tlp, tail = _full_export(lt)
    loss, per = losses.reverse_kl_exact(jnp.asarray(zs, jnp.float32), ids, tlp, tail, mask)
    ls = _np_log_softmax(zs)
    ref = (np.exp(ls) * (ls - lt)).sum(-1)
    np.testing.assert_allclose(np.asarray(per), ref * mask, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(loss), (ref * mask).sum() / mask.sum(), rtol=1e-4)
    # the student equal to the teacher: KL 0
    _, per0 = losses.reverse_kl_exact(jnp.asarray(lt, jnp.float32), ids, tlp, tail, mask)
    np.testing.assert_allclose(np.asarray(per0), 0.0, atol=1e-5)


def test_exact_reverse_kl_gradient_is_the_analytic_one():
    """d KL / d z_j = p_j (log p_j − log q_j − KL) (NumPy), per token, / #masked."""
    rng = np.random.default_rng(1)
    B, A, V = 2, 3, 11
    zs = rng.normal(size=(B, A, V))
    lt = _np_log_softmax(rng.normal(size=(B, A, V)) * 2)
    mask = np.array([[1, 1, 0], [1, 0, 1]], np.int32)
    ids, tlp, tail = _full_export(lt)
    g = jax.grad(lambda z: losses.reverse_kl_exact(z, ids, tlp, tail, mask)[0])(
        jnp.asarray(zs, jnp.float32))
    ls = _np_log_softmax(zs)
    p = np.exp(ls)
    kl = (p * (ls - lt)).sum(-1, keepdims=True)
    ref = p * (ls - lt - kl) * mask[..., None] / mask.sum()
    np.testing.assert_allclose(np.asarray(g), ref, rtol=1e-4, atol=1e-6)


def test_full_teacher_logp_spreads_the_tail_and_is_exact_at_k_equal_v():
    V = 6
    ids = np.array([[[4, 1]]], np.int32)
    tlp = np.log(np.array([[[0.5, 0.3]]], np.float32))
    tail = np.array([[0.2]], np.float32)
    full = np.exp(np.asarray(losses.full_teacher_logp(ids, tlp, tail, V)))[0, 0]
    np.testing.assert_allclose(full, [0.05, 0.3, 0.05, 0.05, 0.5, 0.05], rtol=1e-5)
    # a token the teacher gives 0 costs a finite amount (floor) and a finite gradient
    lt = np.full((1, 1, V), -np.inf)
    lt[..., 2] = 0.0
    ids, tlp, tl = _full_export(np.where(np.isinf(lt), -1e9, lt))
    val, g = jax.value_and_grad(lambda z: losses.reverse_kl_exact(z, ids, tlp, tl,
                                                                  np.ones((1, 1)))[0])(
        jnp.zeros((1, 1, V)))
    assert np.isfinite(float(val)) and np.all(np.isfinite(np.asarray(g)))


def _expected_pg_grad(fn, zs, lt):
    """E over every joint sample (y_1, ..., y_n) of the batch of grad fn (exact enumeration)."""
    n, V = zs.shape
    ls = _np_log_softmax(zs)
    total = np.zeros_like(zs)
    for ys in itertools.product(range(V), repeat=n):
        ys = np.array(ys)
        w = np.prod(np.exp(ls[np.arange(n), ys]))
        sampled = ys[None, :].astype(np.int32)
        tl = lt[np.arange(n), ys][None, :].astype(np.float32)
        g = jax.grad(lambda z: fn(z[None], sampled, tl, np.ones((1, n), np.int32))[0])(
            jnp.asarray(zs, jnp.float32))
        total += w * np.asarray(g, np.float64)
    return total


@pytest.mark.parametrize("name", ["pg", "pg_baseline"])
def test_single_sample_estimators_are_unbiased_for_the_exact_gradient(name):
    rng = np.random.default_rng(2)
    n, V = 3, 3
    zs = rng.normal(size=(n, V))
    lt = _np_log_softmax(rng.normal(size=(n, V)) * 1.5)
    fn = losses.reverse_kl_pg if name == "pg" else losses.reverse_kl_pg_baseline
    got = _expected_pg_grad(fn, zs, lt)
    ids, tlp, tail = _full_export(lt[None])
    exact = jax.grad(lambda z: losses.reverse_kl_exact(z[None], ids, tlp, tail,
                                                       np.ones((1, n)))[0])(
        jnp.asarray(zs, jnp.float32))
    np.testing.assert_allclose(got, np.asarray(exact), atol=2e-5)


def test_a_baseline_that_includes_the_token_itself_would_be_biased():
    """The reference check can fail: the batch mean *with* the token's own advantage gives an
    expected gradient off the exact one (so the leave-one-out form above is what passes)."""
    def with_self(logits, sampled, teacher_logp, mask, coef=1.0):
        lp = losses.token_logprobs(logits, sampled)
        x = jax.lax.stop_gradient(lp - teacher_logp)
        return ((x - x.mean()) * lp).mean(), x

    rng = np.random.default_rng(2)
    n, V = 3, 3
    zs = rng.normal(size=(n, V))
    lt = _np_log_softmax(rng.normal(size=(n, V)) * 1.5)
    got = _expected_pg_grad(with_self, zs, lt)
    ids, tlp, tail = _full_export(lt[None])
    exact = jax.grad(lambda z: losses.reverse_kl_exact(z[None], ids, tlp, tail,
                                                       np.ones((1, n)))[0])(
        jnp.asarray(zs, jnp.float32))
    assert np.abs(got - np.asarray(exact)).max() > 1e-3


def test_baseline_value_is_the_leave_one_out_mean():
    lp_logits = jnp.log(jnp.array([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]], jnp.float32))
    sampled = np.array([[0, 1, 0]], np.int32)
    tl = np.log(np.array([[0.4, 0.5, 0.6]], np.float32))
    mask = np.array([[1, 1, 0]], np.int32)
    x = np.log([0.5, 0.75]) - np.log([0.4, 0.5])
    b = np.array([x[1], x[0]])
    # d loss / d log π(y_i) = (x_i − b_i) / 2 on the masked tokens: check via the loss value
    loss, est = losses.reverse_kl_pg_baseline(lp_logits, sampled, tl, mask)
    lp = np.log([0.5, 0.75])
    np.testing.assert_allclose(float(loss), ((x - b) * lp).sum() / 2, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(est)[0, :2], x, rtol=1e-5)
    assert float(np.asarray(est)[0, 2]) == 0.0


def test_train_step_exact_arm_logs_the_exact_kl_and_lowers_it():
    from flax import nnx

    from prada_jax.distill.learner import init_state, make_optimizer, make_train_step
    from prada_jax.lm.config import LMConfig
    from prada_jax.lm.model import CausalLM
    V, B, P, A = 12, 4, 5, 3
    cfg = LMConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    model = CausalLM(cfg, rngs=nnx.Rngs(params=0), dtype=jnp.float32)
    rng = np.random.default_rng(3)
    lt = _np_log_softmax(rng.normal(size=(B, A, V)) * 3)
    ids, tlp, tail = _full_export(lt)
    batch = dict(prompt=rng.integers(2, V, (B, P)).astype(np.int32),
                 prompt_mask=np.ones((B, P), np.int32),
                 action=rng.integers(2, V, (B, A)).astype(np.int32),
                 action_valid=np.ones((B, A), np.int32), action_mask=np.ones((B, A), np.int32),
                 turn=np.arange(B, dtype=np.int32) % 2, teacher_logp=np.zeros((B, A),
                                                                             np.float32),
                 topk_ids=ids, topk_logp=tlp, tail_mass=tail)
    tx = make_optimizer(3e-2, 1, 50, 0.0, 1e9, grad_accum=1)
    gd, st = init_state(model, tx, jax.random.key(0))
    with pytest.raises(ValueError, match="rkl_estimator"):
        make_train_step(gd, tx, "onpolicy", "rkl", rkl_estimator="nope")
    step = make_train_step(gd, tx, "onpolicy", "rkl", num_turns=2, rkl_estimator="exact")
    kls = []
    for _ in range(15):
        st, m = step(st, batch)
        assert abs(float(m["loss"]) - float(m["kl"])) < 1e-5   # the logged KL is the exact one
        kls.append(float(m["kl"]))
    assert kls[-1] < 0.5 * kls[0]


def test_trainer_refuses_an_unknown_arm_and_an_exact_arm_without_the_whole_vocabulary(
        tmp_path):
    """The config checks name the field; the exact arm with top_k below the vocabulary is
    refused before anything is written."""
    pytest.importorskip("torch")
    from prada_jax import config_utils as cu
    from prada_jax.configs.distill import get_config
    from prada_jax.distill import trainer, validation
    from prada_jax.distill.task.teacher import tiny_cache
    cache = tiny_cache(tmp_path / "cache")
    c = get_config("smoke,onpolicy")
    c.data.cache = str(cache)
    c.eval.n_problems = 0
    c.loss.rkl_estimator = "bogus"
    with pytest.raises(cu.ConfigError, match="loss.rkl_estimator"):
        validation.validate_config(c)
    c.loss.rkl_estimator = "exact"
    c.loss.top_k = 4
    with pytest.raises(cu.ConfigError, match="loss.top_k"):
        trainer.build_setup(c)
    c.loss.top_k = 64
    setup = trainer.build_setup(c)            # the whole vocabulary: accepted
    assert setup.step_fn is not None
