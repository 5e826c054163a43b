"""prada_jax.dual: threshold rule = Lagrangian maximiser, relaxation, closed-form convergence."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax import dual
from prada_jax.sched import oracle


def _uniform_batch(key, slots, n, free_units, free_bw=1e12, b=None, load=None):
    w = jax.random.uniform(key, (slots, n))
    b = jnp.zeros((slots, n)) if b is None else b
    return dual.make_batch(w, -jnp.ones((slots, n)), b, jnp.ones((slots, n), bool),
                           jnp.broadcast_to(jnp.asarray(free_units, jnp.float32), (slots,)),
                           jnp.full((slots,), free_bw), load=load)


def _train(cfg, batch_fn, steps, seed=0):
    state = dual.init(cfg)

    def body(state, key):
        _, state = dual.update(state, batch_fn(key), cfg)
        return state, None

    keys = jax.random.split(jax.random.key(seed), steps)
    state, _ = jax.jit(lambda s, k: jax.lax.scan(body, s, k))(state, keys)
    return state


def test_hard_rule_is_lagrangian_maximiser_by_enumeration():
    rng = np.random.default_rng(0)
    hard = jax.jit(dual.hard_decision)
    for trial in range(60):
        n = int(rng.integers(1, 8))
        w = rng.normal(0, 1, n).astype(np.float32)
        w_bar = (w - rng.uniform(-0.2, 1.5, n)).astype(np.float32)
        b = rng.uniform(0.1e6, 3e6, n).astype(np.float32)
        valid = rng.uniform(size=n) < 0.9
        lam, mu = float(rng.uniform(0, 1)), float(rng.uniform(0, 0.3e-6))
        got = np.asarray(hard(w, w_bar, b, lam, mu, valid))
        want, best = oracle.enumerate_lagrangian(w, w_bar, b, lam, mu, valid)
        # Same value (the maximiser is unique away from exact ties, and then identical).
        value = oracle.slot_value(got, w - lam - mu * b, w_bar)
        np.testing.assert_allclose(value, best, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")


def test_soft_decision_tends_to_hard_and_sums_to_one():
    key = jax.random.key(1)
    w = jax.random.normal(key, (5, 9))
    w_bar = w - jax.random.uniform(jax.random.key(2), (5, 9), maxval=1.5)
    b = jnp.full((5, 9), 1e6)
    valid = jax.random.uniform(jax.random.key(3), (5, 9)) < 0.8
    p = dual.soft_decision(w, w_bar, b, 0.3, 0.1e-6, 1e-4, valid)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
    hard = dual.hard_decision(w, w_bar, b, 0.3, 0.1e-6, valid)
    np.testing.assert_array_equal(jnp.argmax(p, -1), hard)


def test_relaxed_dual_gradient_is_minus_soft_excess():
    """dD_T/dλ = mean(free − Σ p_imm), dD_T/dµ_scaled = mean(free_bw − Σ b p_imm) (scaled)."""
    cfg = dual.DualConfig(mode="differentiable", init_lambda_s=0.4, init_mu=0.2)
    state = dual.init(cfg)
    key = jax.random.key(4)
    batch = _uniform_batch(key, 6, 10, 3.0, free_bw=4e6,
                           b=jax.random.uniform(key, (6, 10), minval=0.2e6, maxval=1e6))
    temp = 0.2
    g = jax.grad(dual.dual_objective)(state.params, batch, cfg, temp)["raw"]
    m = jax.nn.softplus(state.params["raw"])
    p = dual.soft_decision(batch.w, batch.w_bar, batch.b, m[0], m[1] / 1e6, temp)[..., 2]
    d_lam = np.mean(np.asarray(batch.free_units) - np.asarray(p).sum(-1))
    d_mu = np.mean((np.asarray(batch.free_bw) - (np.asarray(p) * np.asarray(batch.b)).sum(-1))
                   / 1e6)
    sig = np.asarray(jax.nn.sigmoid(state.params["raw"]))  # d softplus / d raw
    np.testing.assert_allclose(np.asarray(g), [d_lam * sig[0], d_mu * sig[1]], rtol=1e-4,
                               atol=1e-5)


def _identical_batch(slots, n, w, free_units, free_bw=1e12, b=0.0):
    return dual.make_batch(jnp.full((slots, n), w), jnp.full((slots, n), -1.0),
                           jnp.full((slots, n), b), jnp.ones((slots, n), bool),
                           jnp.full((slots,), free_units), jnp.full((slots,), free_bw))


def test_closed_form_identical_candidates_differentiable():
    """N identical candidates worth w, M < N units: D(λ) = N·max(0, w−λ) + λM, λ* = w."""
    cfg = dual.DualConfig(mode="differentiable", learning_rate=0.05, temperature=0.3,
                          temperature_min=0.003, anneal_steps=500)
    batch = _identical_batch(2, 8, 1.3, 3.0)
    state = _train(cfg, lambda k: batch, 800)
    m = dual.multipliers(state, cfg)
    np.testing.assert_allclose(float(m.lambda_s), 1.3, rtol=0.01)
    assert float(m.mu) * 1e6 < 0.01  # bandwidth never binds


def test_closed_form_bandwidth_only():
    """Identical candidates needing b = 2 MHz, free bw 5 MHz, units plenty: µ*·b = w."""
    cfg = dual.DualConfig(mode="differentiable", learning_rate=0.05, temperature=0.3,
                          temperature_min=0.003, anneal_steps=500)
    batch = _identical_batch(2, 8, 0.8, 100.0, free_bw=5e6, b=2e6)
    state = _train(cfg, lambda k: batch, 800)
    m = dual.multipliers(state, cfg)
    np.testing.assert_allclose(float(m.mu) * 2e6, 0.8, rtol=0.01)
    assert float(m.lambda_s) < 0.01


@pytest.mark.parametrize("mode", ["subgradient", "differentiable"])
def test_closed_form_uniform_candidates(mode):
    """w ~ U(0,1) i.i.d., N per slot, M units: E[#{w > λ}] = M  ⇒  λ* = 1 − M/N."""
    cfg = dual.DualConfig(mode=mode, step_size=0.05, decay_steps=10, learning_rate=0.02,
                          temperature=0.3, temperature_min=0.003, anneal_steps=500)
    state = _train(cfg, lambda k: _uniform_batch(k, 64, 32, 8.0), 800)
    np.testing.assert_allclose(float(dual.multipliers(state, cfg).lambda_s), 0.75, rtol=0.01)


@pytest.mark.parametrize("mode", ["subgradient", "pid", "differentiable"])
def test_oversubscription_rises_light_load_goes_to_zero(mode):
    cfg = dual.DualConfig(mode=mode, init_lambda_s=0.3, init_mu=0.3, step_size=0.05,
                          decay_steps=20, kp=0.02, ki=0.01, learning_rate=0.05,
                          temperature=0.2, temperature_min=0.005, anneal_steps=300)
    b = jnp.full((32, 16), 1e6)
    # Heavy: 16 candidates, 2 units, 8 MHz → units bind.
    heavy = _train(cfg, lambda k: _uniform_batch(k, 32, 16, 2.0, 8e6, b), 600)
    m = dual.multipliers(heavy, cfg)
    assert float(m.lambda_s) > 0.7
    e = dual.metrics(heavy, _uniform_batch(jax.random.key(9), 512, 16, 2.0, 8e6,
                                           jnp.full((512, 16), 1e6)), cfg)
    assert abs(float(e["dual/excess_units"])) < 0.15  # ≈ 0 before repair (mean over slots)
    # Light: 16 candidates, 32 units and 64 MHz → nothing binds, both multipliers → 0.
    light = _train(cfg, lambda k: _uniform_batch(k, 32, 16, 32.0, 64e6, b), 600)
    m = dual.multipliers(light, cfg)
    assert float(m.lambda_s) < 0.01 and float(m.mu) * 1e6 < 0.01


def test_conditioned_multipliers_follow_load():
    """Load feature = free units / 16; per-load optimum λ*(M) = 1 − M/N differs by load."""
    cfg = dual.DualConfig(mode="differentiable", conditioned=True, load_features=1,
                          learning_rate=0.05, temperature=0.3, temperature_min=0.005,
                          anneal_steps=300)

    def batch_fn(key):
        k1, k2 = jax.random.split(key)
        m = jnp.where(jax.random.uniform(k1, (32,)) < 0.5, 4.0, 16.0)
        return _uniform_batch(k2, 32, 32, m, load=(m / 16.0)[:, None])

    state0 = dual.init(cfg)
    m0 = dual.multipliers(state0, cfg, jnp.array([[0.25], [1.0]]))
    np.testing.assert_allclose(m0.lambda_s, [1e-4, 1e-4], rtol=1e-3)  # starts at the scalar
    state = _train(cfg, batch_fn, 600)
    lam = dual.multipliers(state, cfg, jnp.array([[0.25], [1.0]])).lambda_s
    np.testing.assert_allclose(np.asarray(lam), [1 - 4 / 32, 1 - 16 / 32], rtol=0.03)


def test_update_jits_once_and_is_deterministic():
    cfg = dual.DualConfig(mode="pid")
    upd = jax.jit(chex.assert_max_traces(dual.update, n=1), static_argnums=2)
    outs = []
    for _ in range(2):
        state = dual.init(cfg)
        for i in range(3):
            m, state = upd(state, _uniform_batch(jax.random.key(i), 4, 8, 2.0), cfg)
        outs.append(np.asarray([m.lambda_s, m.mu]))
    np.testing.assert_array_equal(outs[0], outs[1])
    chex.assert_tree_all_finite(state)


def test_bad_config_names_field():
    with pytest.raises(ValueError, match="config.dual.mode"):
        dual.DualConfig(mode="adam")
    with pytest.raises(ValueError, match="config.dual.temperature_min"):
        dual.DualConfig(temperature=0.1, temperature_min=0.5)
    with pytest.raises(ValueError, match="config.dual.learning_rate"):
        dual.DualConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match="config.dual.conditioned"):
        dual.DualConfig(mode="pid", conditioned=True)
    with pytest.raises(ValueError, match="unknown fields"):
        dual.config_from({"lr": 1.0})


def test_env_threshold_rule_is_lagrangian_maximiser_and_matches_relaxation():
    """prada_jax.sched's threshold rule (ample resources, so its repair is idle) returns the
    enumerated maximiser of the per-slot Lagrangian; its soft probabilities equal ours."""
    from prada_jax.sched.base import SchedInputs, SchedParams
    from prada_jax.sched.threshold import advantages, threshold_decide, threshold_soft

    rng = np.random.default_rng(7)
    decide = jax.jit(threshold_decide)
    for trial in range(40):
        n = int(rng.integers(1, 8))
        f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
        x = SchedInputs(candidate=jnp.asarray(rng.uniform(size=n) < 0.85),
                        gain=f32(rng.normal(0.05, 0.1, n)), delay_s=f32(rng.uniform(0, 1, n)),
                        bandwidth_hz=f32(rng.uniform(0.1e6, 3e6, n)),
                        wait_slots=jnp.asarray(rng.integers(0, 3, n), jnp.int32),
                        ctx_tokens=jnp.full(n, 100, jnp.int32), snr=jnp.ones(n),
                        draft_prm=jnp.zeros(n), u_rand=jnp.zeros(n),
                        queue_len=jnp.asarray(int(rng.integers(0, 6)), jnp.int32))
        sp = SchedParams(lambda_s=f32(rng.uniform(0, 0.05)), mu=f32(rng.uniform(0, 0.02e-6)),
                         beta=0.2, tau_s=0.05, num_servers=2, max_wait_slots=20)
        got = np.asarray(decide(x, jnp.int32(n), jnp.float32(1e12), sp))
        w, w_bar, _ = (np.asarray(a) for a in advantages(x, sp))
        want, _ = oracle.enumerate_lagrangian(w, w_bar, np.asarray(x.bandwidth_hz),
                                              float(sp.lambda_s), float(sp.mu),
                                              np.asarray(x.candidate))
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")
        mine = dual.hard_decision(w, w_bar, x.bandwidth_hz, sp.lambda_s, sp.mu, x.candidate)
        np.testing.assert_array_equal(np.asarray(mine), want)
        p_env, units, _ = threshold_soft(x, sp, 0.03)
        p_mine = dual.soft_decision(w, w_bar, x.bandwidth_hz, sp.lambda_s, sp.mu, 0.03)
        c = np.asarray(x.candidate)
        np.testing.assert_allclose(np.asarray(p_env)[c], np.asarray(p_mine)[c], atol=1e-5)
