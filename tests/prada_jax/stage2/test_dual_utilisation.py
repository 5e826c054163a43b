"""config.dual.utilisation (ρ): the long-run occupancy constraint admissions ≤ ρ·M/k̄.
Closed forms (w ~ U(0,1): λ* = 1 − ρM/N, or 0 when ρM ≥ N), the dual's exact shift, the
excess against NumPy, the config variant and bad values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax.stage2 import learner, problem, trainer


def _train(cfg, batch_fn, steps, seed=0):
    state = learner.init(cfg)

    def body(state, key):
        _, state = learner.update(state, batch_fn(key), cfg)
        return state, None

    keys = jax.random.split(jax.random.key(seed), steps)
    state, _ = jax.jit(lambda s, k: jax.lax.scan(body, s, k))(state, keys)
    return state


def _uniform(units, n=32, slots=64):
    def fn(key):
        w = jax.random.uniform(key, (slots, n))
        return problem.make_batch(w, w - 0.05, jnp.zeros((slots, n)), jnp.ones((slots, n), bool),
                               jnp.full((slots,), units), jnp.full((slots,), 1e12))
    return fn


def _cfg(mode, rho):
    return learner.DualConfig(mode=mode, step_size=0.05, decay_steps=10, learning_rate=0.02,
                           temperature=0.3, temperature_min=0.003, anneal_steps=500,
                           utilisation=rho)


@pytest.mark.parametrize("mode", ["subgradient", "differentiable"])
def test_closed_form_uniform_candidates_with_utilisation(mode):
    """N = 32, M = 8: #{w > λ} = ρ·M ⇒ λ* = 1 − ρM/N: 0.875 at ρ = ½ (0.75 at ρ = 1)."""
    state = _train(_cfg(mode, 0.5), _uniform(8.0), 800)
    np.testing.assert_allclose(float(learner.multipliers(state, _cfg(mode, 0.5)).lambda_s), 0.875,
                               rtol=0.01)


@pytest.mark.parametrize("mode", ["subgradient", "differentiable"])
def test_slack_capacity_binds_only_under_the_utilisation_target(mode):
    """N = 16 candidates, M = 24 units: the capacity constraint is slack (λ → 0), the ρ = ½
    target is over-subscribed (12 < 16): λ* = 1 − 12/16 = 0.25. The last batch (256 × 16
    draws) sets the final iterate: its quantile's sd is √(¼·¾/4096) ≈ 0.007, so atol 0.02."""
    full = _train(_cfg(mode, 1.0), _uniform(24.0, n=16, slots=256), 800)
    assert float(learner.multipliers(full, _cfg(mode, 1.0)).lambda_s) < 0.01
    half = _train(_cfg(mode, 0.5), _uniform(24.0, n=16, slots=256), 800)
    np.testing.assert_allclose(float(learner.multipliers(half, _cfg(mode, 0.5)).lambda_s), 0.25,
                               atol=0.02)


def test_dual_shift_and_excess_match_numpy():
    """D_ρ(λ, µ) = D_1(λ, µ) − (1 − ρ)·λ·mean(M_t)/k̄ exactly; the excess's unit column is
    admissions − ρ·M_t/k̄ with k̄ the mean service time of the fresh nominations (NumPy)."""
    rng = np.random.default_rng(3)
    s, n = 6, 5
    w = rng.normal(0.2, 0.3, (s, n))
    valid = rng.uniform(size=(s, n)) < 0.8
    fresh = valid & (rng.uniform(size=(s, n)) < 0.7)
    work = rng.integers(1, 9, (s, n)).astype(np.float64)
    cap = rng.integers(1, 4, s).astype(np.float64)
    batch = problem.make_batch(w, w - 0.05, rng.uniform(1e5, 2e6, (s, n)), valid, cap,
                            np.full(s, 20e6), work=work, fresh=fresh, capacity_units=cap,
                            capacity_bw=np.full(s, 20e6))
    kbar = max((work * fresh).sum() / fresh.sum(), 1.0)
    lam, mu_s = 0.1, 0.02
    st = learner.init(_cfg("subgradient", 1.0))._replace(m=jnp.array([lam, mu_s], jnp.float32))
    for rho in (0.3, 0.5, 0.9):
        d1 = float(learner.state_objective(st, batch, _cfg("subgradient", 1.0)))
        dr = float(learner.state_objective(st, batch, _cfg("subgradient", rho)))
        np.testing.assert_allclose(dr, d1 - (1 - rho) * lam * cap.mean() / kbar, rtol=1e-5)
        e = np.asarray(problem.excess_demand(batch, problem.Multipliers(lam, mu_s / 1e6),
                                          utilisation=rho))
        adm = (fresh & (w - lam - mu_s / 1e6 * np.asarray(batch.b) >= 0)).sum(-1)
        np.testing.assert_allclose(e[:, 0], adm - rho * cap / kbar, rtol=1e-5, atol=1e-5)
    e1 = problem.excess_demand(batch, problem.Multipliers(lam, mu_s / 1e6))
    np.testing.assert_array_equal(e1, problem.excess_demand(batch, problem.Multipliers(
        lam, mu_s / 1e6), utilisation=1.0))  # the default is the plain capacity constraint


def test_variant_default_and_bad_values():
    from prada_jax.configs import dual as dual_configs

    # the launcher's default is ρ = ½ (issue 14 follow-up); the learner's own default and
    # the capacity / legacy variants keep the plain capacity constraint
    assert trainer.validate_config(dual_configs.get_config()).utilisation == 1.0
    assert trainer.validate_config(dual_configs.get_config("dual_wait")).utilisation == 0.5
    assert trainer.validate_config(dual_configs.get_config("capacity")).utilisation == 1.0
    assert learner.DualConfig().utilisation == 1.0
    legacy = trainer.validate_config(dual_configs.get_config("legacy"))
    assert (legacy.mode, legacy.utilisation, legacy.init_lambda_s, legacy.learning_rate) == (
        "differentiable", 1.0, 0.0, 0.01)
    d = trainer.validate_config(dual_configs.get_config())
    assert (d.mode, d.average_tail) == ("subgradient", 0.5)
    assert trainer.validate_config(dual_configs.get_config("last_iterate")).average_tail == 0
    cond = trainer.validate_config(dual_configs.get_config("conditioned"))
    assert cond.mode == "differentiable" and cond.conditioned
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="config.dual.utilisation"):
            learner.DualConfig(utilisation=bad)


def test_stage2_dual_overrides_parse_and_name_bad_fields():
    from evals import stage2
    from prada_jax.errors import BadInput

    assert stage2.parse_dual_overrides("utilisation=0.5, dual.mode=subgradient") == {
        "dual.utilisation": 0.5, "dual.mode": "subgradient"}
    assert stage2.parse_dual_overrides("") == {}
    for bad in ("rho=0.5", "utilisation", "mode", "utilisation=1.5", "mode=adam"):
        with pytest.raises(BadInput, match="--dual_overrides"):
            stage2.parse_dual_overrides(bad)
