"""PPO loss against a NumPy transcription on fixed random inputs; network helpers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax.rl import losses, networks


def _np_loss(logits, q, a, old_logp, old_q, adv, ret, mask, cfg):
    m = mask.astype(np.float64)
    n = max(m.sum(), 1.0)
    mmean = lambda x: float((x * m).sum() / n)  # noqa: E731
    z = logits - logits.max(axis=1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p = np.exp(logp_all)
    logp = logp_all[np.arange(len(a)), a]
    ent = -(p * logp_all).sum(axis=1)
    ratio = np.exp(logp - old_logp)
    if cfg.normalize_adv:
        mu = mmean(adv)
        sd = np.sqrt(mmean((adv - mu) ** 2))
        adv = (adv - mu) / (sd + 1e-8)
    pg = -mmean(np.minimum(ratio * adv, np.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv))
    qa = q[np.arange(len(a)), a]
    err = (qa - ret) ** 2
    if cfg.clip_value:
        qc = old_q + np.clip(qa - old_q, -cfg.value_clip_eps, cfg.value_clip_eps)
        err = np.maximum(err, (qc - ret) ** 2)
    vl = 0.5 * mmean(err)
    e = mmean(ent)
    total = pg + cfg.vf_coef * vl - cfg.ent_coef * e
    kl = mmean(ratio - 1 - np.log(ratio))
    cf = mmean((np.abs(ratio - 1) > cfg.clip_eps).astype(float))
    return dict(total_loss=total, policy_loss=pg, value_loss=vl, entropy=e, approx_kl=kl,
                clip_frac=cf)


@pytest.mark.parametrize("cfg", [
    losses.PPOLossConfig(),
    losses.PPOLossConfig(clip_eps=0.1, vf_coef=1.0, ent_coef=0.05, clip_value=False,
                         normalize_adv=False),
    losses.PPOLossConfig(clip_eps=0.3, value_clip_eps=0.05),
], ids=["default", "noclip_nonorm", "tight_value_clip"])
def test_ppo_loss_matches_numpy(cfg):
    rng = np.random.default_rng(0)
    B = 37
    logits = rng.normal(size=(B, 2)).astype(np.float32) * 2
    q = rng.normal(size=(B, 2)).astype(np.float32)
    a = rng.integers(0, 2, size=B)
    # old log-probs near the new ones so some ratios clip and some do not
    z = logits - logits.max(1, keepdims=True)
    cur = (z - np.log(np.exp(z).sum(1, keepdims=True)))[np.arange(B), a]
    old_logp = (cur + rng.normal(scale=0.3, size=B)).astype(np.float32)
    old_q = (q[np.arange(B), a] + rng.normal(scale=0.3, size=B)).astype(np.float32)
    adv = rng.normal(size=B).astype(np.float32)
    ret = rng.normal(size=B).astype(np.float32)
    mask = rng.random(B) < 0.7
    total, metrics = jax.jit(losses.ppo_loss, static_argnums=8)(
        logits, q, a, old_logp, old_q, adv, ret, mask, cfg)
    ref = _np_loss(logits.astype(np.float64), q.astype(np.float64), a, old_logp, old_q,
                   adv.astype(np.float64), ret, mask, cfg)
    assert 0 < ref["clip_frac"] < 1
    for k, want in ref.items():
        np.testing.assert_allclose(float(metrics[k]), want, rtol=2e-5, atol=2e-6, err_msg=k)
    np.testing.assert_allclose(float(total), ref["total_loss"], rtol=2e-5, atol=2e-6)


def test_masked_samples_do_not_matter():
    rng = np.random.default_rng(1)
    B = 16
    args = [rng.normal(size=(B, 2)), rng.normal(size=(B, 2)), rng.integers(0, 2, B),
            rng.normal(size=B), rng.normal(size=B), rng.normal(size=B), rng.normal(size=B)]
    args = [jnp.asarray(x, jnp.float32) if x.dtype.kind == "f" else jnp.asarray(x) for x in args]
    mask = jnp.arange(B) < 10
    cfg = losses.PPOLossConfig()
    loss = jax.jit(losses.ppo_loss, static_argnums=8)   # eager: every op compiles on its own
    base, _ = loss(*args, mask, cfg)
    perturbed = [x.at[10:].set(x[10:] * 3 + 1) if x.dtype == jnp.float32 else x for x in args]
    other, _ = loss(*perturbed, mask, cfg)
    np.testing.assert_allclose(float(base), float(other), rtol=1e-6)


def test_network_shapes_value_and_advantage():
    graphdef, params = networks.init_network(jax.random.key(0), obs_dim=5, hidden=(16, 16))
    apply_fn = jax.jit(networks.make_apply_fn(graphdef))   # eager: every op compiles alone
    obs = jnp.asarray(np.random.default_rng(1).normal(size=(3, 7, 5)), jnp.float32)
    logits, q = apply_fn(params, obs)
    assert logits.shape == (3, 7, 2) and q.shape == (3, 7, 2)
    p = np.asarray(jax.nn.softmax(logits))
    np.testing.assert_allclose(np.asarray(jax.jit(networks.value_from_q)(logits, q)),
                               (p * np.asarray(q)).sum(-1), rtol=1e-5, atol=1e-6)
    gain = jax.jit(networks.make_advantage_fn(graphdef))(params, obs[0])
    np.testing.assert_allclose(np.asarray(gain), np.asarray(q[0, :, 1] - q[0, :, 0]), atol=1e-6)
    assert networks.count_params(params) == (5 * 16 + 16 + 16 * 16 + 16) * 2 + 2 * (16 * 2 + 2)
