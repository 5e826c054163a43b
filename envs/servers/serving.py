"""The ``serving`` server of a roofline pair (``make_params(server_model="serving")``, the
default since issue 41), with its prefix cache: the continuous-batching engine of
``envs.serving`` (M concurrent sequences, each held until its last token; chunked prefill in a
per-iteration token budget; uploads and downloads share the cell's links by processor sharing)
and the LRU prefix cache of ``envs.prefix_cache`` (a request's upload carries its whole context,
the server prefills only what the cache lacks, a KV budget evicts the least recently used
prefix). The LLM alone keeps one resident sequence for its whole solution; the RSD baseline's
online PRM runs on the server as a SCORE job before each decision.
"""
from __future__ import annotations

import jax.numpy as jnp

from envs import prefix_cache
from envs import serving as engine
from envs.params import slot_conditions
from envs.servers import base
from envs.state import DECIDE, DRAFT, EMPTY, QUEUE_PHASE, SCORE, SERVICE
from prada_jax import latency as lat
from prada_jax.sched.registry import RSD_INDEX


def free_resources(state, params):
    """``Server.free_resources``: a sequence is held until its last token; the uplink is
    shared per slot (the uploads in flight need their slot-average bandwidth)."""
    c = slot_conditions(params, state.t)
    in_service = state.phase == SERVICE
    in_job = in_service | (state.phase == SCORE)
    held = engine.holds_sequence(state.job, in_job)
    free_units = c["num_servers"] - jnp.sum(held.astype(jnp.int32))
    free_bw = c["bandwidth_hz"] - jnp.sum(engine.uplink_demand_hz(state.job, in_job,
                                                                    params.tau_s))
    return jnp.maximum(free_units, 0), jnp.maximum(free_bw, 0.0)


def request(state, params, fading):
    """``Server.request``: also ``up_hz`` / ``down_hz`` (the bandwidths the upload / download
    transmit at), ``pf_flops``, ``dec_tok`` and ``load_s`` (``envs.edge.request_scalars``)."""
    lp = params.latency
    n, ctx, llm_tok, srv_cached, up_tokens, cond, snr = base.request_basics(state, params,
                                                                             fading)
    # The LLM alone decodes its whole solution in one resident sequence and downloads its
    # last step; a download asks for the bandwidth its own bits need.
    path = params.llm_path
    dec_tok = jnp.where(params.llm_only, path.tokens[n], llm_tok)
    down_tok = jnp.where(params.llm_only, path.last_tokens[n], llm_tok)
    full = jnp.maximum(cond["num_servers"], 1).astype(jnp.float32)
    down_bits = down_tok.astype(jnp.float32) * lp.bits_per_token
    bw_dn = lat.request_bandwidth_hz(lp, down_bits, snr, cond["bandwidth_hz"])
    t_down = jnp.where(params.downlink, lat.transfer_delay_s(down_bits, bw_dn, snr), 0.0)
    # A stateless API: the upload carries the whole context; the server prefills only
    # what its prefix cache lacks (envs.prefix_cache).
    up_bits = ctx.astype(jnp.float32) * lp.bits_per_token
    bw = lat.request_bandwidth_hz(lp, up_bits, snr, cond["bandwidth_hz"])
    t_up = lat.transfer_delay_s(up_bits, bw, snr)
    pf_flops = lat.roofline_prefill_flops(lp.llm, up_tokens, srv_cached)
    t_pre = pf_flops / (lp.server_hw.peak_flops * lp.server_hw.eta)
    t_srv = t_pre + lat.decode_s(lp.llm, lp.server_hw, dec_tok, ctx, full)
    load = lat.job_load_s(lp.llm, lp.server_hw, pf_flops, dec_tok, ctx, full) * full
    return dict(snr=snr, outage=lat.in_outage(lp, snr),
                bandwidth_hz=bw * jnp.minimum(t_up, params.tau_s) / params.tau_s,
                up_hz=bw, down_hz=bw_dn, upload_s=t_up, server_s=t_srv, download_s=t_down,
                delay_s=t_up + t_srv + t_down, upload_tokens=ctx, prefill_tokens=up_tokens,
                cached_tokens=srv_cached, prefill_s=t_pre,
                pf_flops=pf_flops, dec_tok=dec_tok.astype(jnp.float32), load_s=load)


def start_jobs(s, state, params, req, res_imm):
    """``Server.start_jobs``: an LLM job holding a sequence, its prefill FCFS from this slot."""
    tr = params.traces
    n = state.node
    j = state.job
    w = lambda new, old: jnp.where(res_imm, new, old)  # noqa: E731
    return s.replace(job=j.replace(
        up_s=w(req["upload_s"], j.up_s), up_hz=w(req["up_hz"], j.up_hz),
        pf_tok=w(req["prefill_tokens"].astype(jnp.float32), j.pf_tok),
        pf_flops=w(req["pf_flops"], j.pf_flops), dec_tok=w(req["dec_tok"], j.dec_tok),
        ctx=w(tr.ctx_tokens[n].astype(jnp.float32), j.ctx),
        down_s=w(req["download_s"], j.down_s), down_hz=w(req["down_hz"], j.down_hz),
        seq=w(True, j.seq), prm=w(False, j.prm), ticket=w(state.t, j.ticket)))


def serve(s, params):
    """``Server.serve``: one slot of ``envs.serving.serve_slot`` for every user with a server
    job (SERVICE or SCORE; ``in_svc`` is those users); ``server_in_use`` counts held
    sequences, ``uplink_demand`` / ``downlink_demand`` are demand / capacity of each link."""
    tau = params.tau_s
    in_draft = s.phase == DRAFT
    in_svc = s.phase == SERVICE
    in_q = s.phase == QUEUE_PHASE
    in_job = in_svc | (s.phase == SCORE)
    b_t = slot_conditions(params, s.t)["bandwidth_hz"]
    up_hz = jnp.sum(engine.uplink_demand_hz(s.job, in_job, tau))
    slot_use = dict(
        server_in_use=jnp.sum(engine.holds_sequence(s.job, in_job).astype(jnp.int32)),
        bandwidth_in_use_hz=jnp.minimum(up_hz, b_t),
        queue_len=jnp.sum(in_q.astype(jnp.int32)))
    job, comm, left, st = engine.serve_slot(s.job, in_job, params.latency, tau, b_t,
                                            params.max_batched_tokens)
    server_stats = dict(server_batch=st["batch"], prefill_tokens=st["prefill_tokens"],
                        decode_tokens=st["decode_tokens"], server_busy_s=st["busy_s"],
                        uplink_demand=st["uplink_demand"],
                        downlink_demand=st["downlink_demand"])
    comm_part = jnp.where(in_job, comm, 0.0)
    s = s.replace(
        job=job,
        proc_s=s.proc_s + jnp.where(in_draft | in_job, tau, 0.0) - comm_part,
        comm_s=s.comm_s + comm_part,
        queue_s=s.queue_s + jnp.where(in_q, tau, 0.0),
        wait=s.wait + in_q.astype(jnp.int32),
        remaining=jnp.where(in_job, left.astype(jnp.int32),
                            s.remaining - in_draft.astype(jnp.int32)))
    return s, in_draft, in_job, dict(slot_use, **server_stats)


def finish_jobs(s, params, svc_done, term1, corr1, fb1):
    """``Server.finish_jobs``: the LLM alone's resident sequence decoded the whole solution,
    so its job ends the solution (its steps, offloads and fallbacks counted here)."""
    path = params.llm_path
    whole = params.llm_only
    term1 = term1 | whole
    corr1 = jnp.where(whole, path.correct[s.node], corr1)
    more = jnp.where(svc_done & whole, path.steps[s.node] - 1, 0)
    s = s.replace(steps=s.steps + more, offloads=s.offloads + more,
                  fallbacks=s.fallbacks + jnp.where(
                      svc_done & whole, path.fallbacks[s.node] - fb1.astype(jnp.int32), 0))
    return s, term1, corr1


def cut_at_fallback(s, params, moved, node):
    """``Server.cut_at_fallback``: users that move through a trace fallback (``moved`` [U]; the
    branch they took was not expanded, so they continue from another node of their problem,
    ``node`` [U] being where they were) keep on the server only the prefix their new context
    surely shares: the problem's prompt (the root's context). The rest of the cached prefix
    belongs to a path they left; reusing ``min(cached, context)`` of it would serve tokens that
    are not there."""
    tr = params.traces
    prompt = tr.ctx_tokens[tr.root[tr.problem[node]]]
    cut = lambda c: jnp.where(moved, jnp.minimum(c, prompt), c)  # noqa: E731
    return s.replace(server_cached=cut(s.server_cached),
                     prm_cached=None if s.prm_cached is None else cut(s.prm_cached))


def _begin_score(s, params, mask, fading, t):
    """Starts the online PRM's scoring job of the users in ``mask`` (serving server, RSD):
    they upload the context + draft over this slot's channel (the whole of it: a stateless
    API) and wait in SCORE until the PRM's prefill pass ran on the server, which prefills only
    what the PRM has not scored (``prm_prefix_cache``, the prefix cache of
    ``envs.prefix_cache``); the score returns in a few bytes (no download charged). An upload
    below γ_th is not modelled as an outage here (the PRM has no local fallback).

    Returns ``(state, prm_load_s, hit_tokens, ctx_tokens)``: the offered load of the new jobs
    [s] (``job_load_s`` · M_t) and the prefix tokens the cache served / the jobs' contexts.
    """
    tr, lp = params.traces, params.latency
    n = s.node
    total = tr.ctx_tokens[n] + tr.cand_tokens[n, 0]
    cached = jnp.where(params.prm_prefix_cache, jnp.minimum(s.prm_cached, total), 0)
    new = total - cached
    cond = slot_conditions(params, t)
    snr = lat.snr_linear(lp, jnp.maximum(fading * cond["channel_gain"], 1e-12))
    bits = total.astype(jnp.float32) * lp.bits_per_token
    bw = lat.request_bandwidth_hz(lp, bits, snr, cond["bandwidth_hz"])
    t_up = lat.transfer_delay_s(bits, bw, snr)
    pf_flops = lat.roofline_prefill_flops(lp.prm, new, cached)
    full = jnp.maximum(cond["num_servers"], 1).astype(jnp.float32)
    load = lat.job_load_s(lp.llm, lp.server_hw, pf_flops, 0.0, total, full,
                          extra_weight_bytes=lat.model_weight_bytes(lp.prm, lp.server_hw)) * full
    j = s.job
    w = lambda new_, old: jnp.where(mask, new_, old)  # noqa: E731
    zf = jnp.zeros_like(j.up_s)
    job = j.replace(up_s=w(t_up, j.up_s), up_hz=w(bw, j.up_hz),
                    pf_tok=w(new.astype(jnp.float32), j.pf_tok), pf_flops=w(pf_flops, j.pf_flops),
                    dec_tok=w(zf, j.dec_tok), ctx=w(total.astype(jnp.float32), j.ctx),
                    down_s=w(zf, j.down_s), down_hz=w(zf, j.down_hz), seq=w(False, j.seq),
                    prm=w(True, j.prm), ticket=w(t + 1, j.ticket))
    s = s.replace(job=job, phase=jnp.where(mask, SCORE, s.phase),
                  remaining=jnp.where(mask, 1, s.remaining),
                  prm_cached=jnp.where(mask, total, s.prm_cached))
    f32 = lambda v: jnp.sum(jnp.where(mask, v, 0)).astype(jnp.float32)  # noqa: E731
    return s, jnp.sum(jnp.where(mask, load, 0.0)), f32(cached), f32(total)




def _cache_end_of_slot(s, params, in_svc, t):
    """The prefix cache at the end of slot ``t`` (serving server; ``envs.prefix_cache``):
    users with a server job this slot or now (``in_svc`` | SERVICE/SCORE) mark their prefixes
    used at ``t``; finished users and disabled caches hold nothing; then LRU eviction to the
    KV budget. Returns ``(state, stats)`` (``evicted_tokens``, ``kv_in_use_tokens``,
    ``kv_pinned_tokens``)."""
    in_job = (s.phase == SERVICE) | (s.phase == SCORE)
    used = jnp.where(in_svc | in_job, t, s.cache_used)
    active = s.phase != EMPTY
    llm_c = jnp.where(active & params.server_kv_cache, s.server_cached, 0)
    prm_c = jnp.where(active & params.prm_prefix_cache, s.prm_cached, 0)
    holds = engine.holds_sequence(s.job, in_job)
    llm_c, prm_c, stats = prefix_cache.evict_lru(llm_c, prm_c, holds, s.job.ctx, used,
                                                 params.kv_budget_tokens, params.prm_kv_ratio)
    return s.replace(server_cached=llm_c, prm_cached=prm_c, cache_used=used), stats



def end_slot(s, params, noise, score_done, in_svc, t, hits):
    """``Server.end_slot``: RSD under the serving server: every finished draft is scored by
    the PRM on the server (a SCORE job) before its decision; then the prefix cache's end of
    the slot. The scoring passes' prefix tokens join ``hits``."""
    to_score = ((params.scheduler == RSD_INDEX) & (s.phase == DECIDE) & ~score_done
                & ~params.llm_only)
    s, prm_load, prm_hit, prm_ctx = _begin_score(s, params, to_score, noise.fading, t)
    s, kv = _cache_end_of_slot(s, params, in_svc, t)
    hits = dict(hits, prefix_hit_tokens=hits["prefix_hit_tokens"] + prm_hit,
                prefix_ctx_tokens=hits["prefix_ctx_tokens"] + prm_ctx, **kv)
    return s, prm_load, hits


def offered_s(req, offered, params):
    """``Server.offered_s``: the job's offered load ``load_s`` [s]."""
    return jnp.where(offered, req["load_s"], 0.0)


SERVER = base.Server(
    name="serving", tracks_prefixes=True, scores_on_server=True, empty_job=engine.empty_job,
    free_resources=free_resources, request=request, start_jobs=start_jobs, serve=serve,
    finish_jobs=finish_jobs, cut_at_fallback=cut_at_fallback, end_slot=end_slot,
    offered_s=offered_s)
