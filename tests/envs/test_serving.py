"""The serving server (``envs.serving``, ``server_model="serving"``): against the NumPy
reference written job by job, against closed forms (capacity at batch b, Little's law, the
chunked-prefill budget), and guards that fail if a serving rule is dropped (the sequence held
through the download, the PRM free on the server, the batch size ignored, prefills in parallel
for free, U binding unreported)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, serving
from envs.testing import llm_alone_window_sums, rollout
from prada_jax import latency as lat
from prada_jax.traces.testing import random_traces
from tests.helpers.edge_pair import (assert_users_conserved, jax_rollout, random_actions,
                                     replay_on_numpy)
from tests.helpers.serving import (BWM, D_, KV_7B, L_, P_TOK, PK, W_7B, llm_alone_cost_by_hand,
                                   step_by_hand)

S, T, U = 1, 200, 12
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
PAIR = "a100_orin_int4"
BASE = dict(num_users=U, tau_s=0.05, beta=0.2, lambda_s=0.0, mu=0.0, bandwidth_hz=20e6,
            arrival_rate_hz=6.0, initial_users=U, default_gain=0.05, max_wait_slots=20,
            rsd_threshold=0.7, reward_mode="coarse", server_kv_cache=False, downlink=True,
            ctx_scale=1e-3)


def _run_pair(sched, cfg, seed=0, slots=T):
    kw = dict(BASE, **cfg)
    params = edge.make_params(TRACES, scheduler=sched, hardware=PAIR, **kw)
    screens, gains = random_actions(seed, (S, slots, U))
    if kw.get("llm_only"):      # the LLM alone nominates every step (as evals run it)
        screens = np.ones_like(screens)
    out = jax_rollout(seed, params, screens, gains)
    finished, _, _ = replay_on_numpy(TRACES, dict(kw, scheduler=sched), params, screens, gains,
                                     out, label=sched, info_tol=(2e-4, 1e-4))
    _, _, _, _, (_, _, d, info) = out
    return finished, jax.tree.map(lambda v: np.asarray(v)[0], info), np.asarray(d)[0]


CASES = {
    "threshold": ("threshold", dict(num_servers=3, arrival_rate_hz=8.0, reward_mode="true")),
    "offload_all": ("offload_all", dict(num_servers=2, bandwidth_hz=3e6, max_wait_slots=5,
                                        server_kv_cache=True, max_batched_tokens=64)),
    "rsd": ("rsd", dict(num_servers=4)),
    "rsd_prefix_cache": ("rsd", dict(num_servers=4, prm_prefix_cache=True,
                                     max_batched_tokens=40)),
    "llm_alone": ("offload_all", dict(num_servers=3, llm_only=True, server_kv_cache=True,
                                      max_wait_slots=10 ** 6, max_batched_tokens=16)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_jax_serving_matches_numpy_reference(case):
    sched, cfg = CASES[case]
    finished, info, d = _run_pair(sched, cfg)
    assert finished >= 8
    m = cfg["num_servers"]
    assert info["server_in_use"].max() <= m
    assert_users_conserved(info, d)


# ----------------------------------------------------------------------------- one slot by hand


def _lp():
    return lat.pair_latency_params(PAIR)


def _job(n, **kw):
    z = np.zeros(n, np.float32)
    base = dict(up_s=z, up_hz=z, pf_tok=z, pf_flops=z, dec_tok=z, ctx=z, down_s=z, down_hz=z,
                seq=np.ones(n, bool), prm=np.zeros(n, bool), ticket=np.zeros(n, np.int32))
    base.update({k: np.asarray(v, base[k].dtype) for k, v in kw.items()})
    return serving.ServingJob(**{k: jnp.asarray(v) for k, v in base.items()})


def _serve(job, n, tau=0.05, bw=20e6, budget=2048):
    return jax.device_get(serving.serve_slot(job, jnp.ones(n, bool), _lp(), tau, bw, budget))


@pytest.mark.parametrize("b", [4, 64, 256])
def test_decode_batch_costs_its_roofline_at_its_size(b):
    """b sequences decode τ / t_step(b) tokens each, t_step by hand from the datasheet; at
    b = 256 the compute term binds (so a batch size dropped from the FLOPs fails here)."""
    ctx = np.full(b, 500.0)
    new, comm, left, st = _serve(_job(b, dec_tok=np.full(b, 100.0), ctx=ctx), b)
    step = step_by_hand(b, ctx.sum())
    np.testing.assert_allclose(100.0 - new.dec_tok, 0.05 / step, rtol=1e-4)
    assert st["batch"] == b and np.all(left) and np.all(comm == 0)
    compute = (2 * P_TOK * b + 4 * L_ * D_ * ctx.sum()) / PK
    assert (compute > (W_7B + KV_7B * ctx.sum()) / BWM) == (b == 256)


def test_chunked_prefill_takes_the_token_budget_first_come_first_served():
    """One decoding sequence and three prefills of 1 000 tokens (tickets 2, 0, 1) under a
    512-token budget: each iteration decodes 1 token and prefills 511, at the roofline of the
    mixed batch (compute-bound here: the chunk stalls the decode); the prefills progress in
    admission order; none runs "in parallel for free"."""
    n_pf = 1000.0
    f_tok = 2 * 6.53e9 + 2 * L_ * D_ * n_pf        # mean FLOPs per prefill token (c = 0)
    job = _job(4, dec_tok=[100, 0, 0, 0], ctx=[300, 0, 0, 0], pf_tok=[0, n_pf, n_pf, n_pf],
               pf_flops=[0] + [f_tok * n_pf] * 3, ticket=[0, 2, 0, 1])
    new, _, _, st = _serve(job, 4, budget=512)
    f_dec = 2 * P_TOK + 4 * L_ * D_ * 300
    t_iter = max((f_dec + 511 * f_tok) / PK, (W_7B + KV_7B * 300) / BWM)
    assert (f_dec + 511 * f_tok) / PK > 2 * (W_7B + KV_7B * 300) / BWM   # the chunk binds
    iters = 0.05 / t_iter
    prefilled = iters * 511
    np.testing.assert_allclose(st["prefill_tokens"], prefilled, rtol=1e-4)
    np.testing.assert_allclose(100.0 - new.dec_tok[0], iters, rtol=1e-4)
    # FCFS: ticket 0 (user 2) first, then ticket 1 (user 3), then ticket 2 (user 1).
    want = {2: min(n_pf, prefilled), 3: min(n_pf, max(prefilled - n_pf, 0)),
            1: min(n_pf, max(prefilled - 2 * n_pf, 0))}
    for i, got in want.items():
        np.testing.assert_allclose(n_pf - new.pf_tok[i], got, rtol=1e-4, atol=1e-2)
    # The same prefills with no budget limit would finish; the decode would stall far more.
    assert prefilled < 3 * n_pf


def test_sequence_is_freed_at_its_last_token_not_after_the_download():
    """A job whose last token comes this slot downloads in what is left of it, holds no
    sequence from then on (so the next slot's free units count it free), and its download
    continues into the next slot on the link alone."""
    job = _job(2, dec_tok=[2, 1e6], ctx=[100, 100], down_s=[0.2, 0.0], down_hz=[1e5, 0])
    new, comm, left, st = _serve(job, 2)
    assert new.dec_tok[0] == 0 and new.down_s[0] > 0 and left[0]
    held = jax.device_get(serving.holds_sequence(jax.tree.map(jnp.asarray, new),
                                                 jnp.ones(2, bool)))
    assert held.tolist() == [False, True]
    step = step_by_hand(2, 200)
    np.testing.assert_allclose(comm[0], 0.05 - 2 * step, rtol=1e-4)   # downloads after 2 tokens
    # the env counts it free: M − 1 free units with one sequence still decoding
    params = edge.make_params(TRACES, num_users=2, hardware=PAIR, num_servers=2,
                              initial_users=0)
    _, state = edge.reset(jax.random.key(0), params)
    state = state.replace(phase=jnp.full(2, edge.SERVICE, jnp.int32),
                          job=jax.tree.map(jnp.asarray, new))
    free_units, _ = edge.free_resources(state, params)
    assert int(free_units) == 1


def test_prm_pass_costs_the_server():
    """A PRM job in the backlog takes compute from the decoding batch (fewer tokens this slot
    than without it) and holds no sequence."""
    b = 256
    ctx = np.full(b + 1, 500.0)
    dec = np.r_[np.full(b, 1e6), 0.0]
    pf = np.r_[np.zeros(b), 2000.0]
    prm_flops = 2 * (6.53e9 + 3584 * 3584 + 3584 * 2) * 2000.0
    with_prm = _job(b + 1, dec_tok=dec, ctx=ctx, pf_tok=pf, pf_flops=np.r_[np.zeros(b), prm_flops],
                    seq=np.r_[np.ones(b, bool), False], prm=np.r_[np.zeros(b, bool), True])
    new, _, _, st = _serve(with_prm, b + 1)
    alone, _, _, _ = _serve(_job(b, dec_tok=dec[:b], ctx=ctx[:b]), b)
    assert new.dec_tok[0] > alone.dec_tok[0] + 0.5          # at least half a token less
    assert st["prefill_tokens"] > 0
    held = jax.device_get(serving.holds_sequence(jax.tree.map(jnp.asarray, new),
                                                 jnp.ones(b + 1, bool)))
    assert not held[-1] and held[:b].all()


# ----------------------------------------------------------------------------- closed forms

@pytest.fixture(scope="module")
def gsm8k():
    from prada_jax.traces import synthetic
    return synthetic.generate("gsm8k", seed=0, problems=64)[0]


def _llm_alone_run(traces, m, rate, users, slots, warm, seeds=4):
    out = llm_alone_window_sums(traces, PAIR, m, rate, users, slots, warm, seeds, seed=7)
    return out, (slots - warm) * 0.05


@pytest.mark.parametrize("m", [4, 64, 256])
def test_llm_alone_capacity_matches_the_closed_form(gsm8k, m):
    """Overloaded (arrivals 1.4× the closed-form capacity), the LLM alone's completions per
    second match ``1 / E[c]`` (c from ``_llm_alone_cost_by_hand``, less the slots a
    sequence idles) within 5 %, with the batch full and the blocked arrivals counted."""
    c = llm_alone_cost_by_hand(gsm8k, m)
    cap = 1.0 / c.mean()
    # Slot granularity: a sequence idles about 1.5 slots per user (its prefill slot, and the
    # rest of the slot its last token comes in), so ≈ 1.5·τ·X of the M slots hold no token.
    cap = cap / (1.0 + 1.5 * 0.05 * cap / m)
    users = m + 96
    out, secs = _llm_alone_run(gsm8k, m, 1.4 * cap, users, slots=1600 if m > 4 else 2400,
                               warm=400)
    thr = out[:, 0].sum() / (secs * out.shape[0])
    assert abs(thr / cap - 1) < 0.05, (thr, cap)
    assert out[:, 4].sum() > 0                      # U binds: arrivals are blocked, and counted
    assert np.all(out[:, 5] / (secs / 0.05) > 0.95 * m)   # the batch stays full


def test_littles_law_at_steady_state(gsm8k):
    """At half the closed-form capacity (M = 64): users in the system = arrival rate × mean
    latency (Little's law) within 5 %, and ρ ≈ 0.5."""
    c = llm_alone_cost_by_hand(gsm8k, 64)
    rate = 0.5 / c.mean()
    out, secs = _llm_alone_run(gsm8k, 64, rate, users=256, slots=1600, warm=400)
    done, lat_sum, in_flight = out[:, 0].sum(), out[:, 1].sum(), out[:, 2].sum()
    slots = secs / 0.05 * out.shape[0]
    arrivals_per_s = done / (secs * out.shape[0])
    mean_lat = lat_sum / done
    np.testing.assert_allclose(in_flight / slots, arrivals_per_s * mean_lat, rtol=0.05)
    rho = out[:, 3].sum() / (64 * secs * out.shape[0])
    assert 0.4 < rho < 0.6 and out[:, 4].sum() == 0


def test_rsd_prm_shows_in_load_and_latency():
    """RSD that never calls the LLM (threshold 0: every draft kept) still runs a PRM pass per
    step on the server: prefill tokens on the server, offered load > 0 and users slower than
    All-SLM (keep_local) on the same randomness. Fails if the PRM costs the server nothing."""
    kw = dict(num_users=U, hardware=PAIR, num_servers=4, arrival_rate_hz=6.0, initial_users=U)
    rsd = edge.make_params(TRACES, scheduler="rsd", rsd_threshold=0.0, **kw)
    slm = edge.make_params(TRACES, scheduler="keep_local", **kw)
    keys = jax.random.split(jax.random.key(1), 1)
    screens = np.zeros((1, 150, U), np.int32)
    gains = np.zeros((1, 150, U), np.float32)
    out = {}
    for name, p in (("rsd", rsd), ("slm", slm)):
        *_, (_, _, d, info) = jax.device_get(rollout(keys, p, screens, gains))
        lat_s = np.asarray(info["user_latency_s"])[np.asarray(d)]
        out[name] = (lat_s.mean(), np.asarray(info["prefill_tokens"]).sum(),
                     np.asarray(info["offered_job_s"]).sum(), np.asarray(info["decision"]))
    assert out["rsd"][1] > 0 and out["rsd"][2] > 0
    assert out["slm"][1] == 0 and out["slm"][2] == 0
    assert not np.any(out["rsd"][3] == edge.IMMEDIATE)      # the LLM never ran
    assert out["rsd"][0] > out["slm"][0]
