"""The RSD baseline's online PRM on the serving server, built through the env's own path
(issue 55 item 4): the SCORE jobs ``edge.step`` starts are checked field by field against the
datasheet (Qwen2.5-Math-PRM-7B on the A100, written out here, not read from
``prada_jax.latency``), their offered load is counted in ``offered_job_s`` (the numerator of
the load ρ), and one such job, run beside a small decode batch where the iteration is
memory-bound, costs the iteration the PRM's weight bytes.

test_serving.py's PRM test builds its job by hand at batch 256 (compute-bound: the PRM's
weights never matter there), so a PRM load left out of ρ or a PRM whose weights are not read
passes it; each fails here.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, serving
from prada_jax import latency as lat
from prada_jax.traces.testing import random_traces
from tests.helpers.serving import BWM, D_, KV_7B, L_, P_TOK, PK, W_7B

U, T = 12, 120
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
PAIR = "a100_orin_int4"
TAU = 0.05
#: Qwen2.5-Math-PRM-7B: the 7B backbone (6.53e9 non-embedding) and a value head of
#: 3584·3584 + 3584·2 weights instead of the lm_head; bf16 on the A100.
PRM_P = 6.53e9
PRM_HEAD = 3584.0 * 3584.0 + 3584.0 * 2.0
W_PRM = (PRM_P + PRM_HEAD) * 2.0


def _prm_prefill_flops(n_new, n_cached):
    """One scoring pass over ``n_new`` tokens after ``n_cached`` the PRM keeps:
    ``2·P·n + 2·L·d·(n² + 2nc)`` + the value head once (the last position)."""
    n, c = np.asarray(n_new, np.float64), np.asarray(n_cached, np.float64)
    return 2 * PRM_P * n + 2 * L_ * D_ * (n * n + 2 * n * c) + np.where(n > 0, 2 * PRM_HEAD, 0.0)


def _prm_load_by_hand(f_pf, ctx, m, prm_weights=True):
    """Server-seconds a PRM pass costs a saturated server of m sequences at context ``ctx``
    (× m, as the env offers it): the stall it adds to one full-batch decode iteration; no
    pass, no load, when nothing is new (``f_pf`` = 0)."""
    if f_pf == 0:
        return 0.0
    f_step = m * (2 * P_TOK + 4 * L_ * D_ * ctx)
    b_step = W_7B + KV_7B * m * ctx
    t_step = max(f_step / PK, b_step / BWM)
    t_mix = max((f_step + f_pf) / PK, (b_step + (W_PRM if prm_weights else 0.0)) / BWM)
    return (t_mix - t_step) * m


def _params(m=2, **kw):
    return edge.make_params(
        TRACES, scheduler="rsd", hardware=PAIR, num_users=U, num_servers=m, tau_s=TAU,
        rsd_threshold=0.0, prm_prefix_cache=True, server_kv_cache=False,
        arrival_rate_hz=6.0, initial_users=U, bandwidth_hz=20e6, **kw)


def _run_env(params, slots=T):
    """(state before, state after, info) of each slot of one env driven by ``edge.step``."""
    step = jax.jit(edge.step)
    key = jax.random.key(0)
    _, state = edge.reset(jax.random.fold_in(key, 10 ** 6), params)
    out = []
    for t in range(slots):
        _, after, _, _, info = step(jax.random.fold_in(key, t), state,
                                    jnp.zeros(U, jnp.int32), params)
        out.append((jax.device_get(state), jax.device_get(after), jax.device_get(info)))
        state = after
    return out


@pytest.fixture(scope="module")
def run():
    params = _params()
    assert params.serving
    return params, _run_env(params)


def _new_score_jobs(before, after):
    """[U] bool: users whose PRM (SCORE) job the step started."""
    return ((np.asarray(after.phase) == edge.SCORE) & np.asarray(after.job.prm)
            & (np.asarray(after.job.ticket) == int(before.t) + 1))


def test_env_builds_the_prm_job_and_counts_it_in_the_offered_load(run):
    """Every SCORE job the env starts: the PRM's tokens (context + draft, less what it has
    scored before), their FLOPs, no sequence held; the slot's ``prm_load_s`` is the sum of
    their by-hand loads and ``offered_job_s`` (ρ's numerator) includes it. RSD at threshold 0
    never calls the LLM, so the PRM is the whole offered load."""
    params, slots = run
    tr = params.traces
    ctx_tok, cand_tok = np.asarray(tr.ctx_tokens), np.asarray(tr.cand_tokens)
    jobs = mem_bound = 0
    total_load = total_load_no_w = 0.0
    for before, after, info in slots:
        new = _new_score_jobs(before, after)
        m_t = float(info["num_servers_t"])
        load = load_no_w = 0.0
        for i in np.flatnonzero(new):
            node = int(after.node[i])
            total = ctx_tok[node] + cand_tok[node, 0]
            n_new = float(after.job.pf_tok[i])
            # n_new = 0 where the PRM scored a longer context before (a fallback node of the
            # random traces has a shorter context): the env then runs no pass
            assert 0 <= n_new <= total and float(after.job.ctx[i]) == total
            assert int(after.prm_cached[i]) == total          # the PRM keeps what it scored
            assert not after.job.seq[i] and after.job.dec_tok[i] == 0
            assert after.job.down_s[i] == 0                      # the score returns in bytes
            f_pf = _prm_prefill_flops(n_new, total - n_new)
            np.testing.assert_allclose(after.job.pf_flops[i], f_pf, rtol=1e-5)
            load += _prm_load_by_hand(f_pf, total, m_t)
            load_no_w += _prm_load_by_hand(f_pf, total, m_t, prm_weights=False)
            jobs += 1
            mem_bound += 0 < n_new < 96
        np.testing.assert_allclose(info["prm_load_s"], load, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(info["offered_job_s"], load, rtol=1e-4, atol=1e-7)
        assert not np.any(np.asarray(info["decision"]) == edge.IMMEDIATE)
        total_load += load
        total_load_no_w += load_no_w
    assert jobs >= 30 and mem_bound >= 10, (jobs, mem_bound)
    # the PRM's weights are most of its load here (rescoring a cached prefix is memory-bound)
    assert total_load_no_w < 0.5 * total_load, (total_load_no_w, total_load)


@pytest.mark.parametrize("b", [0, 4])
def test_prm_weights_set_a_memory_bound_iteration(run, b):
    """A PRM job the env started (a re-score of a cached prefix: few tokens) in the backlog of
    a slot with ``b`` decoding sequences (b = 0, 4: memory-bound). Its iteration reads the
    LLM's weights (if a batch decodes), the PRM's and the KV cache:
    ``t_a = max(F/(peak·η), (W_LLM·[b>0] + W_PRM + KV)/(BW·η_mem))``; the PRM prefills in one
    iteration, then pure decode iterations fill the slot. Without the PRM's bytes t_a would be
    at most 0.6 of it (checked; 0.52 at b = 4), so a PRM whose weights are not read fails here."""
    params, slots = run
    found = None
    for before, after, _ in slots:
        for i in np.flatnonzero(_new_score_jobs(before, after)):
            if after.job.pf_tok[i] < 64 and after.job.up_s[i] < 0.5 * TAU:
                found = jax.tree.map(lambda v: np.asarray(v)[i], after.job)
                break
        if found is not None:
            break
    assert found is not None, "no cached PRM re-score in the run"
    ctx = 500.0
    z = np.zeros(b, np.float32)
    cat = lambda a, v: np.r_[a, np.asarray(v, a.dtype)]  # noqa: E731
    job = serving.ServingJob(
        up_s=cat(z, found.up_s), up_hz=cat(z, found.up_hz), pf_tok=cat(z, found.pf_tok),
        pf_flops=cat(z, found.pf_flops), dec_tok=cat(np.full(b, 1000.0, np.float32), 0.0),
        ctx=cat(np.full(b, ctx, np.float32), found.ctx), down_s=cat(z, 0.0),
        down_hz=cat(z, 0.0), seq=cat(np.ones(b, bool), False), prm=cat(np.zeros(b, bool), True),
        ticket=cat(np.zeros(b, np.int32), found.ticket))
    job = jax.tree.map(jnp.asarray, job)
    new, _, left, st = jax.device_get(serving.serve_slot(
        job, jnp.ones(b + 1, bool), params.latency, TAU, 20e6, params.max_batched_tokens))
    f_dec = b * (2 * P_TOK + 4 * L_ * D_ * ctx)
    kv = KV_7B * b * ctx
    w_llm = W_7B if b > 0 else 0.0
    t_a = max((f_dec + float(found.pf_flops)) / PK, (w_llm + W_PRM + kv) / BWM)
    t_a_no_prm_w = max((f_dec + float(found.pf_flops)) / PK, (w_llm + kv) / BWM)
    assert t_a_no_prm_w < 0.6 * t_a                       # the PRM's bytes set the iteration
    assert new.pf_tok[-1] == 0 and not left[-1]           # scored in one iteration
    np.testing.assert_allclose(st["prefill_tokens"], found.pf_tok, rtol=1e-5)
    if b == 0:
        np.testing.assert_allclose(st["busy_s"], t_a, rtol=1e-4)
        np.testing.assert_allclose(st["iter_s"], t_a, rtol=1e-4)
    else:
        t_b = max(f_dec / PK, (W_7B + kv) / BWM)
        decoded = 1.0 + (TAU - t_a) / t_b                  # one mixed iteration, then decodes
        np.testing.assert_allclose(1000.0 - new.dec_tok[:b], decoded, rtol=1e-4)
        np.testing.assert_allclose(st["busy_s"], TAU, rtol=1e-6)


def test_the_datasheet_prm_is_the_env_prm():
    """The by-hand constants describe the PRM the env runs (so the tests above check the env's
    arithmetic, not a different model)."""
    lp = _params().latency
    assert float(lat.model_weight_bytes(lp.prm, lp.server_hw)) == pytest.approx(W_PRM, rel=1e-6)
    assert float(lp.prm.params) == pytest.approx(PRM_P, rel=1e-6)   # float32
