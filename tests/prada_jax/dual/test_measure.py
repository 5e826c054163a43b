"""Stage-2 rollouts, the learner's env/* diagnostics and gap.rollout_stats measure as evals does
(issue 41 item 4): empty start, every arrival counted, blocked and timed-out users at accuracy 0
and latency = the timeout. References are plain NumPy over the rollout's own outputs."""
import jax
import numpy as np

from evals.evaluate import DEFAULT_DRAIN_SLOTS
from envs import stage2
from prada_jax.dual import gap, learner, measure, problem, rollout, trainer

POLICY = stage2.make_trace_rule_policy(-0.05)
D = 12         # a short timeout (finished latencies here: 5 … 27 slots): some users time out
T = 40


def _fixed(params, seed=0, envs=2):
    return rollout.init_rollout(stage2.EDGE, jax.random.key(seed), params, envs,
                                lambda _: rollout.fixed_prices(problem.Multipliers(0.0, 0.0)))


def test_timeout_is_evals_drain():
    assert measure.DEFAULT_TIMEOUT_SLOTS == DEFAULT_DRAIN_SLOTS


def test_rollout_starts_empty(stage2_env):
    """The params place U users at reset (initial_users = U); the stage-2 rollout starts empty
    anyway, as evals does (a start with U users is a backlog, not a load)."""
    params = stage2_env.params()
    assert int(params.initial_users) == stage2_env.num_users
    carry = _fixed(params)
    assert not np.asarray(carry.env_state.active).any()
    assert int(np.asarray(carry.env_state.arrived).sum()) == 0


def test_censored_means_count_failures_at_the_timeout():
    acc, lat = measure.censored_means(np.array([10.0, 0.0]), np.array([6.0, 0.0]),
                                      np.array([3.0, 0.0]), np.array([12.0, 0.0]), 20.0)
    np.testing.assert_allclose(np.asarray(acc)[0], 3 / 10, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lat)[0], (12 + 4 * 20) / 10, rtol=1e-6)
    assert np.isnan(np.asarray(acc)[1]) and np.isnan(np.asarray(lat)[1])


def test_every_admitted_user_resolves_once(stage2_env):
    """Arrivals for T slots into 3 user slots at M = 1 (blocked arrivals, long waits), then none
    for D + 2 slots: every admitted user resolved exactly once, finished within D slots
    (``ok``) or timed out; ``ok``'s latencies are the finished users' latencies ≤ D·τ."""
    on = stage2_env.params(num_users=3, arrival_rate_hz=60.0)
    off = on.replace(arrival_rate_hz=on.arrival_rate_hz * 0.0)
    ro = jax.jit(rollout.make_rollout(stage2.EDGE, POLICY, T, timeout_slots=D))
    carry, out1 = ro(_fixed(on), on)
    _, out2 = ro(carry, off)
    out = {k: np.concatenate([np.asarray(out1[k]), np.asarray(out2[k])])
           for k in ("arrivals", "blocked", "ok", "timed_out", "ok_latency_s", "ok_correct",
                     "user_latency_s", "user_correct", "finished", "correct")}
    admitted = out["arrivals"].sum() - out["blocked"].sum()
    assert out["blocked"].sum() > 0 and out["timed_out"].sum() > 0 and out["ok"].sum() > 0
    assert out["ok"].sum() + out["timed_out"].sum() == admitted
    tau = float(on.tau_s)
    lat = out["user_latency_s"]
    within = (np.round(lat / tau) <= D) & (lat > 0)
    np.testing.assert_allclose(out["ok_latency_s"].sum(), lat[within].sum(), rtol=1e-5)
    assert out["ok_correct"].sum() == (within & out["user_correct"]).sum()
    # users finishing after the timeout are among the finished, not among ok
    assert out["finished"].sum() > out["ok"].sum()


def test_trainer_diagnostics_count_every_arrival(stage2_env):
    """env/accuracy and env/latency_s are per resolved arrival (blocked ones at accuracy 0 and
    latency D·τ), computed here in NumPy from the same rollout the chunk runs; before issue 41
    they were over finished users only (correct / finished)."""
    cfg = learner.DualConfig(mode="subgradient", step_size=0.005, decay_steps=400)
    params = stage2_env.params(num_users=3, arrival_rate_hz=60.0)
    carry = rollout.init_rollout(stage2.EDGE, jax.random.key(3), params, 2, lambda k: learner.init(cfg, k))
    chunk = jax.jit(trainer.make_train_chunk(cfg, stage2.EDGE, POLICY, T))
    _, m = chunk(carry, params)
    ro = jax.jit(rollout.make_rollout(stage2.EDGE, POLICY, T, trainer.learner_mult_fn(cfg),
                                      lambda s, b: learner.update(s, b, cfg)[1]))
    _, out = ro(carry, params)
    s = {k: float(np.sum(np.asarray(out[k], np.float64)))
         for k in ("blocked", "timed_out", "ok", "ok_correct", "ok_latency_s", "correct",
                   "finished", "arrivals")}
    assert s["blocked"] > 0
    resolved = s["blocked"] + s["timed_out"] + s["ok"]
    timeout = measure.DEFAULT_TIMEOUT_SLOTS * float(params.tau_s)
    np.testing.assert_allclose(float(m["env/accuracy"]), s["ok_correct"] / resolved, rtol=1e-5)
    np.testing.assert_allclose(float(m["env/latency_s"]),
                               (s["ok_latency_s"] + (s["blocked"] + s["timed_out"]) * timeout)
                               / resolved, rtol=1e-5)
    assert float(m["env/accuracy"]) < s["correct"] / s["finished"]   # the survivor-only mean
    for k, tag in (("blocked", "env/blocked"), ("ok", "env/finished"),
                   ("timed_out", "env/timed_out"), ("arrivals", "env/arrivals")):
        assert float(m[tag]) == s[k]


def test_rollout_stats_measures_the_window_cohort(stage2_env):
    """gap.rollout_stats: the cohort arriving in the window after the warm-up, blocked and
    unfinished-at-the-timeout users at accuracy 0 and latency D·τ, per arrival — recomputed in
    NumPy from the same rollout (same seed, warm-up, window and drain)."""
    params = stage2_env.params(num_users=3, arrival_rate_hz=60.0)
    L, warm, win = 20, 1, 2
    got = gap.rollout_stats(stage2.EDGE, params, POLICY, gap.ZERO, win, 2, seed=5,
                            rollout_len=L, warmup_chunks=warm, timeout_slots=D)
    ro, carry = gap._fixed_rollout(stage2.EDGE, params, POLICY, gap.ZERO, 2, 5, L, None, D)
    lo, hi = warm * L, (warm + win) * L
    arrivals = blocked = fin = correct = lat_sum = 0.0
    tau = float(params.tau_s)
    for c in range(warm + win + 1):     # D + 1 ≤ L: one drain chunk
        carry, out = ro(carry, params)
        for i in range(L):
            t = c * L + i
            if lo <= t < hi:
                arrivals += float(np.sum(out["arrivals"][i]))
                blocked += float(np.sum(out["blocked"][i]))
            a = np.asarray(out["user_arrival_slot"][i]) - 1
            lat = np.asarray(out["user_latency_s"][i])
            done = lat > 0
            m = done & (np.round(lat / tau) <= D) & (a >= lo) & (a < hi)
            fin += m.sum()
            correct += (m & np.asarray(out["user_correct"][i])).sum()
            lat_sum += lat[m].sum()
    assert blocked > 0 and arrivals - blocked - fin > 0      # both kinds of failure occur
    np.testing.assert_allclose(got["accuracy"], correct / arrivals, rtol=1e-5)
    np.testing.assert_allclose(got["latency_s"], (lat_sum + (arrivals - fin) * D * tau)
                               / arrivals, rtol=1e-5)
    np.testing.assert_allclose(got["blocked_rate"], blocked / arrivals, rtol=1e-6)
    assert got["env_slots"] == win * L * 2
