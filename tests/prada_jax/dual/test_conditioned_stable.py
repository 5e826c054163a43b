"""The load-conditioned learner on issue 33's outage-with-bursts scenario stays finite when a
request's upload rate is zero (docs/dual.md, "The conditioned learner's NaN").

Issue 33 saw ``non-finite dual/export_lambda_s`` at chunk 16 of 20 (Adam, differentiable
mode). Cause: one user-slot of 1.2 M had log2(1 + SNR) = 0 in float32 (a fading draw at the
env's floor), so its communication delay was infinite, its values w = w̄ = −∞ and the wait cost
the learner took as w − w̄ was NaN; masked by ``jnp.where`` in the forward pass, it still made
the gradient NaN (0 · NaN), and one Adam step made every multiplier NaN. Here the same event is
made certain by a deep channel fade (−150 dB) in a few slots of that scenario, at a small size.
"""
import jax
import jax.numpy as jnp
import numpy as np

from envs import registry, scenarios, stage2
from prada_jax.dual import learner, problem, rollout, trainer
from prada_jax.traces.testing import random_traces

U, E, T = 48, 2, 24


def issue33_scenario(n: int = 1000, fade=(4, 8)) -> scenarios.Scenario:
    """Period ``n`` slots: the server at a quarter of its units for slots 600–800, arrivals
    × 4 for 40 of every 200 slots and × 0.6 otherwise (issue 33), plus a −150 dB channel fade
    in slots ``fade`` (every upload rate 0 there)."""
    t = np.arange(n)
    return scenarios.validate(scenarios.static(n)._replace(
        arrival=np.where((t % 200) < 40, 4.0, 0.6).astype(np.float32),
        servers=np.where((t >= 600) & (t < 800), 0.25, 1.0).astype(np.float32),
        channel_db=np.where((t >= fade[0]) & (t < fade[1]), -150.0, 0.0).astype(np.float32)))


def _params():
    traces = random_traces(seed=0, problems=12, depth=4, feature_dim=4)
    return registry.make("edge", traces=traces, num_users=U, scheduler="threshold",
                         num_servers=4, bandwidth_hz=20e6, arrival_rate_hz=12.0, beta=0.2,
                         tau_s=0.05, max_wait_slots=20, reward_mode="true",
                         policy_reward_mode="coarse", scenario=issue33_scenario())[1]


def test_conditioned_learner_finishes_finite_through_a_zero_rate_upload():
    cfg = learner.DualConfig(mode="differentiable", conditioned=True, load_features=5,
                             init_lambda_s=0.04, learning_rate=0.05, temperature=0.05,
                             temperature_min=0.0005, anneal_steps=8)
    params = _params()
    policy = stage2.make_trace_rule_policy(-0.05)
    # make_train_chunk's differentiable path, unrolled (one compiled rollout, one compiled
    # update): a rollout priced by the learner, then SGD steps on its slots
    ro = jax.jit(rollout.make_rollout(stage2.EDGE, policy, T, trainer.learner_mult_fn(cfg)))
    upd = jax.jit(lambda s, b: learner.update(s, b, cfg)[1])
    met = jax.jit(lambda s, b: learner.metrics(s, b, cfg))
    carry = rollout.init_rollout(stage2.EDGE, jax.random.key(0), params, E, lambda k: learner.init(cfg, k))
    for chunk in range(3):
        carry, out = ro(carry, params)
        b = out["batch"]
        if chunk == 0:
            first, x = b, out["x"]
        state = carry.prices
        for _ in range(4):
            state = upd(state, b)
        carry = carry._replace(prices=state)
        m = met(state, b)
        for k, v in m.items():
            assert np.isfinite(np.asarray(v)).all(), (chunk, k)
    # The event happened: nominated requests with an infinite communication delay (w = −∞)
    # in the faded slots, and the learner's batch left them out, finite everywhere.
    zero_rate = np.asarray(x.candidate & ~jnp.isfinite(x.comm_s))
    assert zero_rate.sum() > 0
    assert np.isfinite(np.asarray(first.w)).all() and np.isfinite(np.asarray(first.w_bar)).all()
    assert not np.asarray(first.valid)[zero_rate.reshape(first.valid.shape)].any()
    leaves = jax.tree.leaves(carry.prices.params)
    assert all(np.isfinite(np.asarray(v)).all() for v in leaves)
    load = jnp.mean(b.load.reshape(-1, b.load.shape[-1]), axis=0)
    exp = learner.export_multipliers(carry.prices, cfg, load)
    assert np.isfinite(float(exp.lambda_s)) and np.isfinite(float(exp.mu))


def test_masked_infinite_values_do_not_reach_the_gradient():
    """A hand-made batch with −∞ values in a masked entry (not a new nomination) and in a
    valid one: the dual objective and its gradient stay finite and equal those of the batch
    without them (the valid −∞ request is worth nothing at any price: max(0, −∞) = 0)."""
    cfg = learner.DualConfig(mode="differentiable", conditioned=True, load_features=5)
    st = learner.init(cfg, jax.random.key(3))
    w = jnp.array([[0.5, -jnp.inf, 0.2, -jnp.inf]])
    valid = jnp.array([[True, False, True, True]])
    load = jnp.full((1, 5), 0.3)

    def batch(w, valid):
        return problem.make_batch(w, w - 0.01, jnp.full(w.shape, 1e6), valid, jnp.array([1.0]),
                                  jnp.array([20e6]), load=load)

    ref_w = jnp.array([[0.5, 0.0, 0.2, 0.0]])
    ref_valid = jnp.array([[True, False, True, False]])
    for temp in (0.01, 0.0005):
        g = jax.grad(learner.dual_objective)(st.params, batch(w, valid), cfg, temp)
        g_ref = jax.grad(learner.dual_objective)(st.params, batch(ref_w, ref_valid), cfg, temp)
        for a, r in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
            assert np.isfinite(np.asarray(a)).all()
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-5, atol=1e-7)
