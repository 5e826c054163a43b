"""The jitted PPO chunk on the toy env: compiles once, vmaps over seeds, is deterministic,
learns the known optimal screening rule, and resumes exactly from a checkpoint."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from envs import stage1
from prada_jax import checkpointing, tree_leaves
from prada_jax.rl import learner, trainer
from prada_jax.configs import ppo as ppo_configs


@pytest.fixture(scope="module")
def toy():
    # Fewer XLA optimisations: halves the compile time of this tiny chunk on CPU.
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    config = ppo_configs.get_config("toy")
    config.num_seeds = 2
    setup = stage1.build_setup(config)
    chunk = learner.make_train_chunk(setup.settings, setup.env, setup.apply_fn, setup.tx)
    chex.clear_trace_counter()
    traced = chex.assert_max_traces(chunk, n=1)
    jitted = jax.jit(jax.vmap(traced, in_axes=(0, None)), donate_argnums=0)
    yield config, setup, jitted
    jax.config.update("jax_disable_most_optimizations", old)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree_leaves.keys_to_data(tree))]


def test_chunk_shapes_seeds_and_determinism(toy):
    config, setup, chunk = toy
    a, ma = chunk(setup.init_states(config), setup.env_params)
    a, ma2 = chunk(a, setup.env_params)   # second call: no retrace (assert_max_traces)
    b, mb = chunk(setup.init_states(config), setup.env_params)
    b, mb2 = chunk(b, setup.env_params)
    k = setup.settings.updates_per_chunk
    chex.assert_shape(ma["policy_loss"], (2, k))
    chex.assert_tree_all_finite({k_: v for k_, v in ma2.items() if not k_.startswith("env/")})
    for x, y in zip(_leaves(a), _leaves(b)):
        np.testing.assert_array_equal(x, y)
    for name in ma2:
        np.testing.assert_array_equal(np.asarray(ma2[name]), np.asarray(mb2[name]))
    # The two seeds are different runs.
    assert not np.allclose(np.asarray(ma2["policy_loss"][0]), np.asarray(ma2["policy_loss"][1]))
    np.testing.assert_array_equal(np.asarray(a.update_step), [2 * k, 2 * k])
    per_update = setup.settings.num_envs * setup.settings.rollout_len
    np.testing.assert_array_equal(np.asarray(ma2["env_steps"][0]),
                                  per_update * np.arange(k + 1, 2 * k + 1))


def test_resume_from_checkpoint_is_exact(toy, tmp_path):
    config, setup, chunk = toy
    ref, _ = chunk(setup.init_states(config), setup.env_params)
    ref, ref_m = chunk(ref, setup.env_params)

    st, _ = chunk(setup.init_states(config), setup.env_params)
    with checkpointing.Checkpointer(tmp_path / "ck") as ck:
        ck.save(1, st)
    del st
    with checkpointing.Checkpointer(tmp_path / "ck") as ck:
        restored, _ = ck.restore(setup.init_states(config))
    out, out_m = chunk(restored, setup.env_params)
    for x, y in zip(_leaves(ref), _leaves(out)):
        np.testing.assert_array_equal(x, y)
    for name in ref_m:
        np.testing.assert_array_equal(np.asarray(ref_m[name]), np.asarray(out_m[name]))


def test_learns_optimal_screening_rule_on_toy_env(toy):
    """Toy env: nominating pays feat0 − c. Expected reward per decision of the greedy policy
    (by Monte Carlo over fresh features) vs all-keep (0), all-nominate (−c), random
    (−c/2) and the optimum E[max(Z − c, 0)] (closed form)."""
    config, setup, chunk = toy
    st = setup.init_states(config)
    for _ in range(30):
        st, m = chunk(st, setup.env_params)
    c = float(config.env.toy_threshold)
    feats = jax.random.normal(jax.random.key(123), (20000, 3))
    for seed in range(2):
        params = jax.tree.map(lambda x: x[seed], st.params)
        logits, q = setup.apply_fn(params, feats)
        act = np.asarray(jnp.argmax(logits, -1))
        f0 = np.asarray(feats[:, 0])
        value = float(np.mean(act * (f0 - c)))
        optimum = norm.pdf(c) - c * (1 - norm.cdf(c))
        assert value > max(0.0, -c, -c / 2) + 0.1
        assert value >= 0.9 * optimum, (seed, value, optimum)
        # The critic's ΔQ ranks steps by their true gain (PRM-unit analogue).
        gain = np.asarray(q[:, 1] - q[:, 0])
        assert np.corrcoef(gain, f0)[0, 1] > 0.8
