"""Fixed-policy rollout evaluation (toy env), oracle labels (closed-form limits), label
classifier fit."""
import jax
import numpy as np

from prada_jax.rl import evaluate, networks, toy_env
from prada_jax.traces.testing import random_traces


def test_rollout_eval_constant_policies_on_toy_env():
    env, params = toy_env.make(num_users=4, threshold=0.3, episode_len=4)
    graphdef, net = networks.init_network(jax.random.key(0), 3, (8,))
    eval_fn = jax.jit(evaluate.make_rollout_eval(env, networks.make_apply_fn(graphdef),
                                                 num_envs=4, num_slots=200))
    key = jax.random.key(1)
    keep = evaluate.summarize(eval_fn(key, params, net, False, 0.0))
    nominate = evaluate.summarize(eval_fn(key, params, net, False, 1.0))
    assert keep["episode_return"] == 0.0 and keep["nominate_rate"] == 0.0
    assert nominate["nominate_rate"] == 1.0 and keep["episodes"] == nominate["episodes"] > 300
    # Nominating pays feat0 − c with feat0 ~ N(0, 1): 4 decisions per episode → −4c on average
    # (sd 2 per episode; > 300 episodes → standard error < 0.12).
    np.testing.assert_allclose(nominate["episode_return"], -4 * 0.3, atol=0.4)


def test_oracle_labels_limits():
    from envs import registry

    tr = random_traces(seed=0, problems=6, depth=4, feature_dim=5)
    _, p0 = registry.make("edge", traces=tr, num_users=2, beta=0.0)
    np.testing.assert_array_equal(evaluate.oracle_labels(p0),
                                  np.asarray(tr.cand_prm[:, 1] > tr.cand_prm[:, 0]))
    _, p_big = registry.make("edge", traces=tr, num_users=2, beta=1e9)
    assert not evaluate.oracle_labels(p_big).any()
    obs = evaluate.node_observations(p0)
    assert obs.shape == (tr.num_nodes, 5 + 2)
    np.testing.assert_array_equal(obs[:, 5], tr.depth)


def test_fit_label_classifier_separable():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 4)).astype(np.float32)
    y = x[:, 0] + 0.5 * x[:, 1] > 0.2
    _, acc = evaluate.fit_label_classifier(jax.random.key(0), x, y, (16,), steps=400,
                                           batch=256, lr=1e-2)
    assert acc > 0.95
