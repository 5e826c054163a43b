"""Learner parts added for issue 17: decision-only compaction (and its overflow guard), the
truncation bootstrap from the env's final observation, any discrete action count and a plain
V(s) head, config validation with a given env."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import stage1
from prada_jax.rl import compaction, learner, losses, toy_env, trainer
from prada_jax.configs import ppo as ppo_configs


# ----------------------------------------------------------------------------- compaction

# Jitted (capacity static): run eagerly, every op compiles on its own, once per shape.
_compact = jax.jit(compaction.compact_decisions, static_argnums=1)


def test_compact_decisions_keeps_every_decision_once_and_counts_overflow():
    rng = np.random.default_rng(0)
    n = 40
    dec = rng.random(n) < 0.4
    flat = {"id": jnp.arange(n), "x": jnp.asarray(rng.normal(size=(n, 3)), jnp.float32),
            "decision": jnp.asarray(dec)}
    n_dec = int(dec.sum())
    out, dropped = _compact(flat, n_dec + 4, jax.random.key(1))
    valid = np.asarray(out["decision"])
    assert int(dropped) == 0 and valid.sum() == n_dec
    assert sorted(np.asarray(out["id"])[valid]) == sorted(np.flatnonzero(dec))
    np.testing.assert_array_equal(np.asarray(out["x"])[valid],
                                  np.asarray(flat["x"])[np.asarray(out["id"])[valid]])
    # overflow: K distinct decisions kept (a run from a random start), the rest counted
    k = n_dec - 5
    out, dropped = _compact(flat, k, jax.random.key(2))
    ids = np.asarray(out["id"])
    assert int(dropped) == 5 and np.asarray(out["decision"]).all()
    assert len(set(ids.tolist())) == k and dec[ids].all()


def test_masked_loss_on_compacted_buffer_equals_full_batch():
    rng = np.random.default_rng(3)
    n, a = 64, 3
    dec = rng.random(n) < 0.3
    batch = dict(obs=jnp.zeros((n, 1)), action=jnp.asarray(rng.integers(0, a, n), jnp.int32),
                 logp=jnp.asarray(rng.normal(size=n) - 1.0, jnp.float32),
                 q_taken=jnp.asarray(rng.normal(size=n), jnp.float32),
                 adv=jnp.asarray(rng.normal(size=n), jnp.float32),
                 ret=jnp.asarray(rng.normal(size=n), jnp.float32), decision=jnp.asarray(dec))
    logits = jnp.asarray(rng.normal(size=(n, a)), jnp.float32)
    q = jnp.asarray(rng.normal(size=(n, a)), jnp.float32)
    cfg = losses.PPOLossConfig(clip_value=True)

    def loss(b, lg, qq):
        return losses.ppo_loss(lg, qq, b["action"], b["logp"], b["q_taken"], b["adv"],
                               b["ret"], b["decision"], cfg)[0]
    loss = jax.jit(loss)
    full = loss(batch, logits, q)
    flat = dict(batch, lg=logits, q=q)
    comp, _ = _compact(flat, 32, jax.random.key(0))
    np.testing.assert_allclose(loss(comp, comp["lg"], comp["q"]), full, rtol=1e-5)


def test_decision_capacity_rounding():
    assert compaction.decision_capacity(8192, 0.25, 4) == 2048
    assert compaction.decision_capacity(8192, 0.3, 4) == 2460
    assert compaction.decision_capacity(10, 1.0, 4) == 12


# ----------------------------------------------------------------------------- truncation

def _python_returns(r, dec, term, trunc, final_v, last_v, gamma):
    """λ = 1 returns of one user slot by hand: a decision's reward is the sum of the slot
    rewards up to the next decision; bootstrap V(final obs) at a cut, 0 at an end."""
    ret = np.zeros(len(r))
    g, acc = last_v, 0.0
    for t in reversed(range(len(r))):
        if term[t]:
            g, acc = 0.0, 0.0
        elif trunc[t]:
            g, acc = final_v[t], 0.0
        acc += r[t]
        if dec[t]:
            g = acc + gamma * g
            ret[t] = g
            acc = 0.0
    return ret


def test_truncation_bootstraps_with_the_final_observation():
    env, params = toy_env.make(num_users=2, episode_len=5, time_limit=2)
    key = jax.random.key(0)
    obs, state = env.reset(key, params)
    step = jax.jit(env.step)
    rows = []
    for t in range(14):
        action = jnp.array([1, 1], jnp.int32)        # always nominate
        key, k = jax.random.split(key)
        nobs, state, rew, done, info = step(k, state, action, params)
        rows.append(dict(obs=np.asarray(obs), r=np.asarray(rew),
                         dec=np.asarray(info["decision_mask"]),
                         term=np.asarray(info["terminated"]),
                         trunc=np.asarray(info["truncated"]),
                         final=np.asarray(info["final_observation"]), next_obs=np.asarray(nobs)))
        obs = nobs
    stack = {k: np.stack([x[k] for x in rows]) for k in rows[0]}
    assert stack["trunc"].sum() >= 3 and stack["term"].sum() == 0
    # the next observation of a cut user is the NEW user's, not the final observation
    tt, uu = np.nonzero(stack["trunc"])
    assert not np.allclose(stack["final"][tt, uu], stack["next_obs"][tt, uu])
    value = stack["obs"][..., 0]                     # a critic with V(s) = feat[0]
    traj = dict(reward=jnp.asarray(stack["r"]), value=jnp.asarray(value),
                decision=jnp.asarray(stack["dec"]), terminated=jnp.asarray(stack["term"]),
                truncated=jnp.asarray(stack["trunc"]),
                trunc_value=jnp.asarray(stack["final"][..., 0]))
    last_v = jnp.asarray(np.asarray(obs)[:, 0])
    gamma = 0.9
    _, ret = learner.rollout_gae(traj, last_v, gamma, 1.0)
    ret = np.asarray(ret)
    for u in range(2):
        want = _python_returns(stack["r"][:, u], stack["dec"][:, u], stack["term"][:, u],
                               stack["trunc"][:, u], stack["final"][:, u, 0],
                               float(last_v[u]), gamma)
        np.testing.assert_allclose(ret[:, u], want, rtol=1e-5, atol=1e-6)
    # at the first cut of user 0: return = reward of that slot + γ·V(final observation)
    t0 = int(np.flatnonzero(stack["trunc"][:, 0])[0])
    np.testing.assert_allclose(ret[t0, 0], stack["r"][t0, 0]
                               + gamma * stack["final"][t0, 0, 0], rtol=1e-6)
    # without the final observation the bootstrap would be the next user's first value
    traj.pop("trunc_value")
    _, ret_naive = learner.rollout_gae(traj, last_v, gamma, 1.0)
    assert not np.allclose(np.asarray(ret_naive)[t0, 0], ret[t0, 0])


def test_rollout_records_value_of_final_observation():
    env, params = toy_env.make(num_users=2, episode_len=5, time_limit=2)

    def apply_fn(p, obs):                            # V head: V(s) = feat[0]
        return jnp.zeros(obs.shape[:-1] + (2,)), obs[..., :1]
    s = learner.PPOSettings(num_envs=2, rollout_len=9, num_epochs=1, num_minibatches=1,
                            updates_per_chunk=1, gamma=0.9, gae_lambda=1.0,
                            loss=losses.PPOLossConfig())
    rollout = jax.jit(learner.make_rollout(s, env, apply_fn))
    keys = jax.random.split(jax.random.key(0), 2)
    obs, st = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    _, _, _, traj, _ = rollout(None, params, st, obs, jnp.zeros((2, 2)), jax.random.key(5))
    tr = np.asarray(traj["truncated"])
    assert tr.any()
    tv, v = np.asarray(traj["trunc_value"]), np.asarray(traj["value"])
    t, e, u = np.nonzero(tr[:-1])
    assert not np.allclose(tv[t, e, u], v[t + 1, e, u])   # not the next user's value


# ----------------------------------------------------------------------------- any env

@pytest.mark.parametrize("critic", ["v", "q"])
def test_learner_on_toy_env_with_three_actions(critic, fast_compile):
    config = ppo_configs.get_config("toy")
    config.env.name = "not-a-registered-env"        # ignored: the env is given
    config.env.preset = "nope"
    config.net.critic = critic
    config.ppo.decision_only = True                  # the toy env does not declare sparse
    config.ppo.decision_capacity = 0.3               # small: exercises the overflow guard
    env, params = toy_env.make(num_users=4, num_actions=3)
    setup = trainer.build_setup(config, (env, params))
    assert setup.num_actions == 3
    chunk = trainer.make_jitted_chunk(setup)
    states = setup.init_states(config)
    logits, q = setup.apply_fn(jax.tree.map(lambda x: x[0], states.params), states.obs[0])
    assert logits.shape[-1] == 3 and q.shape[-1] == (1 if critic == "v" else 3)
    states, m = chunk(states, setup.env_params)
    states, m = chunk(states, setup.env_params)
    for k in ("policy_loss", "value_loss", "entropy", "grad_norm"):
        assert np.all(np.isfinite(np.asarray(m[k]))), k
    cap = setup.settings.decision_capacity
    np.testing.assert_array_equal(np.asarray(m["decision_overflow"]),
                                  np.maximum(np.asarray(m["decisions"]) - cap, 0))
    assert np.asarray(m["decision_overflow"]).max() > 0


def test_validate_config_names_fields_without_env():
    """The trainer checks its own fields; the env's (``env.name``, ...) are the env
    builder's (``envs.stage1``)."""
    config = ppo_configs.get_config("toy")
    config.env.name = "bogus"
    with pytest.raises(trainer.config_utils.ConfigError, match="env.name"):
        stage1.validate_env_config(config)
    trainer.validate_config(config)
    config.net.critic = "w"
    with pytest.raises(trainer.config_utils.ConfigError, match="net.critic"):
        trainer.validate_config(config)
    config.net.critic = "q"
    config.ppo.decision_capacity = 0.0
    with pytest.raises(trainer.config_utils.ConfigError, match="decision_capacity"):
        trainer.validate_config(config)
