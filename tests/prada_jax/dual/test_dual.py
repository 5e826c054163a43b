"""prada_jax.dual (problem, learner): threshold rule = Lagrangian maximiser, relaxation, closed-form convergence."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax.sched.base import QUEUE
from envs import stage2
from prada_jax.dual import learner, problem, trainer
from prada_jax.sched import oracle


def _uniform_batch(key, slots, n, free_units, free_bw=1e12, b=None, load=None):
    w = jax.random.uniform(key, (slots, n))
    b = jnp.zeros((slots, n)) if b is None else b
    return problem.make_batch(w, -jnp.ones((slots, n)), b, jnp.ones((slots, n), bool),
                           jnp.broadcast_to(jnp.asarray(free_units, jnp.float32), (slots,)),
                           jnp.full((slots,), free_bw), load=load)


# Compiled training scans, one per (config, module-level batch_fn): runs that differ only in
# the batch_fn's arguments (passed to the jitted scan) share one compilation.
_TRAIN_JIT: dict = {}


def _train(cfg, batch_fn, steps, seed=0, args=()):
    """``steps`` learner updates on ``batch_fn(key, *args)`` (``args``: jit arguments)."""
    if (cfg, batch_fn) not in _TRAIN_JIT:
        def run(state, keys, args):
            def body(state, key):
                _, state = learner.update(state, batch_fn(key, *args), cfg)
                return state, None

            return jax.lax.scan(body, state, keys)[0]

        _TRAIN_JIT[cfg, batch_fn] = jax.jit(run)
    keys = jax.random.split(jax.random.key(seed), steps)
    return _TRAIN_JIT[cfg, batch_fn](learner.init(cfg), keys, args)


def _given(key, batch):
    """``batch_fn`` of a fixed batch (passed as an argument)."""
    del key
    return batch


_grad_objective = jax.jit(jax.grad(learner.dual_objective), static_argnums=2)


def _enum_lagrangian(w, w_bar, b, lam, mu, valid):
    """Plain-Python maximiser of the separable slot Lagrangian with the admission price:
    per candidate the first best of (immediate: w − p, queue: w̄ − p, local: 0), p = λ + µ·b
    (float64). Returns (decisions [N], value)."""
    d, total = [], 0.0
    for i in range(len(w)):
        if not valid[i]:
            d.append(oracle.LOCAL)
            continue
        p = lam + mu * float(b[i])
        opts = ((oracle.IMMEDIATE, float(w[i]) - p), (oracle.QUEUE, float(w_bar[i]) - p),
                (oracle.LOCAL, 0.0))
        best = max(v for _, v in opts)
        d.append(next(k for k, v in opts if v == best))
        total += best
    return np.asarray(d), total


def test_hard_rule_is_lagrangian_maximiser_by_enumeration():
    rng = np.random.default_rng(0)
    hard = jax.jit(problem.hard_decision)
    n = 7  # one shape (one compile); the valid mask varies
    for trial in range(60):
        w = rng.normal(0, 1, n).astype(np.float32)
        w_bar = (w - rng.uniform(-0.2, 1.5, n)).astype(np.float32)
        b = rng.uniform(0.1e6, 3e6, n).astype(np.float32)
        valid = rng.uniform(size=n) < 0.9
        lam, mu = float(rng.uniform(0, 1)), float(rng.uniform(0, 0.3e-6))
        got = np.asarray(hard(w, w_bar, b, lam, mu, valid))
        want, best = _enum_lagrangian(w, w_bar, b, lam, mu, valid)
        # Same value (the maximiser is unique away from exact ties, and then identical).
        value = oracle.slot_value(got, w - lam - mu * b, w_bar - lam - mu * b)
        np.testing.assert_allclose(value, best, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")


def test_soft_decision_tends_to_hard_and_sums_to_one():
    key = jax.random.key(1)
    w = jax.random.normal(key, (5, 9))
    w_bar = w - jax.random.uniform(jax.random.key(2), (5, 9), maxval=1.5)
    b = jnp.full((5, 9), 1e6)
    valid = jax.random.uniform(jax.random.key(3), (5, 9)) < 0.8
    p = jax.jit(problem.soft_decision)(w, w_bar, b, 0.3, 0.1e-6, 1e-4, valid)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
    hard = jax.jit(problem.hard_decision)(w, w_bar, b, 0.3, 0.1e-6, valid)
    np.testing.assert_array_equal(jnp.argmax(p, -1), hard)


def test_relaxed_dual_gradient_is_minus_soft_excess():
    """dD_T/dλ = mean(M − Σ p_adm), dD_T/dµ_scaled = mean(B − Σ b p_adm) (scaled), with
    p_adm = p_queue + p_imm (the price is charged to every admission; k = 1 here)."""
    cfg = learner.DualConfig(mode="differentiable", init_lambda_s=0.4, init_mu=0.2)
    state = learner.init(cfg)
    key = jax.random.key(4)
    batch = _uniform_batch(key, 6, 10, 3.0, free_bw=4e6,
                           b=jax.random.uniform(key, (6, 10), minval=0.2e6, maxval=1e6))
    temp = 0.2
    g = _grad_objective(state.params, batch, cfg, temp)["raw"]
    m = jax.nn.softplus(state.params["raw"])
    p = jax.jit(problem.soft_decision)(batch.w, batch.w_bar, batch.b, m[0], m[1] / 1e6, temp)
    p = p[..., 1] + p[..., 2]
    d_lam = np.mean(np.asarray(batch.free_units) - np.asarray(p).sum(-1))
    d_mu = np.mean((np.asarray(batch.free_bw) - (np.asarray(p) * np.asarray(batch.b)).sum(-1))
                   / 1e6)
    sig = np.asarray(jax.nn.sigmoid(state.params["raw"]))  # d softplus / d raw
    np.testing.assert_allclose(np.asarray(g), [d_lam * sig[0], d_mu * sig[1]], rtol=1e-4,
                               atol=1e-5)


def _identical_batch(slots, n, w, free_units, free_bw=1e12, b=0.0):
    return problem.make_batch(jnp.full((slots, n), w), jnp.full((slots, n), -1.0),
                           jnp.full((slots, n), b), jnp.ones((slots, n), bool),
                           jnp.full((slots,), free_units), jnp.full((slots,), free_bw))


def test_closed_form_identical_candidates_differentiable():
    """N identical candidates worth w, M < N units: D(λ) = N·max(0, w−λ) + λM, λ* = w."""
    cfg = learner.DualConfig(mode="differentiable", learning_rate=0.05, temperature=0.3,
                          temperature_min=0.003, anneal_steps=500)
    batch = _identical_batch(2, 8, 1.3, 3.0)
    state = _train(cfg, _given, 800, args=(batch,))
    m = learner.multipliers(state, cfg)
    np.testing.assert_allclose(float(m.lambda_s), 1.3, rtol=0.01)
    assert float(m.mu) * 1e6 < 0.01  # bandwidth never binds


def test_closed_form_bandwidth_only():
    """Identical candidates needing b = 2 MHz, free bw 5 MHz, units plenty: µ*·b = w."""
    cfg = learner.DualConfig(mode="differentiable", learning_rate=0.05, temperature=0.3,
                          temperature_min=0.003, anneal_steps=500)
    batch = _identical_batch(2, 8, 0.8, 100.0, free_bw=5e6, b=2e6)
    state = _train(cfg, _given, 800, args=(batch,))
    m = learner.multipliers(state, cfg)
    np.testing.assert_allclose(float(m.mu) * 2e6, 0.8, rtol=0.01)
    assert float(m.lambda_s) < 0.01


@pytest.mark.parametrize("mode", ["subgradient", "differentiable"])
def test_closed_form_uniform_candidates(mode):
    """w ~ U(0,1) i.i.d., N per slot, M units: E[#{w > λ}] = M  ⇒  λ* = 1 − M/N."""
    cfg = learner.DualConfig(mode=mode, step_size=0.05, decay_steps=10, learning_rate=0.02,
                          temperature=0.3, temperature_min=0.003, anneal_steps=500)
    state = _train(cfg, lambda k: _uniform_batch(k, 64, 32, 8.0), 800)
    np.testing.assert_allclose(float(learner.multipliers(state, cfg).lambda_s), 0.75, rtol=0.01)


def _uniform_16_1mhz(key, free_units, free_bw):
    """32 slots of 16 uniform candidates needing 1 MHz each."""
    return _uniform_batch(key, 32, 16, free_units, free_bw, jnp.full((32, 16), 1e6))


@pytest.mark.parametrize("mode", ["subgradient", "pid", "differentiable"])
def test_oversubscription_rises_light_load_goes_to_zero(mode):
    cfg = learner.DualConfig(mode=mode, init_lambda_s=0.3, init_mu=0.3, step_size=0.05,
                          decay_steps=20, kp=0.02, ki=0.01, learning_rate=0.05,
                          temperature=0.2, temperature_min=0.005, anneal_steps=300)
    # Heavy: 16 candidates, 2 units, 8 MHz → units bind.
    heavy = _train(cfg, _uniform_16_1mhz, 600, args=(2.0, 8e6))
    m = learner.multipliers(heavy, cfg)
    assert float(m.lambda_s) > 0.7
    e = learner.metrics(heavy, _uniform_batch(jax.random.key(9), 512, 16, 2.0, 8e6,
                                           jnp.full((512, 16), 1e6)), cfg)
    assert abs(float(e["dual/excess_units"])) < 0.15  # ≈ 0 before repair (mean over slots)
    # Light: 16 candidates, 32 units and 64 MHz → nothing binds, both multipliers → 0.
    light = _train(cfg, _uniform_16_1mhz, 600, args=(32.0, 64e6))
    m = learner.multipliers(light, cfg)
    assert float(m.lambda_s) < 0.01 and float(m.mu) * 1e6 < 0.01


def test_conditioned_multipliers_follow_load():
    """Load feature = free units / 16; per-load optimum λ*(M) = 1 − M/N differs by load."""
    cfg = learner.DualConfig(mode="differentiable", conditioned=True, load_features=1,
                          learning_rate=0.05, temperature=0.3, temperature_min=0.005,
                          anneal_steps=300)

    def batch_fn(key):
        k1, k2 = jax.random.split(key)
        m = jnp.where(jax.random.uniform(k1, (32,)) < 0.5, 4.0, 16.0)
        return _uniform_batch(k2, 32, 32, m, load=(m / 16.0)[:, None])

    state0 = learner.init(cfg)
    m0 = learner.multipliers(state0, cfg, jnp.array([[0.25], [1.0]]))
    np.testing.assert_allclose(m0.lambda_s, [1e-4, 1e-4], rtol=1e-3)  # starts at the scalar
    state = _train(cfg, batch_fn, 600)
    lam = learner.multipliers(state, cfg, jnp.array([[0.25], [1.0]])).lambda_s
    np.testing.assert_allclose(np.asarray(lam), [1 - 4 / 32, 1 - 16 / 32], rtol=0.03)


def test_update_jits_once_and_is_deterministic():
    cfg = learner.DualConfig(mode="pid")
    upd = jax.jit(chex.assert_max_traces(learner.update, n=1), static_argnums=2)
    outs = []
    for _ in range(2):
        state = learner.init(cfg)
        for i in range(3):
            m, state = upd(state, _uniform_batch(jax.random.key(i), 4, 8, 2.0), cfg)
        outs.append(np.asarray([m.lambda_s, m.mu]))
    np.testing.assert_array_equal(outs[0], outs[1])
    chex.assert_tree_all_finite(state)


def test_bad_config_names_field():
    with pytest.raises(ValueError, match="config.dual.mode"):
        learner.DualConfig(mode="adam")
    with pytest.raises(ValueError, match="config.dual.temperature_min"):
        learner.DualConfig(temperature=0.1, temperature_min=0.5)
    with pytest.raises(ValueError, match="config.dual.learning_rate"):
        learner.DualConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match="config.dual.conditioned"):
        learner.DualConfig(mode="pid", conditioned=True)
    with pytest.raises(ValueError, match="unknown fields"):
        learner.config_from({"lr": 1.0})


def test_env_threshold_rule_is_lagrangian_maximiser_and_matches_relaxation():
    """prada_jax.sched's threshold rule (ample resources, so its repair is idle) returns the
    enumerated maximiser of the per-slot Lagrangian; its soft probabilities equal ours."""
    from prada_jax.sched.base import SchedInputs, SchedParams
    from prada_jax.sched.threshold import advantages, threshold_decide, threshold_soft

    rng = np.random.default_rng(7)
    decide = jax.jit(threshold_decide)
    adv = jax.jit(advantages)
    hard = jax.jit(problem.hard_decision)
    soft_env = jax.jit(threshold_soft, static_argnums=2)
    soft_mine = jax.jit(problem.soft_decision, static_argnums=5)
    n = 7  # one shape (one compile); the candidate mask varies (0 to 7 candidates)
    for trial in range(40):
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
        w, w_bar, _ = (np.asarray(a) for a in adv(x, sp))
        want, _ = _enum_lagrangian(w, w_bar, np.asarray(x.bandwidth_hz), float(sp.lambda_s),
                                   float(sp.mu), np.asarray(x.candidate))
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")
        mine = hard(w, w_bar, x.bandwidth_hz, sp.lambda_s, sp.mu, x.candidate)
        np.testing.assert_array_equal(np.asarray(mine), want)
        p_env, units, _ = soft_env(x, sp, 0.03)
        p_mine = soft_mine(w, w_bar, x.bandwidth_hz, sp.lambda_s, sp.mu, 0.03)
        c = np.asarray(x.candidate)
        np.testing.assert_allclose(np.asarray(p_env)[c], np.asarray(p_mine)[c], atol=1e-5)


# Opt-in admission price (DualConfig.queue_price): the price is charged to queueing too. --------

def _np_dual_admission(w, w_bar, b, valid, free_units, free_bw, lam, mu):
    """NumPy transcription: mean_s [Σ_i max(0, w̄−λ−µb, w−λ−µb) + λ·F_s + µ·B_s] (hard max)."""
    price = lam + mu * b
    best = np.maximum(np.maximum(0.0, w_bar - price), w - price)
    return float(np.mean(np.where(valid, best, 0.0).sum(-1) + lam * free_units + mu * free_bw))


def _admission_batch(seed, slots=12, n=7):
    rng = np.random.default_rng(seed)
    w = rng.normal(0.3, 0.4, (slots, n))
    w_bar = w - rng.uniform(0.0, 0.3, (slots, n))
    b = rng.uniform(0.2e6, 2e6, (slots, n))
    valid = rng.uniform(size=(slots, n)) < 0.85
    free = rng.integers(1, 4, slots).astype(np.float64)
    free_bw = rng.uniform(1e6, 5e6, slots)
    return (w, w_bar, b, valid, free, free_bw), problem.make_batch(w, w_bar, b, valid, free, free_bw)


def test_admission_dual_matches_numpy_and_subgradient_is_minus_admission_excess():
    """D with the price on queue and immediate equals its NumPy transcription; its
    finite-difference slopes equal minus the excess *admission* demand (imm + queue) of the
    unrepaired rule (D is piecewise linear: exact away from kinks)."""
    arrays, batch = _admission_batch(0)
    cfg = learner.DualConfig(mode="subgradient", skip_full_slots=False)
    obj = jax.jit(lambda m: learner.state_objective(learner.init(cfg)._replace(m=m), batch, cfg))
    h = 1e-3
    for lam, mu_s in ((0.05, 0.01), (0.3, 0.05), (0.6, 0.2), (0.0, 0.0)):
        p = jnp.array([lam, mu_s], jnp.float32)
        np.testing.assert_allclose(float(obj(p)),
                                   _np_dual_admission(*arrays, lam, mu_s / 1e6), rtol=1e-5)
        e = np.asarray(learner._mean_excess(batch, problem.Multipliers(lam, mu_s / 1e6), cfg))
        for k, step in enumerate(([h, 0.0], [0.0, h])):
            hi = _np_dual_admission(*arrays, lam + step[0], (mu_s + step[1]) / 1e6)
            lo = _np_dual_admission(*arrays, max(lam - step[0], 0.0),
                                    max(mu_s - step[1], 0.0) / 1e6)
            width = step[k] + min([lam, mu_s][k], h)
            np.testing.assert_allclose((hi - lo) / width, -e[k], atol=1e-6, err_msg=f"{k}")
        # Admission counts queue and immediate; with β·τ > 0 (w > w̄) queue is never chosen
        # unrepaired, so it equals the immediate count of the priced rule.
        d = problem.hard_decision(batch.w, batch.w_bar, batch.b, lam, mu_s / 1e6, batch.valid)
        assert not np.any(np.asarray(d) == QUEUE)


def test_admission_relaxed_gradient_counts_queue_and_immediate():
    """dD_T/dλ = mean(F − Σ (p_queue + p_imm)) with the priced queue logit (softplus chain)."""
    _, batch = _admission_batch(1)
    cfg = learner.DualConfig(mode="differentiable", init_lambda_s=0.2, init_mu=0.1,
                             skip_full_slots=False)
    state = learner.init(cfg)
    temp = 0.15
    g = np.asarray(_grad_objective(state.params, batch, cfg, temp)["raw"])
    m = np.asarray(jax.nn.softplus(state.params["raw"]), np.float64)
    w, wb, b = (np.asarray(a, np.float64) for a in (batch.w, batch.w_bar, batch.b))
    price = m[0] + m[1] * b / 1e6
    z = np.stack([np.zeros_like(w), wb - price, w - price], -1) / temp
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    adm = np.where(np.asarray(batch.valid), p[..., 1] + p[..., 2], 0.0)
    d_lam = np.mean(np.asarray(batch.free_units) - adm.sum(-1))
    d_mu = np.mean((np.asarray(batch.free_bw) - (adm * b).sum(-1)) / 1e6)
    sig = 1 / (1 + np.exp(-np.asarray(state.params["raw"], np.float64)))
    np.testing.assert_allclose(g, [d_lam * sig[0], d_mu * sig[1]], rtol=1e-4, atol=1e-6)


def test_admission_closed_form_price_is_the_value_not_the_kink():
    """N identical candidates, w = 1.3, w̄ = w − 0.1 > 0, M = 3 < N units. The old rule's dual
    D = N·max(w̄, w − λ) + λM was minimised at the kink λ* = w − w̄ = 0.1; with the admission
    price D = N·max(0, w − λ) + λM, so λ* = w = 1.3 (the docs/dual.md finding, in closed form)."""
    cfg = learner.DualConfig(mode="differentiable", learning_rate=0.05, temperature=0.3,
                          temperature_min=0.003, anneal_steps=500)
    batch = problem.make_batch(jnp.full((2, 8), 1.3), jnp.full((2, 8), 1.2), jnp.zeros((2, 8)),
                            jnp.ones((2, 8), bool), jnp.full((2,), 3.0), jnp.full((2,), 1e12))
    lam = float(learner.multipliers(_train(cfg, _given, 800, args=(batch,)), cfg).lambda_s)
    np.testing.assert_allclose(lam, 1.3, rtol=0.02)


def test_admission_uniform_candidates_subgradient():
    """w ~ U(0,1), w̄ = w − 0.05, N = 32, M = 8: admissions = #{w > λ} ⇒ λ* = 1 − M/N = 0.75
    (the default rule would stop at the kink 0.05 here)."""
    cfg = learner.DualConfig(mode="subgradient", step_size=0.05, decay_steps=10)

    def batch_fn(key):
        w = jax.random.uniform(key, (64, 32))
        return problem.make_batch(w, w - 0.05, jnp.zeros((64, 32)), jnp.ones((64, 32), bool),
                               jnp.full((64,), 8.0), jnp.full((64,), 1e12))

    state = _train(cfg, batch_fn, 800)
    np.testing.assert_allclose(float(learner.multipliers(state, cfg).lambda_s), 0.75, rtol=0.01)


def test_admission_config_variant_and_field():
    from prada_jax.configs import dual as dual_configs

    c = dual_configs.get_config("heavy,admission")  # "admission" still parses (a no-op now)
    assert "queue_price" not in c.dual and c.env.num_servers == 1
    assert not hasattr(trainer.validate_config(c), "queue_price")
    c.eval.env_chunks = -1
    with pytest.raises(ValueError, match="config.eval.env_chunks"):
        trainer.validate_config(c)


def test_slot_from_sched_work_is_finite_with_infinite_delays():
    """A slot whose non-candidate users carry an infinite delay, and one candidate whose
    upload runs at zero rate (infinite delay), gives finite work (the env's capped count;
    1 where not a candidate) and a finite long-run excess at any price: the product
    0 · inf once made the demo's dual stage stop with a non-finite excess."""
    from envs import params as env_params
    from prada_jax.sched.base import SchedInputs, SchedParams

    n = 5
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    cand = np.array([True, True, False, False, True])
    delay = np.array([0.12, np.inf, np.inf, np.nan, 0.01])
    x = SchedInputs(candidate=jnp.asarray(cand), gain=f32([0.3, 0.2, 0.0, 0.0, 0.1]),
                    delay_s=f32(delay), bandwidth_hz=f32([1e6, 2e6, 0.0, 1e6, 5e5]),
                    wait_slots=jnp.zeros(n, jnp.int32), ctx_tokens=jnp.full(n, 100, jnp.int32),
                    snr=jnp.ones(n), draft_prm=jnp.zeros(n), u_rand=jnp.zeros(n),
                    queue_len=jnp.asarray(0, jnp.int32))
    sp = SchedParams(lambda_s=f32(0.0), mu=f32(0.0), beta=0.2, tau_s=0.05, num_servers=2,
                     max_wait_slots=20)
    batch = stage2.slot_from_sched(x, jnp.int32(2), jnp.float32(2e7), sp,
                                    jnp.zeros(stage2.LOAD_FEATURES))
    work = np.asarray(batch.work)
    valid = np.asarray(batch.valid)
    cap = env_params.MAX_PHASE_SLOTS
    want = np.where(valid, np.maximum(np.ceil(np.minimum(delay / 0.05, cap)),
                                      1.0), 1.0)
    np.testing.assert_array_equal(work, want)
    assert np.isfinite(work).all()
    for lam in (0.0, 0.1, 10.0):
        e = np.asarray(problem.excess_demand(batch, problem.Multipliers(f32(lam), f32(0.0))))
        assert np.isfinite(e).all(), (lam, e)
