"""prada_jax.dual over edge-env rollouts: extracted slots match the env, learning under load."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import stage2
from prada_jax.sched import oracle
from prada_jax.dual import learner, problem, rollout, trainer

CFG = learner.DualConfig(mode="subgradient", step_size=0.005, decay_steps=400)


@pytest.fixture(scope="module")
def chunk():
    return jax.jit(trainer.make_train_chunk(CFG, stage2.EDGE, stage2.make_trace_rule_policy(-0.05), 60),
                   donate_argnums=())


def test_extracted_slots_match_the_env_decision(stage2_env):
    """The env, running the threshold rule at fixed prices, decides exactly what the rule
    decides on the candidate set read by ``stage2.env_slot`` (except outages, which the env
    makes local)."""
    params = stage2_env.params()
    carry = rollout.init_rollout(stage2.EDGE, jax.random.key(0), params, stage2_env.num_envs,
                                 lambda _: rollout.fixed_prices(problem.Multipliers(0.02, 0.0)))
    _, out = stage2_env.rollout(carry, params)
    np.testing.assert_allclose(np.asarray(out["lambda_s"]), 0.02, rtol=1e-6)
    _, d, env_d, cand, outage = stage2_env.rule_on_slots(out, params)
    assert cand.sum() > 40
    keep = cand & ~outage
    np.testing.assert_array_equal(env_d[keep], d[keep])
    assert np.all(env_d[cand & outage] == oracle.LOCAL)
    # The slot values the learner sees are the rule's own advantages.
    b = out["batch"]
    assert np.all(np.asarray(b.valid) <= cand.reshape(b.valid.shape))


def test_heavy_load_raises_lambda_and_light_load_zeroes_it(chunk, stage2_env):
    """Over-subscribed (M=1, 60 users/s into 12 user slots: at λ_s = 0 more than one
    admission per slot of one-slot jobs): λ_s rises from 0 and the long-run excess
    (admissions − M/k̄ per slot), with the multipliers each slot ran with, averages ≈ 0.
    Light load (M=6, 400 MHz, 2 users/s into the same 12 user slots, so one compiled chunk
    serves both): both multipliers are projected to 0."""
    heavy = stage2_env.params(num_servers=1, arrival_rate_hz=60.0, num_users=12)
    light = stage2_env.params(num_servers=6, bandwidth_hz=400e6, arrival_rate_hz=2.0,
                              num_users=12)
    results = {}
    for name, params in (("heavy", heavy), ("light", light)):
        carry = rollout.init_rollout(stage2.EDGE, jax.random.key(1), params, 4,
                                     lambda k: learner.init(CFG, k))
        start = jnp.array([0.0, 0.0]) if name == "heavy" else jnp.array([0.05, 0.05])
        carry = carry._replace(prices=carry.prices._replace(m=start))
        hist = []
        for _ in range(6):
            carry, m = chunk(carry, params)
            hist.append({k: float(v) for k, v in m.items() if np.size(v) == 1})
        results[name] = hist
    h = results["heavy"][3:]
    lam = np.mean([r["dual/rollout_lambda_s"] for r in h])
    exc = np.mean([r["dual/rollout_excess_units"] for r in h])
    first_excess = results["heavy"][0]["dual/rollout_excess_units"]
    # The admission price rises until admissions meet capacity (here above the queueing
    # cost β·τ = 0.0025, below the largest gains).
    beta_tau = float(heavy.beta * heavy.tau_s)
    assert beta_tau < lam < 1.0, results["heavy"]
    assert abs(exc) < 0.15 and abs(exc) < abs(first_excess) + 0.15, results["heavy"]
    lt = results["light"][-1]
    assert lt["dual/lambda_s"] == 0.0 and lt["dual/mu"] == 0.0, lt
    assert lt["dual/rollout_excess_units"] < -1.0, lt


def test_load_features_read_what_the_server_observes(stage2_env):
    """stage2.load_features against a NumPy transcription on env slots: queue/M,
    active/U, free units/M, new nominations/U, mean log2(1+SNR) of candidates / 10."""
    from envs import edge

    params = stage2_env.params(num_servers=2, arrival_rate_hz=60.0)
    policy = stage2.make_trace_rule_policy(-0.05)

    @jax.jit
    def slot_then_step(key, state, params):
        """The slot's candidate set and SlotBatch, and the next state (one compilation)."""
        noise = edge.draw_noise(key, params)
        action = policy(None, None, state, params)
        cs, batch = stage2.env_slot(state, action, params, noise)
        return cs, batch, edge.step_with_noise(state, action, params, noise)[1]

    _, state = jax.jit(edge.reset)(jax.random.key(0), params)
    seen_queue = False
    for t in range(25):
        cs, batch, next_state = slot_then_step(jax.random.key(100 + t), state, params)
        x = jax.tree.map(np.asarray, cs.x)
        cand = x.candidate
        se = np.log2(1.0 + x.snr[cand]).mean() if cand.any() else 0.0
        want = [x.queue_len / 2, np.mean(np.asarray(state.phase) != edge.EMPTY),
                int(cs.free_units) / 2, np.sum(cand & (x.wait_slots == 0)) / 6, se / 10]
        np.testing.assert_allclose(np.asarray(batch.load), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(batch.fresh), cand & (x.wait_slots == 0)
                                      & np.asarray(batch.valid))
        seen_queue |= bool(x.queue_len > 0)
        state = next_state
    assert seen_queue


def test_ppo_policy_nominates_by_actor_or_critic():
    """``nominate_by="critic"`` nominates iff the carried ΔQ > 0; ``"actor"`` by the logits
    (whatever ΔQ says); an unknown value is bad input."""
    from prada_jax.errors import BadInput

    logits = jnp.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    q = jnp.array([[0.0, -0.1], [0.0, 0.2], [0.0, 0.3], [0.0, -0.4]])
    apply_fn = lambda p, obs: (logits, q)  # noqa: E731
    actor = stage2.make_ppo_policy(apply_fn, None)(None, None, None, None)
    critic = stage2.make_ppo_policy(apply_fn, None, nominate_by="critic")(
        None, None, None, None)
    np.testing.assert_array_equal(np.asarray(actor.screen), [1, 0, 1, 0])
    np.testing.assert_array_equal(np.asarray(critic.screen), [0, 1, 1, 0])
    np.testing.assert_allclose(np.asarray(critic.gain), [-0.1, 0.2, 0.3, -0.4])
    with pytest.raises(BadInput, match="nominate_by"):
        stage2.make_ppo_policy(apply_fn, None, nominate_by="both")
