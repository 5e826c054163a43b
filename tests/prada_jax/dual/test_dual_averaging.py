"""Polyak–Ruppert averaging of the online learners (``DualConfig.average_tail``).

Closed form with a cycling load: N = 1024 candidates per slot with w on the uniform grid
(i + ½)/N, capacity alternating M = 128 (heavy slot) and 384 (light slot), one update per
slot. The time-averaged constraint mean_t #{w > λ} ≤ mean_t M_t = 256 gives λ* = 1 − 256/N
= 0.75. A constant step η with η·N = ½ keeps the last iterate cycling (δ_t alternates around
±(2/3)·η·128 ≈ ±0.042 from λ*, see the recursion δ' = δ·(1 − ηN) + η·(M̄ − M_t)), while the
average of the iterates converges to λ*."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax.dual import learner, problem, trainer

N = 1024
STAR = 0.75


def _cycling_batch(t):
    w = (jnp.arange(N, dtype=jnp.float32) + 0.5) / N
    units = jnp.where(t % 2 == 0, 128.0, 384.0)
    return problem.make_batch(w, w - 0.05, jnp.zeros((N,)), jnp.ones((N,), bool), units, 1e12)


def _run(cfg, steps):
    def body(state, t):
        _, state = learner.update(state, _cycling_batch(t), cfg)
        return state, learner.multipliers(state, cfg).lambda_s

    return jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(steps)))(learner.init(cfg))


def _numpy_reference(steps, eta):
    """The same recursion in plain NumPy (subgradient, constant step, projection)."""
    w = (np.arange(N) + 0.5) / N
    lam, trace = 0.0, []
    for t in range(steps):
        units = 128.0 if t % 2 == 0 else 384.0
        lam = max(lam + eta * (np.sum(w - lam >= 0) - units), 0.0)
        trace.append(lam)
    return np.asarray(trace)


@pytest.mark.parametrize("mode", ["subgradient", "pid"])
def test_average_converges_while_last_iterate_cycles(mode):
    steps = 400
    eta = 0.5 / N
    # PID: gains ½η keep it in the linear range (w ∈ [0, 1]); its proportional term swings
    # with the load by kp·e ≈ ±0.075 and the integral by ±ki·e
    gain = 0.25 / N
    cfg = learner.DualConfig(mode=mode, step_size=eta, decay_steps=0, kp=gain, ki=gain, kd=0.0,
                          average_tail=0.5, average_horizon=steps)
    state, trace = _run(cfg, steps)
    trace = np.asarray(trace)
    last = float(learner.multipliers(state, cfg).lambda_s)
    avg = float(learner.export_multipliers(state, cfg).lambda_s)
    # the last iterates swing around λ* by several hundredths, never settling
    assert np.ptp(trace[-20:]) > 0.03
    assert abs(last - STAR) > 0.01
    # the average of the second half is λ* to within the grid spacing of w (1/N)
    assert abs(avg - STAR) < 2.0 / N
    np.testing.assert_allclose(avg, trace[steps // 2:].mean(), rtol=1e-5)
    assert int(state.avg_count) == steps // 2
    if mode == "subgradient":  # an independent transcription of the recursion
        np.testing.assert_allclose(trace, _numpy_reference(steps, eta), atol=2e-4)


def test_average_window_and_export_without_averaging():
    """tail 0 (or the differentiable mode) exports the last iterate; before the window opens
    the export is the current iterate; tail 1 averages from the first update."""
    steps = 40
    base = dict(mode="subgradient", step_size=0.5 / N, decay_steps=0, average_horizon=steps)
    s0, _ = _run(learner.DualConfig(**base, average_tail=0.0), steps)
    c0 = learner.DualConfig(**base, average_tail=0.0)
    assert float(learner.export_multipliers(s0, c0).lambda_s) == float(
        learner.multipliers(s0, c0).lambda_s)
    c1 = learner.DualConfig(**base, average_tail=1.0)
    s1, tr1 = _run(c1, steps)
    np.testing.assert_allclose(float(learner.export_multipliers(s1, c1).lambda_s),
                               np.mean(np.asarray(tr1)), rtol=1e-5)
    cq = learner.DualConfig(**dict(base, average_horizon=4 * steps), average_tail=0.5)
    sq, _ = _run(cq, steps)  # window opens after update 80: not reached
    assert float(sq.avg_count) == 0.0
    assert float(learner.export_multipliers(sq, cq).lambda_s) == float(
        learner.multipliers(sq, cq).lambda_s)
    cd = learner.DualConfig(mode="differentiable", average_tail=0.5, average_horizon=steps)
    assert not learner.averaging(cd)


def test_bad_average_fields_name_the_field():
    for kw in (dict(average_tail=-0.1), dict(average_tail=1.5), dict(average_horizon=-1)):
        with pytest.raises(ValueError, match="config.dual.average_"):
            learner.DualConfig(**kw)


def test_launcher_sets_the_horizon_from_the_run_length():
    from prada_jax.configs import dual as dual_configs

    c = dual_configs.get_config("subgradient")
    dcfg = trainer.validate_config(c)
    assert dcfg.average_tail == 0.5
    assert dcfg.average_horizon == c.train.num_chunks * c.train.rollout_len
    assert learner.average_start(dcfg) == dcfg.average_horizon // 2
