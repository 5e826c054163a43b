"""config.dual.utilisation (ρ): the long-run occupancy constraint Σ admit_i·k_i ≤ ρ·M.
Closed forms (w ~ U(0,1): λ* = 1 − ρM/N, or 0 when ρM ≥ N), the dual, its shift and its slope
and the excess against NumPy on batches with unequal service times, the config variant and
bad values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax.dual import learner, problem, trainer


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


def _np_problem(batch, lam, mu_s, rho, bw_scale=1e6):
    """NumPy (float64) transcription of the long-run problem at (λ_s, µ per MHz): admissions
    (a new nomination is admitted iff w − λ − µ·b ≥ 0; w̄ < w here), the admissions' mean
    service times (k̄_u, k̄_b: plain and bandwidth-weighted, ≥ 1), the per-slot excess
    (Σ admit·k − ρ·M_t, Σ admit·b·k − B_t) and the dual value."""
    w, wb, b, k = (np.asarray(a, np.float64) for a in (batch.w, batch.w_bar, batch.b, batch.work))
    fresh = np.asarray(batch.fresh)
    cap_u = np.asarray(batch.capacity_units, np.float64)
    cap_b = np.asarray(batch.capacity_bw, np.float64)
    price = lam + mu_s * b / bw_scale
    adm = fresh & (w - price >= 0)
    ku = max((adm * k).sum() / adm.sum(), 1.0)
    kb = max((adm * b * k).sum() / (adm * b).sum(), 1.0)
    excess = np.stack([(adm * k).sum(-1) - rho * cap_u, (adm * b * k).sum(-1) - cap_b], -1)
    best = np.maximum(np.maximum(0.0, wb - price), w - price)
    dual = np.mean(np.where(fresh, best, 0.0).sum(-1) + lam * rho * cap_u / ku
                   + mu_s * cap_b / bw_scale / kb)
    return adm, (ku, kb), excess, dual


def _unequal_work_batch(seed, s=6, n=5):
    """Random slots whose valuable candidates need longer service (work grows with w), so the
    admissions' mean service time differs from that of all new nominations."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0.2, 0.3, (s, n))
    valid = rng.uniform(size=(s, n)) < 0.8
    fresh = valid & (rng.uniform(size=(s, n)) < 0.7)
    work = np.clip(np.round(3 + 6 * w + rng.normal(0, 1, (s, n))), 1, 9)
    cap = rng.integers(1, 4, s).astype(np.float64)
    bw = rng.uniform(5e6, 20e6, s)
    batch = problem.make_batch(w, w - 0.05, rng.uniform(1e5, 2e6, (s, n)), valid, cap,
                               bw, work=work, fresh=fresh, capacity_units=cap, capacity_bw=bw)
    return batch


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_dual_excess_and_slope_match_numpy_with_unequal_service_times(seed):
    """On random batches with unequal service times: the excess is Σ admit_i·k_i − ρ·M_t (and
    Σ admit_i·b_i·k_i − B_t) per slot, ``service_time`` is the admissions' (not all new
    nominations') mean service time, the dual equals its NumPy transcription (and D_ρ = D_1 −
    (1 − ρ)·λ·mean(M)/k̄_u), and its finite-difference slopes are minus the mean excess over
    k̄ (so the dual's minimiser is where the admitted demand fills ρ·M)."""
    batch = _unequal_work_batch(seed)
    lam, mu_s, h = 0.1, 0.02, 1e-4
    for rho in (0.3, 0.5, 0.9, 1.0):
        cfg = _cfg("subgradient", rho)
        st = learner.init(cfg)
        obj = lambda lm, mu: float(learner.state_objective(  # noqa: E731
            st._replace(m=jnp.array([lm, mu], jnp.float32)), batch, cfg))
        adm, (ku, kb), excess, dual = _np_problem(batch, lam, mu_s, rho)
        fresh = np.asarray(batch.fresh)
        k_all = np.asarray(batch.work)[fresh].mean()
        assert abs(ku - k_all) > 0.05, (ku, k_all)  # the batch tells the two apart
        mult = problem.Multipliers(lam, mu_s / 1e6)
        np.testing.assert_array_equal(np.asarray(problem.admitted(batch, mult)) > 0, adm)
        np.testing.assert_allclose(np.asarray(problem.service_time(batch, mult)), [ku, kb],
                                   rtol=1e-5)
        np.testing.assert_allclose(np.asarray(problem.excess_demand(batch, mult, rho)), excess,
                                   rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(obj(lam, mu_s), dual, rtol=1e-5)
        d1 = float(learner.state_objective(st._replace(m=jnp.array([lam, mu_s], jnp.float32)),
                                           batch, _cfg("subgradient", 1.0)))
        cap = np.asarray(batch.capacity_units, np.float64)
        np.testing.assert_allclose(obj(lam, mu_s), d1 - (1 - rho) * lam * cap.mean() / ku,
                                   rtol=1e-5)
        e = np.asarray(learner._mean_excess(batch, mult, cfg), np.float64)
        np.testing.assert_allclose(e, excess.mean(0) / [1.0, 1e6], rtol=1e-5, atol=1e-6)
        slope_l = (obj(lam + h, mu_s) - obj(lam - h, mu_s)) / (2 * h)
        slope_m = (obj(lam, mu_s + h) - obj(lam, mu_s - h)) / (2 * h)
        np.testing.assert_allclose([slope_l, slope_m], [-e[0] / ku, -e[1] / kb], atol=2e-3)
    e1 = problem.excess_demand(batch, problem.Multipliers(lam, mu_s / 1e6))
    np.testing.assert_array_equal(e1, problem.excess_demand(batch, problem.Multipliers(
        lam, mu_s / 1e6), utilisation=1.0))  # the default is the plain capacity constraint


def test_service_time_falls_back_to_new_nominations_then_one():
    """Nothing admitted (price above every value): k̄ is the mean over the new nominations
    (bandwidth-weighted for k̄_b); no new nomination either: 1."""
    batch = _unequal_work_batch(7)
    f = np.asarray(batch.fresh)
    k, b = np.asarray(batch.work, np.float64), np.asarray(batch.b, np.float64)
    got = np.asarray(problem.service_time(batch, problem.Multipliers(100.0, 0.0)))
    np.testing.assert_allclose(got, [max(k[f].mean(), 1.0),
                                     max((k * b)[f].sum() / b[f].sum(), 1.0)], rtol=1e-5)
    none = batch.replace(fresh=jnp.zeros_like(batch.fresh))
    np.testing.assert_array_equal(problem.service_time(none, problem.Multipliers(0.0, 0.0)),
                                  [1.0, 1.0])


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
    from studies import stage2_verdict as stage2
    from prada_jax.errors import BadInput

    assert stage2.parse_dual_overrides("utilisation=0.5, dual.mode=subgradient") == {
        "dual.utilisation": 0.5, "dual.mode": "subgradient"}
    assert stage2.parse_dual_overrides("") == {}
    for bad in ("rho=0.5", "utilisation", "mode", "utilisation=1.5", "mode=adam"):
        with pytest.raises(BadInput, match="--dual_overrides"):
            stage2.parse_dual_overrides(bad)
