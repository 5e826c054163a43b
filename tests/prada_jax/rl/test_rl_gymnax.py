"""Issue 25: decision_only decided from the env, the single-agent adapter (prada_jax.rl.single_agent),
bad env shapes as one-line exit-2 errors, and PPO solving gymnax CartPole-v1."""
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import registry, stage1
from prada_jax import cli
from prada_jax.errors import BadInput
from prada_jax.rl import single_agent, toy_env, trainer
from prada_jax.configs import ppo as ppo_configs


# ----------------------------------------------------------------------------- a tiny env

class _Discrete(NamedTuple):
    n: int
    shape: tuple = ()


class _BanditState(NamedTuple):
    feat: jax.Array
    time: jax.Array


class Bandit:
    """Single-agent, gymnax 1.x shaped: obs [D] ~ N(0, 1), action k earns feat[k], the
    episode is cut (truncated) after ``limit`` steps and auto-resets; info has the final
    observation. Every step is a decision."""

    name = "Bandit"

    def __init__(self, d=3, limit=4, obs_shape=None, reward_shape=(), space=None):
        self.d, self.limit = d, limit
        self.obs_shape = obs_shape or (d,)
        self.reward_shape = reward_shape
        self.space = space if space is not None else _Discrete(d)

    def reset(self, key, params):
        feat = jax.random.normal(key, self.obs_shape)
        return feat, _BanditState(feat, jnp.int32(0))

    def step(self, key, state, action, params):
        k1, k2 = jax.random.split(key)
        reward = jnp.take(state.feat.reshape(-1), action) * jnp.ones(self.reward_shape)
        t = state.time + 1
        truncated = t >= self.limit
        nxt = jax.random.normal(k1, self.obs_shape)
        fresh = jax.random.normal(k2, self.obs_shape)
        obs = jnp.where(truncated, fresh, nxt)
        state = _BanditState(obs, jnp.where(truncated, 0, t))
        return (obs, state, reward, jnp.bool_(False), truncated,
                {"final_observation": nxt, "discount": jnp.float32(1.0)})

    def action_space(self, params):
        return self.space


def _small_default_config(num_users=1):
    """The DEFAULT config (decision fields untouched) at test sizes."""
    c = ppo_configs.get_config()
    c.env.num_users = num_users
    c.net.hidden = (16, 16)
    c.ppo.num_envs = 4
    c.ppo.rollout_len = 16
    c.ppo.minibatch_size = 16 * num_users
    c.ppo.updates_per_chunk = 2
    c.ppo.total_env_steps = 4 * 16 * 2
    c.log.checkpoint_every = 2
    c.log.progress = False
    return c


# ----------------------------------------------------------------------------- adapter

def test_adapter_adds_user_axis_decision_mask_and_final_observation():
    inner = Bandit(d=3, limit=3)
    env, params = single_agent.adapt(inner, None)
    assert env.sparse_decisions is False and env.action_spec(params).num_values == 3
    key = jax.random.key(0)
    obs, st = env.reset(key, params)
    obs_r, st_r = inner.reset(key, params)
    np.testing.assert_array_equal(np.asarray(obs), np.asarray(obs_r)[None])
    rng = np.random.default_rng(0)
    seen_trunc = 0
    for t in range(7):
        k = jax.random.key(100 + t)
        a = int(rng.integers(0, 3))
        obs, st, r, done, info = env.step(k, st, jnp.array([a], jnp.int32), params)
        o2, st_r, r2, term2, trunc2, info2 = inner.step(k, st_r, a, params)
        np.testing.assert_array_equal(np.asarray(obs), np.asarray(o2)[None])
        np.testing.assert_allclose(np.asarray(r), [float(r2)])
        assert obs.shape == (1, 3) and r.shape == (1,) and done.shape == (1,)
        assert info["decision_mask"].tolist() == [True]
        assert info["terminated"].tolist() == [bool(term2)]
        assert info["truncated"].tolist() == [bool(trunc2)]
        np.testing.assert_array_equal(np.asarray(info["final_observation"]),
                                      np.asarray(info2["final_observation"])[None])
        assert "discount" not in info            # gymnax's own field is not a metric
        seen_trunc += int(trunc2)
    assert seen_trunc == 2                      # cut at steps 3 and 6


def test_gymnax_cartpole_through_registry_matches_gymnax():
    gymnax = pytest.importorskip("gymnax")
    env, params = registry.make("gymnax", env_id="CartPole-v1", max_steps_in_episode=15)
    raw, raw_params = gymnax.make("CartPole-v1")
    raw_params = raw_params.replace(max_steps_in_episode=15)
    assert env.name == "CartPole-v1" and env.action_spec(params).num_values == 2
    obs, st = env.reset(jax.random.key(1), params)
    obs_r, st_r = raw.reset(jax.random.key(1), raw_params)
    step = jax.jit(env.step)
    cuts = 0
    for t in range(40):
        k = jax.random.key(t)
        a = t % 2                                # alternating: long episodes, cut at 15
        obs, st, r, done, info = step(k, st, jnp.array([a], jnp.int32), params)
        obs_r, st_r, r_r, term_r, trunc_r, info_r = raw.step(k, st_r, a, raw_params)
        np.testing.assert_allclose(np.asarray(obs)[0], np.asarray(obs_r), rtol=1e-6)
        assert bool(info["truncated"][0]) == bool(trunc_r and not term_r)
        assert bool(done[0]) == bool(term_r or trunc_r)
        np.testing.assert_allclose(np.asarray(info["final_observation"])[0],
                                   np.asarray(info_r["final_observation"]), rtol=1e-6)
        cuts += int(info["truncated"][0])
    assert cuts >= 1


# ----------------------------------------------------------------------------- bad shapes

def _one_line_bad(fn, *args):
    with pytest.raises(BadInput) as e:
        fn(*args)
    msg = cli.one_line(e.value)
    assert "\n" not in str(e.value)
    return msg


def test_bad_env_shapes_name_the_function_and_shape():
    cfg = _small_default_config()
    # single-agent: obs of rank 3, a vector reward, a continuous action space
    msg = _one_line_bad(trainer.build_setup, cfg, (Bandit(obs_shape=(2, 3, 4)), None))
    assert "Bandit.reset" in msg and "(2, 3, 4)" in msg
    msg = _one_line_bad(single_agent.adapt, Bandit(reward_shape=(3,)), None)
    assert "Bandit.step" in msg and "reward shape (3,)" in msg
    box = type("Box", (), {"shape": (2,), "low": 0.0, "high": 1.0})()
    msg = _one_line_bad(single_agent.adapt, Bandit(space=box), None)
    assert "Bandit.action_space" in msg and "not discrete" in msg

    # multi-user: a reward with the wrong user count, an action spec that is not discrete
    class WrongReward(NamedTuple):
        reset: object
        step: object
        name: str = "WrongReward"
    env, params = toy_env.make(num_users=4)

    def step(k, s, a, p):
        o, s, r, d, i = env.step(k, s, a, p)
        return o, s, jnp.concatenate([r, r]), d, i
    msg = _one_line_bad(trainer.build_setup, _small_default_config(4),
                        (WrongReward(env.reset, step), params))
    assert "WrongReward.step" in msg and "reward shape (8,)" in msg

    class NoDiscrete(NamedTuple):
        reset: object
        step: object
        action_spec: object
        name: str = "NoDiscrete"
    msg = _one_line_bad(trainer.build_setup, _small_default_config(4),
                        (NoDiscrete(env.reset, env.step, lambda p: box), params))
    assert "NoDiscrete.action_spec" in msg and "not a discrete" in msg


# ----------------------------------------------------------------------------- decision_only

def test_edge_env_declares_sparse_decisions_and_default_uses_them():
    env, _ = registry.make("edge")
    assert env.sparse_decisions is True
    setup = stage1.build_setup(ppo_configs.get_config("smoke"))
    assert setup.settings.decision_only and setup.settings.decision_capacity == 96


def test_dense_env_trains_on_every_sample_with_default_config(fast_compile):
    cfg = _small_default_config()
    assert cfg.ppo.decision_only is None        # the default: decided by the env
    env_params = single_agent.adapt(Bandit(d=3, limit=5), None)
    setup = trainer.build_setup(cfg, env_params)
    assert not setup.settings.decision_only

    def one_chunk(c):
        s = trainer.build_setup(c, env_params)
        states, m = trainer.make_jitted_chunk(s)(s.init_states(c), s.env_params)
        return states, {k: np.asarray(v) for k, v in m.items()}

    st_default, m_default = one_chunk(cfg)
    n = cfg.ppo.num_envs * cfg.ppo.rollout_len
    np.testing.assert_array_equal(m_default["decisions"], n)   # every sample is a decision
    np.testing.assert_array_equal(m_default["decision_overflow"], 0)
    # the same update as the explicit full-batch one ...
    full = _small_default_config()
    full.ppo.decision_only = False
    st_full, _ = one_chunk(full)
    for a, b in zip(jax.tree.leaves(st_default.params), jax.tree.leaves(st_full.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # ... and not the compacted one of the old default, which dropped 3/4 of the samples
    old = _small_default_config()
    old.ppo.decision_only = True
    st_old, m_old = one_chunk(old)
    assert m_old["decision_overflow"].min() == n - n // 4
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
               zip(jax.tree.leaves(st_old.params), jax.tree.leaves(st_full.params)))
    # the host loop stops such a run: one line naming the fields to set (exit 2)
    with pytest.raises(trainer.config_utils.ConfigError) as e:
        trainer._chunk_scalars({k: v for k, v in m_old.items()}, 0, None, n * 2)
    msg = str(e.value)
    assert "ppo.decision_capacity" in msg and "ppo.decision_only=False" in msg
    assert "\n" not in msg
    trainer._chunk_scalars(m_default, 0, None, n * 2)        # no overflow: no error


# ----------------------------------------------------------------------------- CartPole

@pytest.mark.slow  # a learning check (≈ 25 s); default: the adapter tests above; make test-all
def test_ppo_solves_cartpole_v1():
    """The learner through the documented path (adapter + build_setup, the ``gymnax`` config
    variant) reaches the solved return (mean ≥ 475 over the episodes of the last 10 updates)
    in 366 updates = 187 392 env steps, seed 0. CPU ≈ 12 s on one core (8 s of it compiling)."""
    pytest.importorskip("gymnax")
    cfg = ppo_configs.get_config("gymnax")
    cfg.seed = 0
    cfg.ppo.lr = 1e-3
    cfg.ppo.total_env_steps = 512 * 61 * 6       # 6 chunks of 61 updates
    env_params = single_agent.make_gymnax("CartPole-v1")
    setup = trainer.build_setup(cfg, env_params)
    assert not setup.settings.decision_only and setup.critic == "v"
    chunk = trainer.make_jitted_chunk(setup)
    states = setup.init_states(cfg)
    ep_sum, ep_n = [], []
    t0 = time.process_time()
    for _ in range(setup.total_chunks):
        states, m = chunk(states, setup.env_params)
        ep_sum.append(np.asarray(m["episode_return_sum"])[0])
        ep_n.append(np.asarray(m["episodes"])[0])
    ep_sum, ep_n = np.concatenate(ep_sum), np.concatenate(ep_n)
    first = ep_sum[:10].sum() / ep_n[:10].sum()
    last = ep_sum[-10:].sum() / ep_n[-10:].sum()
    print(f"CartPole: first 10 updates {first:.1f}, last 10 {last:.1f}, "
          f"CPU {time.process_time() - t0:.1f} s")
    assert first < 100                           # a random policy lasts ~22 steps
    assert last >= 475


# ----------------------------------------------------------------------------- rollout speed-ups

def test_sample_action_is_distrax_categorical():
    import distrax

    from prada_jax.rl import learner
    logits = jax.random.normal(jax.random.key(3), (6, 5, 4)) * 3.0

    @jax.jit   # both sides jitted: eagerly, every op compiles on its own
    def both(k):
        d = distrax.Categorical(logits=logits)
        want = d.sample(seed=k)
        return want, d.log_prob(want), *learner.sample_action(k, logits)

    for i in range(4):
        want, want_logp, got, logp = both(jax.random.key(10 + i))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        np.testing.assert_allclose(np.asarray(logp), np.asarray(want_logp), rtol=1e-6)


@pytest.mark.parametrize("critic", ["v", "q"])
def test_batched_critic_after_the_loop_equals_the_critic_in_the_loop(critic):
    """Without an action_fn the rollout evaluates the critic after the slot loop; the
    trajectory must equal the one with the critic inside the loop (an identity action_fn)."""
    from prada_jax.rl import learner, losses, networks
    env, params = toy_env.make(num_users=3, num_actions=3, episode_len=5, time_limit=2)
    graphdef, net = networks.init_network(jax.random.key(0), 3, (8,), True, 3, critic)
    apply_fn = networks.make_apply_fn(graphdef)
    s = learner.PPOSettings(num_envs=2, rollout_len=12, num_epochs=1, num_minibatches=1,
                            updates_per_chunk=1, gamma=0.9, gae_lambda=0.9,
                            loss=losses.PPOLossConfig())
    obs, st = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(1), 2),
                                                     params)
    args = (net, params, st, obs, jnp.zeros((2, 3)), jax.random.key(5))
    deferred = jax.jit(learner.make_rollout(s, env, apply_fn))(*args)[3]
    in_loop = jax.jit(learner.make_rollout(s, env, apply_fn, lambda a, g: a))(*args)[3]
    assert set(deferred) == set(in_loop) and "trunc_value" in deferred
    assert np.asarray(deferred["truncated"]).any()
    for k in in_loop:
        np.testing.assert_allclose(np.asarray(deferred[k], np.float64),
                                   np.asarray(in_loop[k], np.float64), rtol=1e-5, atol=1e-6,
                                   err_msg=k)
