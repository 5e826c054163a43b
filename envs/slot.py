"""One slot of the edge env (``step_with_noise``), in the order a slot runs: the candidate set
(``candidate_set``), the scheduler's decisions under the env's hard rules (``_decide``), the
moves and rewards they cause (``_resolve``), the server's slot (``Server.serve``), the end of the
slot (``_end_of_slot``) and the drafts that start (``_start_drafts``). The server model is the
``envs.servers.base.Server`` that ``envs.servers.registry.server_of`` returns; this module calls
its functions and never names a model.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from envs import population
from envs.params import EnvParams, MAX_PHASE_SLOTS, phase_slots, sched_params, slot_conditions
from envs.servers.registry import server_of
from envs.state import (DECIDE, DRAFT, EMPTY, QUEUE_PHASE, SCORE, SERVICE, EdgeAction, EnvState,
                        Noise)
from prada_jax.sched.base import IMMEDIATE, LOCAL, QUEUE, SchedInputs, prefix_admit
from prada_jax.sched.registry import RSD_INDEX, SCHEDULERS


def request_scalars(state: EnvState, params: EnvParams, fading):
    """Per-user request scalars if the user's current step were offloaded this slot.

    The scenario at slot ``state.t`` applies: ``fading`` is scaled by its channel gain and a
    request's bandwidth is capped at B_t.

    Returns a dict of [U] arrays: ``snr`` (linear), ``outage`` (bool), ``bandwidth_hz``,
    ``upload_s``, ``server_s``, ``download_s``, ``delay_s`` (D = their sum), ``upload_tokens``
    and ``prefill_tokens`` (the server prefills what its cache lacks: ``cached_tokens`` of the
    context are reused; under the serving server the upload carries the whole context, under
    the other servers only the uncached tokens);
    under a roofline clock also ``prefill_s`` (the server prefill part of ``server_s``). Under
    the serving server ``bandwidth_hz`` is the slot-average uplink bandwidth the upload needs
    (``up_hz · min(upload_s, τ) / τ``: what it takes of B_t this slot), ``up_hz`` /
    ``down_hz`` the bandwidths the upload / download transmit at, ``pf_flops`` the prefill's
    FLOPs, ``dec_tok`` the tokens the job decodes (the LLM alone: its whole solution), and
    ``load_s`` the job's offered load ``M_t · latency.job_load_s`` [s] (so Σ load_s over
    offered jobs / Σ M_t·τ is ρ).

    ``delay_s`` is the seconds the job holds one of the M server sequence slots when the server
    runs a full batch: under ``paper`` the job's fixed service time; under a roofline clock
    upload + prefill + the LLM step decoded with M_t sequences in every step + download (the
    batching server usually serves it faster, with fewer sequences in the batch).
    """
    return server_of(params).request(state, params, fading)


def free_resources(state: EnvState, params: EnvParams):
    """``(free_units int32, free_bw_hz float32)`` at the start of slot ``state.t``: M_t and
    B_t minus what running jobs hold, floored at 0 (a job keeps its unit when M_t drops)."""
    return server_of(params).free_resources(state, params)


class CandidateSet(NamedTuple):
    """The requests the stage-2 scheduler decides in one slot, and what it can use.

    x: ``SchedInputs`` [U] (non-candidates masked by ``x.candidate``); free_units: int32 scalar,
    server units not held by running jobs; free_bw_hz: float32 scalar, bandwidth not held [Hz];
    req: ``request_scalars`` of every user this slot; deciding / nominated / queued: [U] bool,
    users at a decision point / that nominate (or every decider under RSD) / already waiting.
    """

    x: SchedInputs
    free_units: Any
    free_bw_hz: Any
    req: dict
    deciding: Any
    nominated: Any
    queued: Any


def candidate_set(state: EnvState, action, params: EnvParams, noise: Noise) -> CandidateSet:
    """The slot's candidate set as ``step_with_noise`` hands it to the scheduler (the one place
    it is built: stage-2 rollouts read it from here). ``action``: [U] int32 or ``EdgeAction``."""
    tr = params.traces
    u = params.num_users
    if isinstance(action, EdgeAction):
        screen = jnp.asarray(action.screen, jnp.int32)
        gain_in = jnp.asarray(action.gain, jnp.float32)
    else:
        screen = jnp.asarray(action, jnp.int32)
        gain_in = jnp.full((u,), params.default_gain, jnp.float32)
    phase, n = state.phase, state.node
    deciding = phase == DECIDE
    nominated = deciding & ((screen == 1) | (params.scheduler == RSD_INDEX))
    queued = phase == QUEUE_PHASE
    cand = nominated | queued
    gain = jnp.where(deciding, gain_in, state.gain)
    req = request_scalars(state, params, noise.fading)
    free_units, free_bw = free_resources(state, params)  # the scenario's M_t, B_t
    m_t = slot_conditions(params, state.t)["num_servers"]
    x = SchedInputs(candidate=cand, gain=gain, delay_s=req["delay_s"],
                    bandwidth_hz=req["bandwidth_hz"], wait_slots=state.wait,
                    ctx_tokens=tr.ctx_tokens[n], snr=req["snr"], draft_prm=tr.cand_prm[n, 0],
                    u_rand=noise.u_sched, queue_len=jnp.sum(queued.astype(jnp.int32)),
                    comm_s=req["upload_s"] + req["download_s"], num_servers_t=m_t)
    return CandidateSet(x=x, free_units=free_units, free_bw_hz=free_bw, req=req,
                        deciding=deciding, nominated=nominated, queued=queued)



def step_with_noise(state: EnvState, action, params: EnvParams, noise: Noise,
                    schedulers=SCHEDULERS):
    """``step`` with its randomness given (the NumPy reference takes the same ``noise``);
    ``schedulers``: the tuple ``params.scheduler`` indexes (``prada_jax.sched.SCHEDULERS``).

    A slot runs four phases: the scheduler decides the candidates (``_decide``), decisions
    move users to their next phase and earn rewards (``_resolve``), the server runs its slot
    and charges the slot's time by phase (``Server.serve``), and at the end of the slot
    finished phases advance (``_end_of_slot``) before arrivals are placed and new drafts
    start (``_start_drafts``).

    info keys ([U] unless noted):
      decision_mask (bool, the action was consumed), nominated, decision (int32: −1 none,
      0 local, 1 queue, 2 immediate; after enforcement), outage (bool), at_decision (bool, the
      user will decide next slot), terminated (= done), truncated (all False),
      finished users (valid where done): user_correct, user_latency_s, user_processing_s,
      user_communication_s, user_queueing_s, user_offloads, user_outages, user_steps,
      user_fallbacks; per slot scalars: server_in_use, bandwidth_in_use_hz, queue_len,
      arrivals, blocked, active_users, num_servers_t and bandwidth_t_hz (M_t, B_t of the
      scenario at this slot), offered_jobs and offered_job_s (new nominations this slot that
      asked for the server, and the server-unit seconds they would hold,
      Σ ``phase_slots(delay_s)``·τ [s]); cumulative scalars: arrived, finished, blocked_total,
      in_flight.
    """
    srv = server_of(params)
    t = state.t
    cs = candidate_set(state, action, params, noise)
    cond = slot_conditions(params, t)
    n_arrivals = population.poisson_from_uniform(noise.u_arrival,
                                                 cond["arrival_rate_hz"] * params.tau_s)
    dec, out_hit = _decide(state, params, cs, schedulers)
    s, reward, res = _resolve(state, params, cs, dec, out_hit)
    s, in_draft, in_svc, slot_use = srv.serve(s, params)
    s, done, info_user, cont_svc, cache_in, score_done = _end_of_slot(s, params, res, in_draft,
                                                                      in_svc, t)
    s, blocked = _start_drafts(s, params, noise, n_arrivals, res.cont_local, cont_svc, cache_in,
                               t)
    zero = jnp.zeros((), jnp.float32)
    admitted = cs.x.candidate & (dec == IMMEDIATE)
    hits = dict(prefix_hit_tokens=jnp.sum(jnp.where(admitted, cs.req["cached_tokens"], 0)
                                          ).astype(jnp.float32),
                prefix_ctx_tokens=jnp.sum(jnp.where(admitted, params.traces.ctx_tokens[state.node],
                                                    0)).astype(jnp.float32),
                evicted_tokens=zero, kv_in_use_tokens=zero, kv_pinned_tokens=zero)
    s, prm_load, hits = srv.end_slot(s, params, noise, score_done, in_svc, t, hits)
    decision = jnp.where(cs.x.candidate | cs.deciding, dec, -1)
    decision = jnp.where(cs.deciding & ~cs.nominated, LOCAL, decision)
    # Offered server work (evals' load ρ): new nominations that asked for the server (queued,
    # admitted, or lost to an outage), each at the slots it would hold a unit.
    offered = cs.nominated & ((dec != LOCAL) | out_hit)
    offered_s = srv.offered_s(cs.req, offered, params)
    info = dict(
        decision_mask=cs.deciding, nominated=cs.nominated, decision=decision, outage=out_hit,
        at_decision=s.phase == DECIDE, terminated=done, truncated=jnp.zeros_like(done),
        **info_user,
        **slot_use,
        arrivals=n_arrivals, blocked=blocked, num_servers_t=cond["num_servers"],
        offered_jobs=jnp.sum(offered.astype(jnp.int32)),
        offered_job_s=jnp.sum(offered_s) + prm_load, prm_load_s=prm_load,
        bandwidth_t_hz=cond["bandwidth_hz"],
        active_users=jnp.sum(s.active.astype(jnp.int32)),
        arrived=s.arrived, finished=s.finished, blocked_total=s.blocked,
        in_flight=jnp.sum(s.active.astype(jnp.int32)), **hits)
    return population.observe(s, params), s, reward.astype(jnp.float32), done, info


def _decide(state: EnvState, params: EnvParams, cs: CandidateSet, schedulers):
    """The scheduler's decisions after the env's hard rules.

    Returns ``(dec [U] int32, out_hit [U] bool)``: LOCAL / QUEUE / IMMEDIATE per candidate
    (LOCAL elsewhere) and the immediates turned local by an outage.
    """
    x, req = cs.x, cs.req
    cand = x.candidate
    dec = jax.lax.switch(params.scheduler, schedulers, x, cs.free_units, cs.free_bw_hz,
                         sched_params(params))
    dec = jnp.where(cand, jnp.clip(dec.astype(jnp.int32), LOCAL, IMMEDIATE), LOCAL)

    # Hard rules the env enforces whatever the scheduler asked.
    exp = state.wait >= params.max_wait_slots
    dec = jnp.where((dec == QUEUE) & exp, LOCAL, dec)
    out_hit = cand & (dec == IMMEDIATE) & req["outage"]
    # An outage keeps the step local; with no draft to keep (llm_only) it waits a slot.
    dec = jnp.where(out_hit, jnp.where(params.llm_only, QUEUE, LOCAL), dec)
    want = cand & (dec == IMMEDIATE)
    ok = prefix_admit(want, req["bandwidth_hz"], cs.free_units, cs.free_bw_hz)
    dec = jnp.where(want & ~ok, jnp.where(exp, LOCAL, QUEUE), dec)
    return dec, out_hit


class _Resolution(NamedTuple):
    """How this slot's decisions resolved ([U] bool unless noted): kept local and finished /
    continuing, ``corr_local`` the correctness of the local branch (valid where finished)."""

    fin_local: Any
    cont_local: Any
    corr_local: Any

def _resolve(state: EnvState, params: EnvParams, cs: CandidateSet, dec, out_hit):
    """Moves each resolved or queued user to its next phase and computes the slot's rewards.

    Returns ``(state, reward [U] float32, _Resolution)``; a kept step's next draft length is
    left for ``_start_drafts``.
    """
    srv = server_of(params)
    tr = params.traces
    tau = params.tau_s
    phase, n, req = state.phase, state.node, cs.req
    deciding, nominated, cand, gain = cs.deciding, cs.nominated, cs.x.candidate, cs.x.gain
    res_local = (deciding & ~nominated) | (cand & (dec == LOCAL))
    res_imm = cand & (dec == IMMEDIATE)
    to_queue = cand & (dec == QUEUE)
    resolved = res_local | res_imm
    branch = res_imm.astype(jnp.int32)

    comm_step = req["upload_s"] + req["download_s"]
    compute = state.draft_s + jnp.where(res_imm, req["server_s"], 0.0)
    extra = jnp.where(params.true_reward,
                      jnp.where(res_imm, comm_step, 0.0) + state.wait.astype(jnp.float32) * tau,
                      0.0)
    prm_gain = tr.cand_prm[n, branch] - tr.prm[n]
    reward = jnp.where(resolved, prm_gain - params.beta * (compute + extra), 0.0)

    nxt0, term0, corr0, fb0 = population.successor(tr, n, jnp.zeros_like(n))
    _, _, _, fb1 = population.successor(tr, n, jnp.ones_like(n))
    fin_local = res_local & term0
    cont_local = res_local & ~term0
    d_total = jnp.maximum(req["delay_s"], 1e-30)

    phase1 = jnp.where(cont_local, DRAFT, phase)
    phase1 = jnp.where(fin_local, EMPTY, phase1)
    phase1 = jnp.where(res_imm, SERVICE, phase1)
    phase1 = jnp.where(to_queue, QUEUE_PHASE, phase1)
    s = state.replace(
        phase=phase1,
        node=jnp.where(cont_local, nxt0, n),
        # cont_local: the next draft starts this slot; its length is filled in later.
        remaining=jnp.where(cont_local, MAX_PHASE_SLOTS,
                            jnp.where(res_imm, phase_slots(req["delay_s"], tau), state.remaining)),
        wait=jnp.where(resolved, 0, state.wait),
        gain=gain,
        svc_bw_hz=jnp.where(res_imm, req["bandwidth_hz"], state.svc_bw_hz),
        svc_comm_frac=jnp.where(res_imm, comm_step / d_total, state.svc_comm_frac),
        server_cached=jnp.where(res_imm, tr.ctx_tokens[n] + tr.cand_tokens[n, 1],
                                state.server_cached),
        offloads=state.offloads + res_imm.astype(jnp.int32),
        outages=state.outages + out_hit.astype(jnp.int32),
        steps=state.steps + resolved.astype(jnp.int32),
        fallbacks=state.fallbacks + (res_local & fb0 | res_imm & fb1).astype(jnp.int32),
    )
    s = srv.cut_at_fallback(s, params, cont_local & fb0, n)
    s = srv.start_jobs(s, state, params, req, res_imm)
    return s, reward, _Resolution(fin_local=fin_local, cont_local=cont_local, corr_local=corr0)


def _end_of_slot(s: EnvState, params: EnvParams, res: _Resolution, in_draft, in_svc, t):
    """End of slot ``t``: drafts become decision points; finished jobs move to the LLM's step.

    Returns ``(state, done [U], info_user, cont_svc [U], cache_in [U], score_done [U])``: the
    users whose solution ended, their ``user_*`` info entries, the users whose service
    finished with steps left, each user's SLM cache before a new draft, and the users whose
    online PRM score returned (serving server; they decide next slot).
    """
    tr = params.traces
    tau = params.tau_s
    draft_done = in_draft & ~res.cont_local & (s.remaining <= 0)
    score_done = in_svc & (s.phase == SCORE) & (s.remaining <= 0)
    svc_done = in_svc & (s.phase == SERVICE) & (s.remaining <= 0)
    srv = server_of(params)
    nxt1, term1, corr1, fb1 = population.successor(tr, s.node, jnp.ones_like(s.node))
    s, term1, corr1 = srv.finish_jobs(s, params, svc_done, term1, corr1, fb1)
    fin_svc = svc_done & term1
    cont_svc = svc_done & ~term1
    # SLM cache before each new draft: kept draft → as after drafting; LLM step → the prefix.
    cache_in = jnp.where(cont_svc, tr.ctx_tokens[s.node], s.edge_cached)
    phase2 = jnp.where(draft_done | score_done, DECIDE, s.phase)
    phase2 = jnp.where(cont_svc, DRAFT, phase2)
    phase2 = jnp.where(fin_svc, EMPTY, phase2)
    s = srv.cut_at_fallback(s, params, cont_svc & fb1, s.node)
    s = s.replace(
        phase=phase2,
        node=jnp.where(cont_svc, nxt1, s.node),
        svc_bw_hz=jnp.where(svc_done, 0.0, s.svc_bw_hz))

    fin_local = res.fin_local
    done = fin_local | fin_svc
    boundary = jnp.where(fin_local, t, t + 1)
    n_done = jnp.sum(done.astype(jnp.int32))
    info_user = dict(
        user_correct=jnp.where(fin_local, res.corr_local, corr1) & done,
        user_latency_s=jnp.where(done, (boundary - s.arrival_slot).astype(jnp.float32) * tau, 0.0),
        user_processing_s=jnp.where(done, s.proc_s, 0.0),
        user_communication_s=jnp.where(done, s.comm_s, 0.0),
        user_queueing_s=jnp.where(done, s.queue_s, 0.0),
        user_offloads=jnp.where(done, s.offloads, 0),
        user_outages=jnp.where(done, s.outages, 0),
        user_steps=jnp.where(done, s.steps, 0),
        user_fallbacks=jnp.where(done, s.fallbacks, 0))
    s = s.replace(finished=s.finished + n_done, t=t + 1)
    return s, done, info_user, cont_svc, cache_in, score_done


def _start_drafts(s: EnvState, params: EnvParams, noise: Noise, n_arrivals, cont_local,
                  cont_svc, cache_in, t):
    """Places the slot's arrivals, then starts every draft that begins this slot (kept step,
    finished job, new user) in one pass. Returns ``(state, blocked int32)``."""
    rsd_on = params.scheduler == RSD_INDEX
    s, blocked, admit = population.admit(s, params, n_arrivals, noise.problem, t + 1,
                                         draft=False)
    fresh = cont_svc | admit
    starts = cont_local | fresh
    d_s, d_slots, cache_out = population.start_draft(params, s.node,
                                                     jnp.where(admit, 0, cache_in), rsd_on)
    left_local = d_slots - 1  # a kept step's next draft already used this slot
    s = s.replace(
        phase=jnp.where((cont_local & (left_local <= 0)) | (fresh & (d_slots <= 0)), DECIDE,
                        s.phase),
        remaining=jnp.where(cont_local, left_local, jnp.where(fresh, d_slots, s.remaining)),
        draft_s=jnp.where(starts, d_s, s.draft_s),
        edge_cached=jnp.where(starts, cache_out, s.edge_cached))
    return s, blocked
