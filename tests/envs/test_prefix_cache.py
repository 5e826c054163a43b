"""The serving server's prefix cache (``envs.prefix_cache``, issue 51 item 1): LRU eviction
against a plain-Python loop, the env against the NumPy reference (which evicts user by user)
with a KV budget small enough that prefixes are evicted and re-prefilled, the budget
invariant every slot, a hit that prefills only the new tokens, and the default."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, prefix_cache, server_memory
from prada_jax import latency as lat
from prada_jax.errors import BadInput
from prada_jax.traces.testing import random_traces
from tests.helpers.edge_pair import (assert_users_conserved, jax_rollout, random_actions,
                                     replay_on_numpy)

PAIR = "a100_orin_int4"
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
U, M, T = 12, 3, 240
BASE = dict(num_users=U, tau_s=0.05, beta=0.2, lambda_s=0.0, mu=0.0, bandwidth_hz=20e6,
            arrival_rate_hz=8.0, initial_users=U, default_gain=0.05, max_wait_slots=20,
            rsd_threshold=0.7, downlink=True, ctx_scale=1e-3, num_servers=M,
            max_batched_tokens=64)


def _lru_by_hand(llm, prm, holds, ctx, used, budget, ratio):
    """Evicts users one at a time, least recently used first (ties: lower slot)."""
    llm, prm = list(llm), list(prm)
    pinned = sum(c for c, h in zip(ctx, holds) if h)
    own = {i: (0 if holds[i] else llm[i]) + prm[i] * ratio for i in range(len(llm))}
    own = {i: v for i, v in own.items() if v > 0}
    total, evicted = pinned + sum(own.values()), 0
    while total > budget and own:
        i = min(own, key=lambda k: (used[k], k))
        if not holds[i]:
            evicted += llm[i]
            llm[i] = 0
        evicted += prm[i]
        prm[i] = 0
        total -= own.pop(i)
    return llm, prm, evicted, total


@pytest.mark.parametrize("seed", range(6))
def test_evict_lru_matches_a_plain_loop(seed):
    rng = np.random.default_rng(seed)
    n = 16
    llm = rng.integers(0, 400, n) * (rng.random(n) < 0.7)
    prm = rng.integers(0, 300, n) * (rng.random(n) < 0.4)
    holds = rng.random(n) < 0.3
    ctx = rng.integers(50, 500, n).astype(np.float32)
    used = rng.integers(0, 6, n)                      # ties on purpose
    ratio = float(rng.choice([1.0, 0.5]))
    budget = float(np.sum(ctx[holds]) + rng.integers(0, 2000))
    got_llm, got_prm, st = jax.device_get(prefix_cache.evict_lru(
        jnp.asarray(llm, jnp.int32), jnp.asarray(prm, jnp.int32), jnp.asarray(holds),
        jnp.asarray(ctx), jnp.asarray(used, jnp.int32), jnp.float32(budget),
        jnp.float32(ratio)))
    want_llm, want_prm, evicted, total = _lru_by_hand(llm, prm, holds, ctx, used, budget, ratio)
    np.testing.assert_array_equal(got_llm, want_llm)
    np.testing.assert_array_equal(got_prm, want_prm)
    assert st["evicted_tokens"] == evicted
    np.testing.assert_allclose(st["kv_in_use_tokens"], total, rtol=1e-6)
    assert st["kv_in_use_tokens"] <= budget + 1e-3


def _tight_budget() -> float:
    """The smallest budget ``make_params`` accepts: M running sequences of the longest length
    (running sequences are shorter, so what they leave holds a few cached prefixes)."""
    return M * server_memory.longest_sequence(TRACES, "serving")


@pytest.mark.parametrize("sched,extra", [("offload_all", {}), ("rsd", {}),
                                         ("threshold", dict(reward_mode="true"))])
def test_eviction_matches_numpy_reference_and_holds_the_budget(sched, extra):
    """A KV budget smaller than the population's prefixes: the env evicts and re-prefills as
    the reference does (every slot's hits, evictions and KV in use compared), and the running
    sequences plus the cache never exceed the budget."""
    budget = _tight_budget()
    kw = dict(BASE, kv_budget_tokens=budget, reward_mode="coarse")
    kw.update(extra)
    params = edge.make_params(TRACES, scheduler=sched, hardware=PAIR, **kw)
    assert bool(params.server_kv_cache) and bool(params.prm_prefix_cache)   # the default
    screens, gains = random_actions(1, (1, T, U))
    if sched == "offload_all":
        screens = np.ones_like(screens)
    out = jax_rollout(1, params, screens, gains)
    replay_on_numpy(TRACES, dict(kw, scheduler=sched), params, screens, gains, out,
                    label=sched, info_tol=(2e-4, 1e-3))
    info = jax.tree.map(lambda v: np.asarray(v)[0], out[4][3])
    assert info["evicted_tokens"].sum() > 0                 # the budget binds
    assert info["prefix_hit_tokens"].sum() > 0              # and the cache still serves hits
    assert np.all(info["kv_in_use_tokens"] <= budget + 1e-3)
    assert np.all(info["kv_pinned_tokens"] <= info["kv_in_use_tokens"] + 1e-3)
    assert_users_conserved(info, np.asarray(out[4][2])[0])


def test_eviction_is_charged_as_a_reprefill():
    """The same arrivals and actions with the memory's budget and with a tight one: the tight
    budget evicts, serves fewer prefix tokens from the cache and prefills more."""
    screens, gains = random_actions(2, (1, T, U))
    screens = np.ones_like(screens)
    totals = {}
    for name, budget in (("memory", None), ("tight", _tight_budget())):
        params = edge.make_params(TRACES, scheduler="offload_all", hardware=PAIR,
                                  kv_budget_tokens=budget, **BASE)
        info = jax.tree.map(lambda v: np.asarray(v)[0], jax_rollout(2, params, screens,
                                                                     gains)[4][3])
        totals[name] = {k: float(info[k][:120].sum()) for k in
                        ("evicted_tokens", "prefix_hit_tokens", "prefill_tokens")}
    assert totals["memory"]["evicted_tokens"] == 0
    assert totals["tight"]["evicted_tokens"] > 0
    assert totals["tight"]["prefix_hit_tokens"] < totals["memory"]["prefix_hit_tokens"]
    assert totals["tight"]["prefill_tokens"] > totals["memory"]["prefill_tokens"]


def test_a_hit_prefills_only_the_new_tokens_and_uploads_the_whole_context():
    params = edge.make_params(TRACES, scheduler="offload_all", hardware=PAIR, num_users=4,
                              num_servers=2, initial_users=4)
    _, s = edge.reset(jax.random.key(0), params)
    tr = params.traces
    n = np.asarray(tr.child)[np.asarray(tr.root)[:4], 0]       # a node one step down
    n = np.where(n >= 0, n, np.asarray(tr.root)[:4])
    ctx = np.asarray(tr.ctx_tokens)[n]
    cached = np.array([0, 5, ctx[2], ctx[3] + 50])             # none, some, all, more than ctx
    s = s.replace(node=jnp.asarray(n, jnp.int32), server_cached=jnp.asarray(cached, jnp.int32))
    req = jax.device_get(edge.request_scalars(s, params, jnp.ones(4, jnp.float32)))
    hit = np.minimum(cached, ctx)
    np.testing.assert_array_equal(req["cached_tokens"], hit)
    np.testing.assert_array_equal(req["prefill_tokens"], ctx - hit)
    np.testing.assert_array_equal(req["upload_tokens"], ctx)
    lp = params.latency
    want = jax.device_get(lat.roofline_prefill_flops(lp.llm, jnp.asarray(ctx - hit),
                                                     jnp.asarray(hit)))
    np.testing.assert_allclose(req["pf_flops"], want, rtol=1e-6)
    assert np.all(req["pf_flops"][2:] == 0) and np.all(req["pf_flops"][:2] > 0)
    # the no-cache ablation prefills everything
    off = params.replace(server_kv_cache=jnp.asarray(False))
    req0 = jax.device_get(edge.request_scalars(s, off, jnp.ones(4, jnp.float32)))
    np.testing.assert_array_equal(req0["prefill_tokens"], ctx)


def test_defaults_and_bad_budget():
    serving = edge.make_params(TRACES, hardware=PAIR, num_users=4)
    assert bool(serving.server_kv_cache) and bool(serving.prm_prefix_cache)
    lp = lat.pair_latency_params(PAIR)
    free = (lp.server_hw.mem_bytes - lat.model_weight_bytes(lp.llm, lp.server_hw)
            - lat.model_weight_bytes(lp.prm, lp.server_hw))
    assert float(serving.kv_budget_tokens) == pytest.approx(
        np.floor(free / lat.kv_bytes_per_token(lp.llm, lp.server_hw)), rel=1e-6)
    legacy = edge.make_params(TRACES, hardware=PAIR, num_users=4, server_model="legacy")
    assert not bool(legacy.server_kv_cache) and np.isinf(float(legacy.kv_budget_tokens))
    assert not bool(edge.make_params(TRACES, num_users=4).server_kv_cache)   # paper clock
    with pytest.raises(BadInput, match="kv_budget_tokens"):
        edge.make_params(TRACES, hardware=PAIR, num_users=4, num_servers=M,
                         kv_budget_tokens=10.0)


def test_a_move_through_a_fallback_keeps_only_the_prompt_cached():
    """A kept draft whose child was not expanded continues from the trace's fallback node (a
    different path of the same problem): the server's prefixes of that user shrink to the
    problem's prompt; a user on an expanded child keeps them."""
    tr = TRACES
    child, term = np.asarray(tr.child), np.asarray(tr.terminal).astype(bool)
    fb_nodes = np.flatnonzero((child[:, 0] < 0) & ~term[:, 0])
    ok_nodes = np.flatnonzero((child[:, 0] >= 0) & ~term[:, 0])
    assert fb_nodes.size and ok_nodes.size
    n = np.array([fb_nodes[0], ok_nodes[0]])
    params = edge.make_params(TRACES, scheduler="keep_local", hardware=PAIR, num_users=2,
                              num_servers=2, initial_users=2)
    _, s = edge.reset(jax.random.key(0), params)
    big = 10 ** 5
    s = s.replace(node=jnp.asarray(n, jnp.int32), phase=jnp.full(2, edge.DECIDE, jnp.int32),
                  server_cached=jnp.full(2, big, jnp.int32), prm_cached=jnp.full(2, big, jnp.int32))
    _, s2, _, _, _ = edge.step(jax.random.key(1), s, jnp.zeros(2, jnp.int32), params)
    prompt = np.asarray(tr.ctx_tokens)[np.asarray(tr.root)[np.asarray(tr.problem)[n]]]
    assert int(s2.node[0]) == int(np.asarray(tr.fallback)[n[0]])
    np.testing.assert_array_equal(np.asarray(s2.server_cached), [prompt[0], big])
    np.testing.assert_array_equal(np.asarray(s2.prm_cached), [prompt[0], big])
