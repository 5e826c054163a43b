"""One slot of the serving server (continuous batching, chunked prefill) as a pure jnp function.

The engine of the serving server model (``envs.servers.serving``): a roofline pair with
``server_model="serving"`` (the default; docs/latency.md "The serving server"). It models what
vLLM / SGLang / Sarathi-Serve do, at the env's slot granularity τ, as a fluid over the slot:

* **Jobs.** Each user slot holds at most one server job (``ServingJob``, [U] arrays): an LLM job
  (a nominated step, or the LLM alone's whole solution) or a PRM job (the RSD baseline's
  online scoring pass). A job uploads, is prefilled, decodes, and downloads, in that order.
* **Sequences.** An LLM job holds one of the M concurrent sequence slots from admission until
  its last token is produced (``holds_sequence``); the download holds no server memory. A PRM
  job holds none (its pass keeps no KV). M = ``num_servers`` (at most the KV bound, checked by
  ``envs.edge.make_params``).
* **Iterations.** The server runs back-to-back iterations. Each decodes one token of every
  sequence in the running batch (b = jobs decoding at the start of the slot) and takes up to
  ``budget − b`` prefill tokens (``max_batched_tokens``: vLLM's ``max_num_batched_tokens``,
  Sarathi-Serve's chunk budget) from the prefill backlog, first come first served by
  admission slot (ties by user slot). An iteration costs its roofline:
  ``max((F_decode + F_chunk) / (peak·η), bytes / (BW·η_mem))`` with F_decode =
  ``latency.decode_step_flops(b, Σ contexts)``, F_chunk = chunk tokens × the backlog's mean
  FLOPs per prefill token, bytes = the weights of each model the iteration runs (LLM, PRM)
  + the batch's KV cache. So a prefill piggybacks on a memory-bound decode for free up to the
  compute roofline and stalls it beyond: neither "in parallel for free" nor "a whole slot".
  Within a slot the iterations with chunks run first (until the backlog is empty or τ is
  spent), then pure decode iterations.
* **Slot granularity.** A job joins the backlog in the slot its upload ends; a job whose
  prefill ends in a slot starts decoding in the next; a job whose last token is produced in
  a slot downloads in what is left of it and frees its sequence at its end.
* **The cell.** Uploads share the uplink and downloads the downlink (FDD: two bands of width
  B_t) by processor sharing: a transfer needs ``bandwidth · seconds`` of spectrum (Hz·s) at its
  own requested bandwidth; when the slot's demand exceeds ``B_t·τ`` every transfer progresses
  at the share ``B_t·τ / demand`` (the link binds and reports it).

All functions are pure and jit-able; fixed shapes [U]; cost linear in U except one stable sort
of U keys per slot (the FCFS prefill order).
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct

from prada_jax import latency as lat

#: A transfer or prefill remainder below this is done (float32 residue of the fluid).
_EPS = 1e-9


@struct.dataclass
class ServingJob:
    """Remaining work of each user slot's server job ([U]; valid where the user's phase is
    SERVICE or SCORE).

    ``up_s``: upload seconds left at the request's bandwidth ``up_hz`` [s, Hz]; ``pf_tok``:
    tokens left to prefill; ``pf_flops``: FLOPs of that prefill left [FLOP]; ``dec_tok``: tokens
    left to decode; ``ctx``: tokens in the job's sequence (its KV cache, read by each decode
    step); ``down_s`` / ``down_hz``: download seconds left and its bandwidth; ``seq``: bool, the
    job holds a sequence slot (LLM) or not (PRM); ``prm``: bool, a PRM job (its pass runs the
    PRM's weights); ``ticket``: int32, the slot the job was admitted (FCFS prefill order).
    """

    up_s: Any
    up_hz: Any
    pf_tok: Any
    pf_flops: Any
    dec_tok: Any
    ctx: Any
    down_s: Any
    down_hz: Any
    seq: Any
    prm: Any
    ticket: Any


def empty_job(u: int) -> ServingJob:
    zf = jnp.zeros((u,), jnp.float32)
    zb = jnp.zeros((u,), bool)
    return ServingJob(up_s=zf, up_hz=zf, pf_tok=zf, pf_flops=zf, dec_tok=zf, ctx=zf, down_s=zf,
                      down_hz=zf, seq=zb, prm=zb, ticket=jnp.zeros((u,), jnp.int32))


def holds_sequence(job: ServingJob, in_job):
    """[U] bool: the job holds one of the M sequence slots (an LLM job not yet past its last
    token)."""
    return in_job & job.seq & ((job.up_s > 0) | (job.pf_tok > 0) | (job.dec_tok > 0))


def uplink_demand_hz(job: ServingJob, in_job, tau_s):
    """[U] slot-average uplink bandwidth [Hz] each upload in flight needs this slot:
    ``up_hz · min(up_s, τ) / τ``."""
    return jnp.where(in_job & (job.up_s > 0), job.up_hz * jnp.minimum(job.up_s, tau_s) / tau_s,
                     0.0)


def _share(demand_hz_s, capacity_hz_s):
    """Processor-sharing factor of a link: 1 if the demand fits, else capacity / demand."""
    return jnp.where(demand_hz_s > capacity_hz_s,
                     capacity_hz_s / jnp.maximum(demand_hz_s, 1e-30), 1.0)


def _fcfs_before(tokens, ticket, in_backlog):
    """[U] backlog tokens ahead of each job in FCFS order (admission slot, then user slot)."""
    u = tokens.shape[0]
    idx = jnp.arange(u, dtype=jnp.int32)
    key = jnp.where(in_backlog, ticket, jnp.iinfo(jnp.int32).max)
    order = jnp.lexsort((idx, key))              # last key most significant; stable
    tok_sorted = jnp.where(in_backlog, tokens, 0.0)[order]
    before_sorted = jnp.cumsum(tok_sorted) - tok_sorted
    return jnp.zeros((u,), jnp.float32).at[order].set(before_sorted)


def _uplink(job: ServingJob, in_job, tau, bandwidth_hz):
    """Uplink progress of the slot (processor sharing): ``(up, up_left, comm_up, up_dem)``,
    the upload seconds at the start and left, each job's transfer seconds, the demand [Hz·s]."""
    up = jnp.where(in_job, job.up_s, 0.0)
    up_need = jnp.minimum(up, tau)
    up_dem = jnp.sum(job.up_hz * up_need)
    phi_up = _share(up_dem, bandwidth_hz * tau)
    u_prog = phi_up * up_need
    up_left = jnp.where(up - u_prog > _EPS, up - u_prog, 0.0)
    comm_up = jnp.where(up > 0, jnp.where(up_left <= 0, up_need, tau), 0.0)
    return up, up_left, comm_up, up_dem


def _iterations(job: ServingJob, decoding, backlog, pf, lp: lat.LatencyParams, tau,
                max_batched_tokens):
    """The slot's iterations: those with a prefill chunk first, then pure decodes. Returns
    ``(b, n_a, n_b, t_a, t_b, time_a, prefilled, clears)``: the decode batch, the numbers of
    chunk and pure-decode iterations, their costs [s], the chunk iterations' time [s], the
    backlog tokens prefilled, and whether the backlog clears this slot."""
    hw = lp.server_hw
    llm, prm = lp.llm, lp.prm
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    b = jnp.sum(f32(decoding))
    csum = jnp.sum(jnp.where(decoding, job.ctx, 0.0))
    tot = jnp.sum(jnp.where(backlog, pf, 0.0))
    tot_flops = jnp.sum(jnp.where(backlog, job.pf_flops, 0.0))
    prm_pending = jnp.any(backlog & job.prm)
    llm_pending = jnp.any(backlog & ~job.prm)

    pk = hw.peak_flops * hw.eta
    bwm = hw.mem_bw * hw.eta_mem
    f_dec = lat.decode_step_flops(llm, b, csum)
    kv = lat.kv_bytes_per_token(llm, hw) * csum
    w_llm = lat.model_weight_bytes(llm, hw)
    w_prm = lat.model_weight_bytes(prm, hw)
    t_b = jnp.where(b > 0, jnp.maximum(f_dec / pk, (w_llm + kv) / bwm), 0.0)
    chunk = jnp.minimum(jnp.maximum(f32(max_batched_tokens) - b, 1.0), tot)
    fbar = tot_flops / jnp.maximum(tot, 1e-30)
    bytes_a = (jnp.where((b > 0) | llm_pending, w_llm, 0.0) + jnp.where(prm_pending, w_prm, 0.0)
               + kv)
    t_a = jnp.maximum((f_dec + chunk * fbar) / pk, bytes_a / bwm)
    has_pf = tot > 0
    n_a_need = jnp.where(has_pf, tot / jnp.maximum(chunk, 1e-30), 0.0)
    clears = n_a_need * t_a <= tau
    time_a = jnp.where(has_pf, jnp.minimum(n_a_need * t_a, tau), 0.0)
    n_a = jnp.where(has_pf, jnp.where(clears, n_a_need, tau / jnp.maximum(t_a, 1e-30)), 0.0)
    n_b = jnp.where(b > 0, (tau - time_a) / jnp.maximum(t_b, 1e-30), 0.0)
    prefilled = jnp.where(clears, tot, n_a * chunk)
    return b, n_a, n_b, t_a, t_b, time_a, prefilled, clears


def _downlink(job: ServingJob, down, was_down, fin_dec, t_last, tau, bandwidth_hz):
    """Downlink progress (processor sharing) of the download seconds ``down``: jobs past
    decoding at the start of the slot (``was_down``) have all of τ; jobs whose last token came
    this slot (``fin_dec``) have what is left after it. Returns ``(down_left, comm_dn,
    dn_dem)``."""
    avail = jnp.where(was_down, tau, jnp.where(fin_dec, jnp.maximum(tau - t_last, 0.0), 0.0))
    dn_need = jnp.minimum(down, avail)
    dn_dem = jnp.sum(job.down_hz * dn_need)
    phi_dn = _share(dn_dem, bandwidth_hz * tau)
    d_prog = phi_dn * dn_need
    down_left = jnp.where(down - d_prog > _EPS, down - d_prog, 0.0)
    comm_dn = jnp.where(dn_need > 0, jnp.where(down_left <= 0, dn_need, avail), 0.0)
    return down_left, comm_dn, dn_dem


def serve_slot(job: ServingJob, in_job, lp: lat.LatencyParams, tau_s, bandwidth_hz,
               max_batched_tokens):
    """One slot of the serving server (rules in the module docstring).

    Args:
      job: ``ServingJob`` [U]; in_job: [U] bool, users whose job runs this slot.
      lp: roofline ``LatencyParams`` (``llm``, ``prm``, ``server_hw``); tau_s: τ [s];
      bandwidth_hz: B_t, the width of each link this slot [Hz]; max_batched_tokens: the
      per-iteration token budget (≥ M + 1).

    Returns:
      ``(job, comm_s [U], left [U] bool, stats)``: the remaining work, the seconds of the slot
      each job spent transferring (upload + download; the rest of τ is processing), whether
      work remains, and per-slot scalars ``batch`` (sequences decoding), ``prefill_tokens``
      (prefilled this slot), ``decode_tokens``, ``busy_s`` (server busy seconds),
      ``iter_s`` (the slot's mean iteration time, 0 if idle), ``uplink_demand`` and
      ``downlink_demand`` (demand / capacity of each link: > 1 means it binds).
    """
    tau = tau_s
    up, up_left, comm_up, up_dem = _uplink(job, in_job, tau, bandwidth_hz)

    # The server: decode batch at the start of the slot, FCFS prefill backlog.
    pf = jnp.where(in_job, job.pf_tok, 0.0)
    dec = jnp.where(in_job, job.dec_tok, 0.0)
    decoding = in_job & (up <= 0) & (pf <= 0) & (dec > 0)
    backlog = in_job & (up_left <= 0) & (pf > 0)
    b, n_a, n_b, t_a, t_b, time_a, prefilled, clears = _iterations(
        job, decoding, backlog, pf, lp, tau, max_batched_tokens)

    # Prefill progress, first come first served.
    before = _fcfs_before(pf, job.ticket, backlog)
    got = jnp.where(backlog, jnp.clip(prefilled - before, 0.0, pf), 0.0)
    got = jnp.where(backlog & clears, pf, got)
    pf_left = jnp.where(pf - got > _EPS * jnp.maximum(pf, 1.0), pf - got, 0.0)
    pf_flops_left = jnp.where(pf > 0, job.pf_flops * pf_left / jnp.maximum(pf, 1e-30), 0.0)

    # Decoding: every sequence of the batch gains one token per iteration.
    n_it = n_a + n_b
    n_tok = jnp.where(decoding, jnp.minimum(dec, n_it), 0.0)
    dec_left = dec - n_tok
    t_last = jnp.where(n_tok <= n_a, n_tok * t_a, time_a + (n_tok - n_a) * t_b)

    down = jnp.where(in_job, job.down_s, 0.0)
    was_down = in_job & (up <= 0) & (pf <= 0) & (dec <= 0) & (down > 0)
    fin_dec = decoding & (dec_left <= 0) & (down > 0)
    down_left, comm_dn, dn_dem = _downlink(job, down, was_down, fin_dec, t_last, tau,
                                           bandwidth_hz)

    new = job.replace(
        up_s=jnp.where(in_job, up_left, job.up_s),
        pf_tok=jnp.where(in_job, pf_left, job.pf_tok),
        pf_flops=jnp.where(in_job, pf_flops_left, job.pf_flops),
        dec_tok=jnp.where(in_job, dec_left, job.dec_tok),
        ctx=jnp.where(in_job, job.ctx + n_tok, job.ctx),
        down_s=jnp.where(in_job, down_left, job.down_s))
    left = in_job & ((up_left > 0) | (pf_left > 0) | (dec_left > 0) | (down_left > 0))
    busy = jnp.where(b > 0, tau, time_a)
    n_iter = jnp.where(b > 0, n_it, n_a)
    stats = dict(batch=b, prefill_tokens=jnp.sum(got), decode_tokens=jnp.sum(n_tok),
                 busy_s=busy, iter_s=jnp.where(n_iter > 0, busy / jnp.maximum(n_iter, 1e-30),
                                               0.0),
                 uplink_demand=up_dem / (bandwidth_hz * tau),
                 downlink_demand=dn_dem / (bandwidth_hz * tau))
    return new, jnp.where(in_job, comm_up + comm_dn, 0.0), left, stats
