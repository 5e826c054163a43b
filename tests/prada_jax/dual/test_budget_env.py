"""End to end on edge-env rollouts: the averaged subgradient learner with ρ = b learns a constant
price whose measured server occupancy (busy units / M, the env's own count) meets the cap b
within 2 %, while λ = 0 runs far over it."""
import jax
import numpy as np

from envs import scenarios, stage2
from prada_jax.dual import learner, problem, rollout

CAP, M, CHUNKS = 0.6, 2, 120


def _params(stage2_env):
    """M = 2 units, a server 10× slower than the default (jobs hold a unit ≈ 6 slots), 10
    users/s into the fixture's 6 user slots: λ = 0 keeps the server ≈ 90 % busy."""
    return stage2_env.params(num_servers=M, arrival_rate_hz=10.0,
                             **scenarios.latency_overrides({"server_speed": 0.1}))


def _measure(stage2_env, params, lam, seed, chunks=40, warmup=2):
    """(measured occupancy, occupancy the admissions ask for) at the constant price λ over
    ``chunks`` rollouts of the fixture (the first ``warmup`` discarded), both / M."""
    carry = rollout.init_rollout(stage2.EDGE, jax.random.key(seed), params, stage2_env.num_envs,
                                 lambda _: rollout.fixed_prices(problem.Multipliers(lam, 0.0)))
    busy, asked = [], []
    for c in range(chunks):
        carry, out = stage2_env.rollout(carry, params)
        if c >= warmup:
            busy.append(np.asarray(out["server_in_use"], np.float64))
            adm = np.asarray(problem.admitted(out["batch"], problem.Multipliers(lam, 0.0)))
            asked.append((adm * np.asarray(out["batch"].work)).sum(-1))
    return float(np.mean(busy)) / M, float(np.mean(asked)) / M


def test_learned_price_meets_the_measured_occupancy_cap(stage2_env):
    params = _params(stage2_env)
    cfg = learner.DualConfig(mode="subgradient", step_size=0.02, decay_steps=20.0,
                             utilisation=CAP, average_tail=0.5, average_horizon=CHUNKS)
    update = jax.jit(lambda s, b: learner.update(s, b, cfg)[1])
    state = learner.init(cfg)
    carry = rollout.init_rollout(stage2.EDGE, jax.random.key(11), params, stage2_env.num_envs,
                                 lambda _: rollout.fixed_prices(problem.Multipliers(0.0, 0.0)))
    for _ in range(CHUNKS):  # one update per chunk of the fixture's compiled rollout
        carry = carry._replace(prices=rollout.fixed_prices(learner.multipliers(state, cfg)))
        carry, out = stage2_env.rollout(carry, params)
        state = update(state, out["batch"])
    lam = float(learner.export_multipliers(state, cfg).lambda_s)
    # Evaluated on other seeds than those learned on.
    occ, asked = _measure(stage2_env, params, lam, seed=100)
    occ0, _ = _measure(stage2_env, params, 0.0, seed=100)
    assert occ0 > 1.3 * CAP, occ0                       # no price: the cap is violated
    assert occ <= 1.02 * CAP, (lam, occ, asked)         # the cap is met within 2 %
    assert occ >= 0.85 * CAP, (lam, occ, asked)         # not by starving the server
    # What the learner enforces: the admissions' own service times fill ρ·M (a bound of the
    # measured occupancy: admissions that never run, by outage, repair or expiry, add none).
    assert abs(asked - CAP) < 0.06 * CAP and asked >= occ, (lam, occ, asked)
