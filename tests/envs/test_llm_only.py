"""The paper's All-LLM baseline (``llm_only``), the server LLM alone, against plain Python."""
import math

import jax
import jax.numpy as jnp
import pytest

from envs import edge
from envs.edge_numpy import EdgeEnvNumPy, LatencyConsts, flops_decode, flops_prefill
from prada_jax.traces.testing import random_traces

TAU = 0.05
# One structure-only random trace set (35 nodes, 4 problems) and one compiled step for every
# case here (the env params differ only in array leaves).
TRACES = random_traces(seed=1, problems=4, depth=4, feature_dim=3)
_reset = jax.jit(edge.reset)
_step = jax.jit(edge.step_with_noise)


def _plain_latency(tr, root, snr, consts: LatencyConsts, bandwidth_hz, beta=0.0):
    """Slots the server LLM alone needs for the problem at ``root``: each step uploads what the
    server has not seen (the prompt, then nothing: it keeps the context it generated),
    prefills it, decodes the LLM's step and sends it down; a step takes max(1, ceil(D/τ))
    slots. Returns (latency s, communication s, correct, rewards): ``rewards`` are the
    ``true``-mode rewards of the steps, ΔPRM of the LLM's step − β·(server compute + upload +
    download) [PRM units]: no edge draft is computed, so none is charged (and no wait: one
    user, one free server)."""
    c = consts
    se = math.log2(1.0 + snr)
    node, server_cached, slots, comm, rewards = int(root), 0, 0, 0.0, []
    while True:
        ctx = int(tr.ctx_tokens[node])
        ltok = int(tr.cand_tokens[node][1])
        cached = min(server_cached, ctx)
        up = ctx - cached
        bw = min(max(up * c.bits_per_token / (se * c.uplink_target_s), c.min_request_hz),
                 bandwidth_hz)
        t_up = up * c.bits_per_token / (bw * se)
        t_dn = ltok * c.bits_per_token / (bw * se)
        t_srv = ((flops_prefill(c.llm, up, cached) + flops_decode(c.llm, ltok, ctx))
                 / (c.server_peak_flops * c.server_eta))
        d = t_up + t_srv + t_dn
        rewards.append(float(tr.cand_prm[node][1]) - float(tr.prm[node]) - beta * d)
        k = max(1, math.ceil(d / TAU))
        slots += k
        comm += k * TAU * (t_up + t_dn) / d
        server_cached = ctx + ltok
        if tr.terminal[node][1]:
            return slots * TAU, comm, bool(tr.correct[node][1]), rewards
        ch = int(tr.child[node][1])
        node = ch if ch >= 0 else int(tr.fallback[node])


BETA = 2.0   # PRM units per second: large, so a wrongly charged draft moves the reward a lot


def test_llm_alone_latency_and_reward_match_plain_python():
    """Every problem of the trace set (its initial user drawn by the reset key): latency,
    communication, correctness and each step's reward (``true`` mode: the draft the server
    LLM alone never computes is not charged; the drafting env's reward differs by β × its
    draft delay, so the check can fail)."""
    tr = TRACES
    bw = 1e9
    params = edge.make_params(tr, num_users=1, scheduler="offload_all", num_servers=1,
                              bandwidth_hz=bw, arrival_rate_hz=0.0, initial_users=1,
                              tau_s=TAU, max_wait_slots=10 ** 6, server_kv_cache=True,
                              llm_only=True, snr_threshold_db=-math.inf, beta=BETA,
                              reward_mode="true")
    starts = {}
    for seed in range(64):
        _, state = _reset(jax.random.key(seed), params)
        starts.setdefault(int(state.node[0]), state)
    assert sorted(starts) == sorted(int(r) for r in tr.root)
    noise = edge.Noise(u_arrival=jnp.float32(0.0), problem=jnp.zeros((1,), jnp.int32),
                       fading=jnp.ones((1,), jnp.float32), u_sched=jnp.zeros((1,), jnp.float32))
    snr = EdgeEnvNumPy(tr, dict(num_users=1, scheduler="offload_all"),
                       LatencyConsts(snr_threshold_db=-math.inf)).snr_bar
    for root, state in starts.items():
        assert int(state.phase[0]) == edge.DECIDE  # no draft: decides at once
        assert float(state.draft_s[0]) == 0.0
        info, rewards = None, []
        for _ in range(10_000):
            _, state, reward, done, info = _step(state, jnp.ones((1,), jnp.int32), params,
                                                 noise)
            if bool(info["decision_mask"][0]):   # resolved at once: one free server
                rewards.append(float(reward[0]))
            else:
                assert float(reward[0]) == 0.0
            if bool(done[0]):
                break
        assert bool(done[0])
        want_lat, want_comm, want_correct, want_rewards = _plain_latency(
            tr, root, snr, LatencyConsts(), bw, beta=BETA)
        assert rewards == pytest.approx(want_rewards, rel=1e-5, abs=1e-6), root
        assert float(info["user_latency_s"][0]) == pytest.approx(want_lat, rel=1e-6), root
        assert float(info["user_communication_s"][0]) == pytest.approx(want_comm, rel=1e-4)
        assert float(info["user_queueing_s"][0]) == 0.0
        assert bool(info["user_correct"][0]) == want_correct
        assert int(info["user_offloads"][0]) == int(info["user_steps"][0])


def test_outage_waits_instead_of_keeping_a_draft():
    """With every slot in outage the LLM-alone user waits; the drafting env keeps the draft."""
    tr = TRACES
    kw = dict(num_users=1, scheduler="offload_all", arrival_rate_hz=0.0, initial_users=1,
              max_wait_slots=10 ** 6, server_kv_cache=True, snr_threshold_db=200.0)
    noise = edge.Noise(u_arrival=jnp.float32(0.0), problem=jnp.zeros((1,), jnp.int32),
                       fading=jnp.ones((1,), jnp.float32), u_sched=jnp.zeros((1,), jnp.float32))
    for llm_only, want in ((True, edge.QUEUE), (False, edge.LOCAL)):
        params = edge.make_params(tr, llm_only=llm_only, **kw)
        _, state = _reset(jax.random.key(0), params)
        for _ in range(30):
            _, state, _, _, info = _step(state, jnp.ones((1,), jnp.int32), params, noise)
            if bool(info["decision_mask"][0]):
                break
        assert int(info["decision"][0]) == want and bool(info["outage"][0])
