"""The legacy batching server of the roofline clock (``envs.servers.legacy.serve_slot``,
``server_model="legacy"``, the server of the results before issue 41): against a direct
computation, against the NumPy reference env, and its invariants (M sequences, no user lost).
The serving server has its own tests (``test_serving.py``)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge
from envs.servers import legacy
from envs.edge_numpy import EdgeEnvNumPy, consts_from_jax
from envs.testing import rollout
from prada_jax import latency as lat
from prada_jax.errors import BadInput
from prada_jax.traces.testing import random_traces
from tests.helpers.edge_pair import (assert_users_conserved, jax_rollout, random_actions,
                                     replay_on_numpy)

S, T, U = 2, 240, 8
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
PAIR = "a100_orin_int4"
FULL_DEFAULTS = dict(num_users=U, tau_s=0.05, beta=0.2, lambda_s=0.0, mu=0.0, num_servers=4,
                     bandwidth_hz=20e6, arrival_rate_hz=4.0, initial_users=U, default_gain=0.05,
                     max_wait_slots=20, rsd_threshold=0.7, reward_mode="coarse",
                     server_kv_cache=False, downlink=True, ctx_scale=1e-3,
                     server_model="legacy")
# A100 at bf16 serving Qwen2.5-7B, written out here from the datasheet figures and the model
# shape (not read from prada_jax.latency): weights 7.075e9 · 2 B, KV 2·28·4·128·2 B per token.
A100_BW = 2.039e12 * 0.8
A100_FLOPS = 312e12 * 0.5
W_7B = (6.53e9 + 152064 * 3584) * 2.0
KV_7B = 2 * 28 * 4 * 128 * 2.0


def _step_by_hand(contexts):
    flops = sum(2 * 6.53e9 + 4 * 28 * 3584 * c for c in contexts)
    return max(flops / A100_FLOPS, (W_7B + KV_7B * sum(contexts)) / A100_BW)


def _params(**kw):
    return edge.make_params(TRACES, **dict(dict(num_users=U, hardware=PAIR,
                                                server_model="legacy"), **kw))


def _job(n, **kw):
    z = np.zeros(n, np.float32)
    return edge.ServiceJob(**{k: jnp.asarray(kw.get(k, z), jnp.float32)
                              for k in ("up_s", "prefill_s", "dec_tok", "ctx", "down_s")})


def _serve_until_done(params, job, max_slots=200):
    """Runs ``_serve_slot`` until every job is done; returns (slots each job took, comm s)."""
    n = job.up_s.shape[0]
    in_svc = jnp.ones(n, bool)
    slots, comm = np.zeros(n, int), np.zeros(n)
    fn = jax.jit(lambda j, m: legacy.serve_slot(j, m, params))
    for _ in range(max_slots):
        if not np.asarray(in_svc).any():
            return slots, comm
        job, c, left = fn(job, in_svc)
        slots += np.asarray(in_svc)
        comm += np.asarray(c)
        in_svc = left
    raise AssertionError("jobs did not finish")


@pytest.mark.parametrize("tokens", [(40, 120), (10, 25, 60, 60, 200)], ids=["two", "five"])
def test_decode_only_jobs_against_direct_computation(tokens):
    """Jobs that only decode (known tokens, contexts 300): by hand, every slot the b jobs with
    tokens left each decode τ / step(b, contexts) tokens; a job's slot count is the slot in which
    its tokens run out."""
    params = _params()
    tau = 0.05
    n = len(tokens)
    slots, comm = _serve_until_done(
        params, _job(n, dec_tok=np.array(tokens, np.float32), ctx=np.full(n, 300.0, np.float32)))
    # Plain-Python replay of the rule.
    left, ctx, want = list(map(float, tokens)), [300.0] * n, [0] * n
    t = 0
    while any(x > 0 for x in left):
        t += 1
        active = [i for i in range(n) if left[i] > 0]
        per = tau / _step_by_hand([ctx[i] for i in active])
        for i in active:
            k = min(left[i], per)
            left[i] -= k
            ctx[i] += k
            if left[i] <= 0:
                want[i] = t
    np.testing.assert_array_equal(slots, want)
    np.testing.assert_array_equal(comm, 0.0)
    # Memory-bound at these sizes: a slot holds ~5 tokens per sequence whatever the batch,
    # so the 200-token job takes about as long alone as in a batch of five.
    assert abs(_step_by_hand([300.0] * n) / _step_by_hand([300.0]) - 1) < 0.1


def test_prefill_stalls_the_batch_and_upload_download_are_communication():
    """Job 0 decodes 30 tokens; job 1 arrives with 10 ms upload, 20 ms prefill, 5 tokens and
    4 ms download. Slot 1: job 1 uploads 10 ms, prefills 20 ms; job 0's decode window is
    τ − 20 ms (the prefill stalls it); job 1 decodes in τ − 10 − 20 ms; both at step(b=2)."""
    params = _params()
    tau = 0.05
    job = _job(2, up_s=np.array([0, 0.010]), prefill_s=np.array([0, 0.020]),
               dec_tok=np.array([30, 5]), ctx=np.array([200, 100]),
               down_s=np.array([0, 0.004]))
    new, comm, left = jax.jit(lambda j: legacy.serve_slot(j, jnp.ones(2, bool), params))(job)
    step = _step_by_hand([200.0, 100.0])
    n0 = (tau - 0.020) / step
    n1 = (tau - 0.010 - 0.020) / step
    np.testing.assert_allclose(np.asarray(new.dec_tok), [30 - n0, max(5 - n1, 0)], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(new.prefill_s), [0, 0], atol=1e-9)
    if n1 >= 5:      # job 1 finished decoding: it downloads in what its decode left
        spare = tau - 0.030 - 5 * step
        np.testing.assert_allclose(float(comm[1]), 0.010 + min(0.004, spare), rtol=1e-5)
    else:
        np.testing.assert_allclose(float(comm[1]), 0.010, rtol=1e-5)
    assert float(comm[0]) == 0.0 and bool(left[0])


def _run_pair(sched, cfg, seed, hardware=PAIR):
    params = edge.make_params(TRACES, num_users=U, scheduler=sched, hardware=hardware,
                              server_model="legacy", **cfg)
    screens, gains = random_actions(seed, (S, T, U))
    out = jax_rollout(seed, params, screens, gains)
    finished, _, _ = replay_on_numpy(TRACES, dict(FULL_DEFAULTS, scheduler=sched, **cfg), params,
                                     screens, gains, out, label=sched)
    _, _, _, _, (_, _, d, info) = out
    return finished, info, d


@pytest.mark.parametrize("sched,cfg", [
    ("threshold", dict(num_servers=3, arrival_rate_hz=8.0, reward_mode="true")),
    ("offload_all", dict(num_servers=2, bandwidth_hz=3e6, arrival_rate_hz=8.0,
                         max_wait_slots=5, server_kv_cache=True)),
    ("rsd", dict(num_servers=4, arrival_rate_hz=6.0)),
], ids=["threshold", "offload_all", "rsd"])
def test_jax_env_matches_numpy_reference_under_roofline(sched, cfg):
    finished, info, d = _run_pair(sched, cfg, seed=0)
    assert finished >= 10
    m = cfg["num_servers"]
    # The M concurrent sequences are never exceeded; no user is lost; the split sums.
    assert info["server_in_use"].max() <= m
    assert info["server_in_use"].max() == m        # the limit binds at this load
    assert_users_conserved(info, d)


def test_paper_and_roofline_share_no_compile_across_profiles():
    """Profiles of the same kind are array leaves: swapping the pair does not retrace."""
    from envs import testing as env_testing
    a = edge.make_params(TRACES, num_users=U, hardware="a100_orin_int4")
    b = edge.make_params(TRACES, num_users=U, hardware="a100_phone_int4")
    keys = jax.random.split(jax.random.key(0), S)
    screens = np.zeros((S, 4, U), np.int32)
    gains = np.zeros((S, 4, U), np.float32)
    rollout(keys, a, screens, gains)
    n = env_testing.TRACE_COUNT[0]
    rollout(keys, b, screens, gains)
    assert env_testing.TRACE_COUNT[0] == n


def test_m_beyond_kv_memory_is_bad_input():
    lp = lat.pair_latency_params(PAIR)
    longest = float(np.max(np.asarray(TRACES.ctx_tokens) + np.asarray(TRACES.cand_tokens)[:, 1]))
    cap = lat.max_sequences(lp, longest)
    # By hand: (80 GB − 14.15 GB) / (57 344 B · longest).
    assert cap == math.floor((80e9 - W_7B) / (KV_7B * longest))
    edge.make_params(TRACES, num_users=U, hardware=PAIR, num_servers=cap,
                     server_model="legacy")
    with pytest.raises(BadInput, match="num_servers"):
        edge.make_params(TRACES, num_users=U, hardware=PAIR, num_servers=cap + 1)


def test_unknown_pair_is_bad_input():
    with pytest.raises(BadInput, match="unknown hardware pair 'tpu9'"):
        edge.make_params(TRACES, num_users=U, hardware="tpu9")


@pytest.mark.parametrize("m", [1, 4, 40])
def test_request_delay_is_the_full_batch_service_time(m):
    """``request_scalars(...)["delay_s"]`` (what the schedulers and the stage-2 learner count):
    upload + prefill + the LLM step decoded with M_t sequences per step + download, against the
    NumPy reference's token-by-token sum."""
    params = _params(num_servers=m)
    key = jax.random.key(5)
    _, state = edge.reset(key, params)
    noise = edge.draw_noise(key, params)
    req = jax.device_get(edge.request_scalars(state, params, noise.fading))
    ref = EdgeEnvNumPy(TRACES, dict(FULL_DEFAULTS, num_servers=m, scheduler="threshold"),
                       consts_from_jax(params.latency))
    ref.reset(vars(jax.device_get(noise)))
    for i, u in enumerate(ref.users):
        u.srv_kv = 0
        r = ref._request(u, float(noise.fading[i]))
        np.testing.assert_allclose(req["delay_s"][i], r["delay"], rtol=1e-4)
        np.testing.assert_allclose(req["prefill_s"][i], r["pf"], rtol=1e-4)
    # A fuller batch never serves a job faster.
    req1 = jax.device_get(edge.request_scalars(state, _params(num_servers=1), noise.fading))
    assert np.all(req["delay_s"] >= req1["delay_s"] * (1 - 1e-6))
