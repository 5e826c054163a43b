"""The one signature every server model of the edge env implements (``Server``), and the parts
the two slotted servers (``paper``, ``legacy``) share.

A server model is a module that builds one ``Server``: a NamedTuple of pure functions the slot
step (``envs.slot``) calls at fixed points of a slot, plus two static flags. The slot step gets
the model from ``envs.servers.registry.server_of(params)`` and never branches on its name::

    free_resources(state, params) -> (free_units int32, free_bw_hz float32)
        M_t and B_t of slot ``state.t`` less what running jobs hold, floored at 0.
    request(state, params, fading) -> dict of [U] arrays
        what each user's current step would cost if offloaded this slot
        (``envs.edge.request_scalars`` documents the keys).
    start_jobs(s, state, params, req, res_imm) -> s
        writes the server jobs of the users admitted this slot (``res_imm`` [U] bool) into
        ``s.job`` (``state`` is the state at the start of the slot).
    serve(s, params) -> (s, in_draft [U], in_svc [U], slot_use dict)
        runs one slot of the server and charges the slot's time by phase (processing,
        communication, queueing), counting down ``remaining``; ``slot_use`` holds the slot's
        scalars ``server_in_use``, ``bandwidth_in_use_hz``, ``queue_len``, ``server_batch``,
        ``prefill_tokens``, ``decode_tokens``, ``server_busy_s``, ``uplink_demand``,
        ``downlink_demand``.
    finish_jobs(s, params, svc_done, term1, corr1, fb1) -> (s, term1, corr1)
        the model's rule for a finished job (``svc_done``) beyond moving to the LLM's step
        (the serving server's LLM alone ends the whole solution).
    cut_at_fallback(s, params, moved, node) -> s
        the server prefixes of users that move through a trace fallback.
    end_slot(s, params, noise, score_done, in_svc, t, hits) -> (s, prm_load_s, hits)
        after the slot's arrivals and drafts: jobs the server starts on its own (the online
        PRM's scoring passes) and its cache at the end of the slot.
    offered_s(req, offered, params) -> [U] float32
        the server seconds each offered request (``offered`` [U] bool) asks for.
    empty_job(u) -> job arrays of ``u`` user slots (None: the model keeps none).

Flags: ``tracks_prefixes`` (``EnvState.prm_cached`` / ``cache_used`` exist: the prefix cache),
``scores_on_server`` (the RSD baseline's online PRM runs as a server job, so a draft does not
pay for it at the edge).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax.numpy as jnp

from envs.params import phase_slots, slot_conditions
from envs.state import DRAFT, QUEUE_PHASE, SERVICE
from prada_jax import latency as lat


class Server(NamedTuple):
    """The pure functions of one server model (signatures in the module docstring)."""

    name: str
    tracks_prefixes: bool
    scores_on_server: bool
    empty_job: Callable
    free_resources: Callable
    request: Callable
    start_jobs: Callable
    serve: Callable
    finish_jobs: Callable
    cut_at_fallback: Callable
    end_slot: Callable
    offered_s: Callable


def request_basics(state, params, fading):
    """What every model's request reads: ``(node, ctx, llm_tok, srv_cached, up_tokens, cond,
    snr)``; the server prefills the ``up_tokens`` of the context its cache lacks."""
    tr, lp = params.traces, params.latency
    n = state.node
    ctx = tr.ctx_tokens[n]
    llm_tok = tr.cand_tokens[n, 1]
    srv_cached = jnp.where(params.server_kv_cache, jnp.minimum(state.server_cached, ctx), 0)
    up_tokens = ctx - srv_cached
    cond = slot_conditions(params, state.t)
    snr = lat.snr_linear(lp, jnp.maximum(fading * cond["channel_gain"], 1e-12))
    return n, ctx, llm_tok, srv_cached, up_tokens, cond, snr


def slotted_request(state, params, fading, server_time):
    """Request of a slotted server: the upload sends only the uncached tokens, the download
    the LLM's step at the upload's bandwidth; ``server_time(lp, cond, up_tokens, srv_cached,
    llm_tok) -> (server_s, extra keys)`` prices the server's part."""
    lp = params.latency
    _, ctx, llm_tok, srv_cached, up_tokens, cond, snr = request_basics(state, params, fading)
    up_bits = up_tokens.astype(jnp.float32) * lp.bits_per_token
    bw = lat.request_bandwidth_hz(lp, up_bits, snr, cond["bandwidth_hz"])
    t_up = lat.transfer_delay_s(up_bits, bw, snr)
    t_down = jnp.where(params.downlink, lat.transfer_delay_s(
        llm_tok.astype(jnp.float32) * lp.bits_per_token, bw, snr), 0.0)
    t_srv, extra = server_time(lp, cond, up_tokens, srv_cached, llm_tok)
    return dict(snr=snr, outage=lat.in_outage(lp, snr), bandwidth_hz=bw, upload_s=t_up,
                server_s=t_srv, download_s=t_down, delay_s=t_up + t_srv + t_down,
                upload_tokens=up_tokens, prefill_tokens=up_tokens, cached_tokens=srv_cached,
                **extra)


def slotted_free_resources(state, params):
    """A job holds one unit and its bandwidth while in SERVICE."""
    c = slot_conditions(params, state.t)
    in_service = state.phase == SERVICE
    free_units = c["num_servers"] - jnp.sum(in_service.astype(jnp.int32))
    free_bw = c["bandwidth_hz"] - jnp.sum(jnp.where(in_service, state.svc_bw_hz, 0.0))
    return jnp.maximum(free_units, 0), jnp.maximum(free_bw, 0.0)


def slotted_serve(s, params, run_jobs):
    """One slot of a slotted server: ``run_jobs(s, in_draft, in_svc, params) -> (s,
    comm_part [U], remaining [U])`` advances the jobs; the slot's time is charged here."""
    tau = params.tau_s
    in_draft = s.phase == DRAFT
    in_svc = s.phase == SERVICE
    in_q = s.phase == QUEUE_PHASE
    zero = jnp.zeros((), jnp.float32)
    slot_use = dict(server_in_use=jnp.sum(in_svc.astype(jnp.int32)),
                    bandwidth_in_use_hz=jnp.sum(jnp.where(in_svc, s.svc_bw_hz, 0.0)),
                    queue_len=jnp.sum(in_q.astype(jnp.int32)),
                    server_batch=zero, prefill_tokens=zero, decode_tokens=zero,
                    server_busy_s=zero, uplink_demand=zero, downlink_demand=zero)
    s, comm_part, remaining = run_jobs(s, in_draft, in_svc, params)
    s = s.replace(
        proc_s=s.proc_s + jnp.where(in_draft, tau, 0.0) + jnp.where(in_svc, tau, 0.0) - comm_part,
        comm_s=s.comm_s + comm_part,
        queue_s=s.queue_s + jnp.where(in_q, tau, 0.0),
        wait=s.wait + in_q.astype(jnp.int32),
        remaining=remaining)
    return s, in_draft, in_svc, slot_use


def slotted_offered_s(req, offered, params):
    """The server-unit seconds a job holds: its whole slots · τ."""
    return jnp.where(offered, phase_slots(req["delay_s"], params.tau_s), 0).astype(
        jnp.float32) * params.tau_s


def keep_jobs(s, state, params, req, res_imm):
    """``start_jobs`` of a model with no job arrays."""
    return s


def plain_finish(s, params, svc_done, term1, corr1, fb1):
    """``finish_jobs``: a finished job moves the user to the LLM's step, nothing more."""
    return s, term1, corr1


def no_cut(s, params, moved, node):
    """``cut_at_fallback`` of a model whose server prefixes keep the rule of its results."""
    return s


def no_end_slot(s, params, noise, score_done, in_svc, t, hits):
    """``end_slot`` of a model with no jobs of its own and no bounded cache."""
    return s, jnp.zeros((), jnp.float32), hits
