"""Monte-Carlo policy evaluation (``evals.policy_eval``) against an exact plain-Python
enumeration of the per-user screening MDP, and the critic refit.

The reference below walks the trace tree with float64 latency formulas from the NumPy
reference env (``envs.edge_numpy``): Q(n, kv, a) = r(n, kv, a) + γ·Σ_a' π(a'|n')·Q(n', kv', a'),
with the SLM cache kv' after a kept draft (ctx + draft tokens) or an LLM step (ctx), so it
shares no code with the JAX env or the estimator."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge_numpy as ref
from envs import registry
from prada_jax.rl import critic_fit, networks
from evals import policy_eval as pe
from prada_jax.traces.testing import random_traces

BETA = 0.5


# these tiny rollouts are compile-bound: fewer XLA optimisations (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_compile")


def _env(users=4, seed=0):
    tr = random_traces(seed=seed, problems=5, depth=5, feature_dim=6)
    env, params = registry.make(
        "edge", traces=tr, num_users=users, beta=BETA, reward_mode="coarse",
        scheduler="offload_all", num_servers=users, bandwidth_hz=1e15,
        arrival_rate_hz=100.0 * users / 0.05, snr_threshold_db=-math.inf)
    return tr, env, params


def _policy(obs_dim, seed=0):
    graphdef, net = networks.init_network(jax.random.key(seed), obs_dim, (16,))
    apply_fn = networks.make_apply_fn(graphdef)
    # Scale the policy head so the policy is far from uniform (both actions still occur).
    net = jax.tree_util.tree_map_with_path(
        lambda p, x: x * 300.0 if "policy_head" in jax.tree_util.keystr(p) else x, net)
    return apply_fn, net


def _reference_q(tr, params, probs, node, draft_s, gamma):
    """Exact Q(node, ·) [2] of the policy with nominate-probabilities ``probs`` [num_nodes]
    (float64 enumeration of the tree; ``draft_s`` = the current node's draft delay [s])."""
    c = ref.consts_from_jax(params.latency)
    ctx, tok = np.asarray(tr.ctx_tokens), np.asarray(tr.cand_tokens)
    cprm, prm = np.asarray(tr.cand_prm, np.float64), np.asarray(tr.prm, np.float64)
    child, term, fb = np.asarray(tr.child), np.asarray(tr.terminal), np.asarray(tr.fallback)

    def draft(n, kv):
        kv = min(kv, ctx[n])
        fl = ref.flops_prefill(c.slm, ctx[n] - kv, kv) + ref.flops_decode(c.slm, tok[n, 0], ctx[n])
        return fl / (c.edge_peak_flops * c.edge_eta)

    def server(n):
        fl = ref.flops_prefill(c.llm, ctx[n], 0) + ref.flops_decode(c.llm, tok[n, 1], ctx[n])
        return fl / (c.server_peak_flops * c.server_eta)

    def q(n, d, a):
        r = cprm[n, a] - prm[n] - BETA * (d + a * server(n))
        if term[n, a]:
            return r
        nxt = child[n, a] if child[n, a] >= 0 else fb[n]
        kv = ctx[n] + tok[n, 0] if a == 0 else ctx[n]
        dn = draft(nxt, kv)
        p = probs[nxt]
        return r + gamma * ((1 - p) * q(nxt, dn, 0) + p * q(nxt, dn, 1))

    return np.array([q(node, draft_s, 0), q(node, draft_s, 1)])


def _node_probs(apply_fn, net, params, tr):
    obs = np.concatenate([np.asarray(tr.feat, np.float32),
                          np.asarray(tr.depth, np.float32)[:, None],
                          np.asarray(tr.ctx_tokens, np.float32)[:, None] * float(params.ctx_scale)],
                         axis=1)
    logits, _ = apply_fn(net, jnp.asarray(obs))
    return np.asarray(jax.nn.softmax(logits, axis=-1)[:, 1], np.float64), \
        np.asarray(jnp.argmax(logits, axis=-1) == 1, np.float64)


@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_mc_greedy_is_the_exact_enumeration(gamma):
    tr, env, params = _env()
    apply_fn, net = _policy(params.obs_dim)
    ds = pe.sample_decision_states(env, params, apply_fn, net, jax.random.key(3), num_states=40,
                                   num_envs=2, num_slots=60, burn_in=5)
    mc = pe.mc_action_values(env, params, apply_fn, net, ds, jax.random.key(4), gamma=gamma,
                             batch=32)
    assert mc.unfinished == 0
    _, greedy = _node_probs(apply_fn, net, params, tr)
    nodes = np.asarray(ds.state.node)[:, 0]
    drafts = np.asarray(ds.state.draft_s, np.float64)[:, 0]
    want = np.stack([_reference_q(tr, params, greedy, n, d, gamma) for n, d in zip(nodes, drafts)])
    np.testing.assert_allclose(mc.q, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mc.dq, want[:, 1] - want[:, 0], rtol=1e-4, atol=1e-5)
    assert np.all(mc.dq_se == 0)
    # The states are decision points of users with different nodes (not one state repeated).
    assert len(set(nodes.tolist())) > 10
    assert np.all(np.asarray(ds.state.phase)[:, 0] == 2)   # DECIDE


def test_mc_sampling_policy_matches_the_expectation_within_its_error():
    tr, env, params = _env(seed=1)
    apply_fn, net = _policy(params.obs_dim, seed=1)
    # drawn with the greedy test's sizes (its eager gathers are compiled once for both), then
    # the first 4 states evaluated
    ds = pe.sample_decision_states(env, params, apply_fn, net, jax.random.key(5), num_states=40,
                                   num_envs=2, num_slots=60, burn_in=5)
    ds = jax.tree.map(lambda x: np.asarray(x)[:4], ds)
    mc = pe.mc_action_values(env, params, apply_fn, net, ds, jax.random.key(6), greedy=False,
                             replicates=800, batch=6400)
    probs, _ = _node_probs(apply_fn, net, params, tr)
    assert 0.05 < probs.mean() < 0.95
    nodes = np.asarray(ds.state.node)[:, 0]
    drafts = np.asarray(ds.state.draft_s, np.float64)[:, 0]
    want = np.stack([_reference_q(tr, params, probs, n, d, 1.0) for n, d in zip(nodes, drafts)])
    dq = want[:, 1] - want[:, 0]
    # 4.5 standard errors: a false failure has probability < 1e-4 per state.
    assert np.all(np.abs(mc.dq - dq) <= 4.5 * mc.dq_se + 1e-6), (mc.dq, dq, mc.dq_se)
    assert np.all(mc.dq_se > 0)
    # Same key → the same numbers (the per-slot keys are fixed by state, replicate and slot).
    again = pe.mc_action_values(env, params, apply_fn, net, ds, jax.random.key(6), greedy=False,
                                replicates=800, batch=6400)
    np.testing.assert_array_equal(again.q, mc.q)


def test_compare_on_a_constructed_case():
    m = np.array([0.2, -0.1, 0.05, -0.3, 0.4])
    mc = pe.MCResult(q=np.stack([np.zeros(5), m], 1), dq=m, dq_se=np.zeros(5), unfinished=0)
    nom = np.array([True, True, False, False, True])
    same = pe.compare(m, mc, nom)
    assert same["sign_agree"] == 1.0 and abs(same["pearson"] - 1) < 1e-12 and same["bias"] == 0
    assert same["rule_gain"]["critic"] == pytest.approx((0.2 + 0.05 + 0.4) / 5)
    assert same["rule_gain"]["actor"] == pytest.approx((0.2 - 0.1 + 0.4) / 5)
    assert same["rule_gain"]["actor_and_critic"] == pytest.approx((0.2 + 0.4) / 5)
    assert same["nom_critic_neg"] == 1 and same["nom_critic_neg_mc_mean"] == pytest.approx(-0.1)
    flipped = pe.compare(-m, mc, nom)
    assert flipped["sign_agree"] == 0.0 and flipped["bias"] == pytest.approx(-2 * m.mean())
    assert flipped["nom_mc_positive"] == pytest.approx(2 / 3)


def test_refit_moves_only_the_critic_and_fits_the_targets():
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2000, 5)).astype(np.float32)
    y = np.stack([0.1 * obs[:, 0], 0.1 * obs[:, 0] + 0.2 * np.tanh(obs[:, 1])], 1)
    graphdef, net = networks.init_network(jax.random.key(0), 5, (32, 32))
    apply_fn = networks.make_apply_fn(graphdef)
    new, info = critic_fit.refit_critic(apply_fn, net, obs[200:], y[200:], jax.random.key(1), steps=1500,
                                batch_size=256, lr=3e-3, val_obs=obs[:200],
                                val_targets=y[:200], eval_every=500)
    mask = critic_fit.critic_mask(net)
    for old_leaf, new_leaf, m in zip(jax.tree.leaves(net), jax.tree.leaves(new),
                                     jax.tree.leaves(mask)):
        if m:
            assert not np.array_equal(old_leaf, new_leaf)
        else:
            np.testing.assert_array_equal(old_leaf, new_leaf)
    assert any(jax.tree.leaves(mask)) and not all(jax.tree.leaves(mask))
    _, q = apply_fn(new, jnp.asarray(obs[:200]))
    dq = np.asarray(q[:, 1] - q[:, 0])
    want = y[:200, 1] - y[:200, 0]
    assert np.corrcoef(dq, want)[0, 1] > 0.95
    assert info["val"][-1][1] < 0.1 * info["val"][0][1]
