"""With U=1, no arrivals after the first and no limits, the env is the screening MDP."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from envs import edge
from prada_jax.traces.testing import random_traces

BETA = 0.7
TRACES = random_traces(seed=7, problems=6, depth=6, feature_dim=4, p_expand=0.6)


def _slm_s(new, cached, draft):
    """1.5B on 4e12 FLOP/s at η 0.3: prefill of the new tokens, then token-by-token decoding."""
    P, L, d = 1.31e9, 28, 1536
    pre = 2 * P * (new + cached) + 2 * L * d * (new + cached) ** 2 \
        - (2 * P * cached + 2 * L * d * cached ** 2)
    dec = sum(2 * P + 4 * L * d * j for j in range(new + cached, new + cached + draft))
    return (pre + dec) / (4e12 * 0.3)


def _llm_s(ctx, step):
    P, L, d = 6.53e9, 28, 3584
    dec = sum(2 * P + 4 * L * d * j for j in range(ctx, ctx + step))
    return (2 * P * ctx + 2 * L * d * ctx ** 2 + dec) / (3.12e14 * 0.3)


def _direct_return(tr, root, actions):
    """Walks the tree from ``root`` with ``actions`` (one per decision); plain Python."""
    node, kv, total, k = int(root), 0, 0.0, 0
    while True:
        a = actions[k % len(actions)]
        ctx, draft, llm = (int(tr.ctx_tokens[node]), int(tr.cand_tokens[node, 0]),
                           int(tr.cand_tokens[node, 1]))
        cached = min(kv, ctx)
        cost = _slm_s(ctx - cached, cached, draft) + (_llm_s(ctx, llm) if a else 0.0)
        total += float(tr.cand_prm[node, a]) - float(tr.prm[node]) - BETA * cost
        k += 1
        if tr.terminal[node, a]:
            return total, k
        kv = ctx + draft if a == 0 else ctx
        child = int(tr.child[node, a])
        node = child if child >= 0 else int(tr.fallback[node])


def test_single_user_return_equals_direct_sum():
    params = edge.make_params(TRACES, num_users=1, arrival_rate_hz=0.0, initial_users=1,
                              num_servers=1, bandwidth_hz=1e12, scheduler="offload_all",
                              beta=BETA, snr_threshold_db=-math.inf, reward_mode="coarse")
    step = jax.jit(edge.step)
    reset = jax.jit(edge.reset)
    rng = np.random.default_rng(0)
    checked = 0
    for episode in range(5):
        actions = [int(a) for a in rng.integers(0, 2, size=7)]
        key = jax.random.key(episode)
        _, state = reset(key, params)
        root = int(state.node[0])
        total, decisions, t = 0.0, 0, 0
        while True:
            a = jnp.array([actions[decisions % len(actions)]], jnp.int32)
            _, state, r, done, info = step(jax.random.fold_in(key, t), state, a, params)
            decisions += int(info["decision_mask"][0])
            total += float(r[0])
            t += 1
            if bool(done[0]):
                break
            assert t < 500
        want, n_dec = _direct_return(TRACES, root, actions)
        assert decisions == n_dec
        np.testing.assert_allclose(total, want, rtol=1e-5, atol=1e-6)
        # Afterwards nobody arrives and nothing happens.
        _, state, r, done, info = step(key, state, jnp.zeros(1, jnp.int32), params)
        assert not bool(state.active[0]) and float(r[0]) == 0.0
        assert int(info["arrived"]) == 1 and int(info["finished"]) == 1
        checked += 1
    assert checked == 5
