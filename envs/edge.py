"""Multi-user slotted edge/server environment of docs/design.md §4 as pure reset/step functions.

Model (every choice below is an assumption where the PRADA paper is silent):

* Time advances in slots of ``tau_s``. ``U`` user slots; a user slot is EMPTY or holds one user
  solving one problem (a walk down that problem's step tree in the trace set).
* Phases of a user: DRAFT (the edge SLM prefills what is new and drafts a step; lasts
  ``max(1, ceil(delay/τ))`` slots), DECIDE (a decision point at the start of a slot, takes no
  time), QUEUE (waits whole slots), SERVICE (upload + server compute + download as one job that
  holds one server unit and the request's bandwidth for ``max(1, ceil(D/τ))`` slots).
* At a decision point the screening action is 0 = keep the draft (resolved at once: the user
  moves to child 0 and starts drafting the next step in the same slot) or 1 = nominate. The
  stage-2 scheduler (``params.scheduler``, an index into ``prada_jax.sched.SCHEDULERS``) then
  assigns every nomination and every queued request local / queue / immediate. The env enforces,
  whatever the scheduler says: a request that has waited ``max_wait_slots`` is not queued again
  (local); an immediate request whose SNR is below γ_th is an outage (done locally, no resource
  used); if the immediates still exceed the free server units or bandwidth they are admitted in
  user-slot order while the running totals fit (``prada_jax.sched.base.prefix_admit``; the
  schedulers here never over-ask, so this is a safety net) and the rest queue. A finished service moves the user to child 1 (the LLM's step).
* The RSD scheduler ignores the screening action (every step is a candidate) and the env charges
  the online PRM's forward pass to every draft (``prada_jax.latency.prm_delay_s``).
* Scenario schedule (``envs.scenarios``): per-slot factors on the arrival rate, bandwidth B,
  mean SNR and server units M, read at index ``t mod L`` (``slot_conditions``). New jobs are
  admitted only while units and bandwidth in use stay within M_t and B_t; a running job keeps
  its unit when M_t drops (no preemption). The default schedule (L = 1, factors 1) is static.
* Arrivals: ``Poisson(arrival_rate_hz·τ)`` (times the scenario's factor of the slot) per slot, placed at the end of the slot into EMPTY
  user slots in index order (slot u gets problem ``noise.problem[u]``); the rest are blocked and
  counted. ``reset`` places ``initial_users`` users.
* Rewards are emitted when a step's branch is known (the slot it resolves local or immediate;
  for a queued request, the slot it leaves the queue), to the user slot that made the decision:
  ``coarse``: ``cand_prm[n, a] − prm[n] − β·(draft delay + a·server compute delay)``; ``true``:
  also ``− β·(a·(upload + download) + slots waited·τ)``. ``a`` is the branch actually taken.
  A learner attributes the reward of slot t to the user's latest decision at or before t.
* Delay accounting per user (slot-quantised, so it sums to the wall-clock latency): each slot in
  DRAFT adds τ to processing, in QUEUE τ to queueing, in SERVICE τ split between communication
  and processing in proportion to (upload + download) : server compute.
* ``server_kv_cache``: the server keeps each user's context. Under the serving server it is
  the default (``envs.prefix_cache``: the engines' prefix cache; the upload carries the whole
  context, the server prefills only the tokens its cache lacks, and a KV budget evicts the
  least recently used prefix); under the other servers it is off by default and an upload
  sends and prefills only the tokens the server has not seen (unbounded). The edge SLM always
  keeps its own KV cache.
* Clock (``make_params(hardware=...)``, docs/latency.md): ``paper`` (default) prices phases by
  FLOPs and a job holds its unit for ``max(1, ceil(D/τ))`` slots, as above. A roofline pair
  prices them by ``prada_jax.latency``'s roofline, M is the most concurrent server sequences
  (bounded by the server's KV memory), and a job progresses each slot at the rate the current
  batch allows (``envs.servers.legacy.serve_slot``): upload, prefill (all prefills of a slot
  stall the batch), decode at ``decode_step_s(b, Σ contexts)``, download; it ends when its
  work is done.
* Server model of a roofline pair (``make_params(server_model=...)``, static): ``serving`` (the
  default) is the continuous-batching server of ``envs.serving`` (M concurrent sequences, each
  held until its last token; chunked prefill in a per-iteration token budget; the LLM alone
  keeps one resident sequence for its whole solution; the RSD baseline's PRM runs on the server
  as a SCORE job before each decision; uploads and downloads share the cell's links by
  processor sharing); ``legacy`` the batching server above (results before issue 41).

With ``U = 1``, ``arrival_rate_hz = 0``, ``initial_users = 1``, unlimited M and B, no outage
(``snr_threshold_db = -inf``) and the ``offload_all`` scheduler, one episode is the single-user

Layout (``sched/``'s shape): ``envs.state`` (phases, ``EnvState``, actions, noise),
``envs.params`` (``EnvParams`` and what reads it per slot), ``envs.build`` (``make_params`` from
small builders), ``envs.population`` (arrivals, drafts, observations), ``envs.slot`` (one slot,
``step_with_noise``), ``envs.servers`` (one module per server model, chosen by
``envs.servers.registry``). This module is the env's public API and re-exports their names.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from envs import slot
from envs.build import make_params
from envs.llm_path import LLMPath, llm_path
from envs.params import (DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, REWARD_MODES,
                         SIZE_PRESETS, EnvParams, phase_slots, replace_traces,
                         sched_params, slot_conditions, with_scenario)
from envs.population import admit, draw_noise, observe, poisson_from_uniform, poisson_inverse_cdf
from envs.server_memory import check_num_servers, max_num_servers
from envs.servers.legacy import ServiceJob
from envs.servers.registry import SERVER_MODELS, server_of
from envs.slot import CandidateSet, candidate_set, free_resources, request_scalars
from envs.state import (DECIDE, DRAFT, EMPTY, QUEUE_PHASE, SCORE, SERVICE, DiscreteSpec,
                        EdgeAction, EnvState, Noise, empty_state)
from prada_jax.sched.base import IMMEDIATE, LOCAL, QUEUE
from prada_jax.sched.registry import RSD_INDEX, SCHEDULERS

__all__ = [
    "CandidateSet", "DECIDE", "DEFAULT_MAX_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "DRAFT",
    "DiscreteSpec", "EMPTY", "EdgeAction", "EnvParams", "EnvState", "IMMEDIATE", "LLMPath",
    "LOCAL", "Noise", "QUEUE", "QUEUE_PHASE", "REWARD_MODES", "RSD_INDEX", "SCHEDULERS", "SCORE",
    "SERVER_MODELS", "SERVICE", "SIZE_PRESETS", "ServiceJob", "action_spec", "candidate_set",
    "check_num_servers", "draw_noise", "free_resources", "llm_path", "make_params",
    "max_num_servers", "observation_spec", "phase_slots", "poisson_from_uniform",
    "poisson_inverse_cdf", "replace_traces", "request_scalars", "reset", "sched_params",
    "slot_conditions", "step", "step_with_noise", "with_scenario",
]


def observation_spec(params: EnvParams) -> jax.ShapeDtypeStruct:
    """obs [U, F + 2] float32: node features, step index (depth), context tokens · ctx_scale."""
    return jax.ShapeDtypeStruct((params.num_users, params.obs_dim), jnp.float32)


def action_spec(params: EnvParams) -> DiscreteSpec:
    """[U] int32 in {0 keep draft, 1 nominate} (or an ``EdgeAction`` carrying gains)."""
    return DiscreteSpec(shape=(params.num_users,), dtype=jnp.int32, num_values=2)


def reset(key, params: EnvParams):
    """Empty env plus ``initial_users`` users with random problems (their first slot is 0).

    Returns:
      obs [U, F+2] float32, state ``EnvState``.
    """
    noise = draw_noise(key, params)
    state, _, _ = admit(empty_state(params.num_users, server_of(params)), params,
                         params.initial_users, noise.problem, jnp.asarray(0, jnp.int32))
    return observe(state, params), state


def step_with_noise(state: EnvState, action, params: EnvParams, noise: Noise):
    """``step`` with its randomness given (``envs.slot.step_with_noise``, the info keys there),
    deciding with this module's ``SCHEDULERS`` (read when traced: a test may replace it)."""
    return slot.step_with_noise(state, action, params, noise, SCHEDULERS)


def step(key, state: EnvState, action, params: EnvParams):
    """One slot. ``action``: [U] int32 screening actions or an ``EdgeAction``.

    Returns:
      obs [U, F+2], state, reward [U] float32, done [U] bool (a user's solution ended this
      slot), info dict (see ``step_with_noise``).
    """
    return step_with_noise(state, action, params, draw_noise(key, params))
