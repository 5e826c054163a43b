"""The ``legacy`` server of a roofline pair (``make_params(server_model="legacy")``; the
results before issue 41): a batching server whose job holds one of the M units through its
download, whose prefills of a slot all run before the batch decodes, and where the LLM alone
re-queues every step (docs/latency.md "The legacy batching server"). ``make_params`` drops
the lm_head FLOPs and uses the 7B LLM's shape as the PRM for it, as those results did. The RSD
baseline's PRM is charged to the draft at the edge; with ``server_kv_cache`` the server keeps
an unbounded cache of each user's context."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct

from envs.servers import base
from prada_jax import latency as lat


@struct.dataclass
class ServiceJob:
    """Remaining work of each user's server job under the batching server ([U] float32; valid
    where the phase is SERVICE). ``up_s``: upload seconds; ``prefill_s``: server prefill
    seconds; ``dec_tok``: LLM-step tokens still to decode; ``ctx``: tokens in the job's server
    sequence (its KV cache, read by every decode step); ``down_s``: download seconds."""

    up_s: Any
    prefill_s: Any
    dec_tok: Any
    ctx: Any
    down_s: Any



def empty_job(u: int) -> ServiceJob:
    zf = jnp.zeros((u,), jnp.float32)
    return ServiceJob(up_s=zf, prefill_s=zf, dec_tok=zf, ctx=zf, down_s=zf)


def _server_time(lp, cond, up_tokens, srv_cached, llm_tok):
    # Service time on a full server: M_t sequences share every decode step.
    full = jnp.maximum(cond["num_servers"], 1).astype(jnp.float32)
    t_pre = lat.server_prefill_s(lp, up_tokens, srv_cached)
    t_srv = lat.server_delay_s(lp, up_tokens, srv_cached, llm_tok, batch=full)
    return t_srv, dict(prefill_s=t_pre)


def request(state, params, fading):
    """``Server.request``: ``base.slotted_request`` with the roofline's server time on a full
    batch, and the server prefill part ``prefill_s``."""
    return base.slotted_request(state, params, fading, _server_time)


def start_jobs(s, state, params, req, res_imm):
    """``Server.start_jobs``: upload, prefill, the LLM step's tokens, context, download."""
    tr = params.traces
    n = state.node
    j = state.job
    w = lambda new, old: jnp.where(res_imm, new, old)  # noqa: E731
    return s.replace(job=ServiceJob(
        up_s=w(req["upload_s"], j.up_s), prefill_s=w(req["prefill_s"], j.prefill_s),
        dec_tok=w(tr.cand_tokens[n, 1].astype(jnp.float32), j.dec_tok),
        ctx=w(tr.ctx_tokens[n].astype(jnp.float32), j.ctx),
        down_s=w(req["download_s"], j.down_s)))


def _run_jobs(s, in_draft, in_svc, params):
    job, comm_svc, left = serve_slot(s.job, in_svc, params)
    comm_part = jnp.where(in_svc, comm_svc, 0.0)
    remaining = jnp.where(in_svc, left.astype(jnp.int32),
                          s.remaining - in_draft.astype(jnp.int32))
    return s.replace(job=job), comm_part, remaining


def serve(s, params):
    """``Server.serve``: the running jobs progress by ``serve_slot``; ``remaining`` is 0 for
    a job whose work is done, 1 otherwise."""
    return base.slotted_serve(s, params, _run_jobs)


def serve_slot(job: ServiceJob, in_svc, params):
    """One slot of the batching server (roofline clocks; docs/latency.md "batching server").

    Each running job spends its τ in order: upload (its own channel), server prefill, decode,
    download. The server first runs every prefill of the slot (they stall decoding: a job's
    decode window is what its τ leaves after its upload and ALL of the slot's prefill time),
    then decodes the batch: ``b`` = running jobs with LLM tokens left at the start of the slot
    (each holds one of the M sequence slots), every step costs
    ``latency.decode_step_s(llm, server, b, Σ contexts)`` with the contexts at the start of the
    slot, and each job decodes ``min(tokens left, window / step)`` tokens. A job whose decode
    ends this slot downloads in the time its decoding left; a job past decoding downloads from
    the start of its τ (no stall).

    Args:
      job: ``ServiceJob`` [U]; in_svc: [U] bool, the users in SERVICE this slot.

    Returns:
      ``(job, comm_s [U], left [U] bool)``: the remaining work, the seconds of this slot spent
      on upload + download (the rest of τ counts as processing), and whether work remains.
    """
    lp = params.latency
    tau = params.tau_s
    zero = jnp.zeros_like(job.up_s)
    up = jnp.where(in_svc, job.up_s, 0.0)
    pf = jnp.where(in_svc, job.prefill_s, 0.0)
    dec = jnp.where(in_svc, job.dec_tok, 0.0)
    down = jnp.where(in_svc, job.down_s, 0.0)
    u = jnp.minimum(up, tau)                       # upload this slot
    a = tau - u
    p = jnp.minimum(pf, a)                         # own prefill this slot
    pf_left = pf - p
    p_all = jnp.sum(p)                             # every prefill of the slot stalls decoding
    decoding = dec > 0
    b = jnp.sum(decoding.astype(jnp.float32))
    step_s = lat.decode_step_s(lp.llm, lp.server_hw, jnp.maximum(b, 1.0),
                               jnp.sum(jnp.where(decoding, job.ctx, 0.0)))
    window = jnp.where(decoding & (pf_left <= 0) & (up - u <= 0),
                       jnp.maximum(a - p_all, 0.0), 0.0)
    n_tok = jnp.minimum(dec, window / step_s)
    dec_left = dec - n_tok
    after_dec = jnp.where(decoding, window - n_tok * step_s, a - p)
    can_down = (up - u <= 0) & (pf_left <= 0) & (dec_left <= 0)
    d = jnp.where(can_down, jnp.minimum(down, jnp.maximum(after_dec, 0.0)), 0.0)
    down_left = down - d
    new = ServiceJob(up_s=jnp.where(in_svc, up - u, job.up_s),
                     prefill_s=jnp.where(in_svc, pf_left, job.prefill_s),
                     dec_tok=jnp.where(in_svc, dec_left, job.dec_tok),
                     ctx=jnp.where(in_svc, job.ctx + n_tok, job.ctx),
                     down_s=jnp.where(in_svc, down_left, job.down_s))
    left = (up - u > 0) | (pf_left > 0) | (dec_left > 0) | (down_left > 0)
    return new, jnp.where(in_svc, u + d, zero), in_svc & left



SERVER = base.Server(
    name="legacy", tracks_prefixes=False, scores_on_server=False, empty_job=empty_job,
    free_resources=base.slotted_free_resources, request=request, start_jobs=start_jobs,
    serve=serve, finish_jobs=base.plain_finish, cut_at_fallback=base.no_cut,
    end_slot=base.no_end_slot, offered_s=base.slotted_offered_s)
