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
  batch allows (``_serve_slot``): upload, prefill (all prefills of a slot stall the batch),
  decode at ``decode_step_s(b, Σ contexts)``, download; it ends when its work is done.
* Server model of a roofline pair (``make_params(server_model=...)``, static): ``serving`` (the
  default) is the continuous-batching server of ``envs.serving`` (M concurrent sequences, each
  held until its last token; chunked prefill in a per-iteration token budget; the LLM alone
  keeps one resident sequence for its whole solution; the RSD baseline's PRM runs on the server
  as a SCORE job before each decision; uploads and downloads share the cell's links by
  processor sharing); ``legacy`` the batching server above (results before issue 41).

With ``U = 1``, ``arrival_rate_hz = 0``, ``initial_users = 1``, unlimited M and B, no outage
(``snr_threshold_db = -inf``) and the ``offload_all`` scheduler, one episode is the single-user
screening MDP: the sum of coarse rewards is Σ_k (cand_prm[n_k,a_k] − prm[n_k]) − β·compute cost.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import prefix_cache, scenarios, serving
from prada_jax import latency as lat
from prada_jax.errors import BadInput
from prada_jax.sched.base import IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams, prefix_admit
from prada_jax.sched.registry import RSD_INDEX, SCHEDULERS, scheduler_index
from prada_jax.traces.format import TraceSet

EMPTY, DRAFT, DECIDE, QUEUE_PHASE, SERVICE, SCORE = 0, 1, 2, 3, 4, 5
REWARD_MODES = ("coarse", "true")
#: Server models of a roofline pair (static ``EnvParams.server_model``): ``serving`` the
#: continuous-batching server of ``envs.serving`` (the default since issue 41); ``legacy`` the
#: batching server of earlier results (a job holds its unit through its download, prefills run
#: in parallel, the LLM alone re-queues every step, lm_head FLOPs not counted).
SERVER_MODELS = ("serving", "legacy")
#: vLLM's long-standing default ``max_num_seqs`` (concurrent sequences), the default M of the
#: serving server on datacenter profiles (``make_params(num_servers=None)``).
DEFAULT_MAX_NUM_SEQS = 256
#: Per-iteration token budget (vLLM's ``max_num_batched_tokens`` with chunked prefill: 2048 is
#: its V1 default for the OpenAI server on GPUs below 70 GiB; Sarathi-Serve uses 512-2048).
DEFAULT_MAX_BATCHED_TOKENS = 2048
#: Named env-size presets (``make_params(**SIZE_PRESETS[name])``): ``legacy_m4`` the 4-sequence
#: server and 32-user cell of the results before issue 41 (with the legacy server),
#: ``serving`` a serving engine's batch and a population that can saturate it.
SIZE_PRESETS = {
    "legacy_m4": dict(server_model="legacy", num_servers=4, num_users=32),
    "serving": dict(server_model="serving", num_servers=DEFAULT_MAX_NUM_SEQS, num_users=2048),
}
_MAX_PHASE_SLOTS = 1_000_000  # caps ceil(delay/τ) so a near-zero-rate upload stays an int32
_MAX_ARRIVALS = 64  # truncation of the per-slot Poisson arrival count


@struct.dataclass
class EnvParams:
    """Everything the env step reads. Array leaves can change without recompiling; ``num_users``
    sets shapes and is static.

    Attributes (defaults in ``make_params``; units in brackets):
      traces: the trace set (``TraceSet`` of jnp arrays).
      latency: ``prada_jax.latency.LatencyParams``.
      scheduler: int32 index into ``prada_jax.sched.SCHEDULERS``.
      lambda_s: server-unit multiplier λ_s [PRM units] (threshold rule).
      mu: bandwidth multiplier µ [PRM units / Hz] (threshold rule).
      beta: quality–latency trade-off β [PRM units / s].
      tau_s: slot length τ [s].
      num_servers: M, jobs the server runs at once.
      bandwidth_hz: B, total bandwidth [Hz].
      arrival_rate_hz: λ, Poisson arrival rate [users / s].
      initial_users: users placed by ``reset``.
      default_gain: ΔQ carried by a nomination when the action is a plain int array [PRM units].
      max_wait_slots: a request that has waited this many slots is kept local.
      rsd_threshold: the RSD rule keeps a draft whose PRM score is ≥ this.
      true_reward: bool, ``true`` reward mode (else ``coarse``).
      policy_true_reward: bool, the screening policy whose ΔQ the nominations carry was
        trained with the ``true`` reward (else ``coarse``); the threshold rule then adds no
        communication cost to ΔQ (``prada_jax.sched.threshold``).
      server_kv_cache: bool, the server keeps each user's prefix (under the serving server:
        the prefix cache of ``envs.prefix_cache``, bounded by ``kv_budget_tokens``).
      downlink: bool, charge the download of the LLM step.
      ctx_scale: observation scale of context length [1 / tokens] (obs = tokens · scale).
      scn_arrival, scn_bandwidth, scn_channel_db, scn_servers: the scenario schedule, [L]
        float32 per-slot factors on λ, B, the mean SNR [dB offset] and M (``envs.scenarios``);
        slot t reads index ``t mod L``. Swapping a schedule of the same L does not recompile.
      num_users: U user slots (static).
      llm_only: bool, the paper's All-LLM baseline: the server LLM alone, no edge draft (a
        draft takes no time and no slot, so a user decides as soon as it arrives or its last
        step returns; an outage waits a slot instead of falling back to a draft). Under the
        serving server its sequence stays resident: one job decodes the whole solution (the
        LLM's branch to the end, ``llm_path``) and downloads its last step.
      server_model: ``serving`` or ``legacy`` (``SERVER_MODELS``; static; read only under a
        roofline pair).
      max_batched_tokens: the serving server's per-iteration token budget (decode tokens +
        prefill chunk).
      prm_prefix_cache: bool, the online PRM keeps each user's scored prefix in the same
        prefix cache, so a scoring pass prefills only the tokens new since the user's last
        score (on by default under the serving server; off: every pass prefills the whole
        context + draft).
      kv_budget_tokens: the serving server's KV budget for running sequences + cached
        prefixes [LLM-KV tokens] (``envs.prefix_cache.kv_budget_tokens``; inf elsewhere).
      prm_kv_ratio: KV bytes of a PRM token / an LLM token.
      llm_path: ``LLMPath`` of the trace set (derived by ``make_params``/``replace_traces``).
    """

    traces: TraceSet
    latency: lat.LatencyParams
    scheduler: Any
    lambda_s: Any
    mu: Any
    beta: Any
    tau_s: Any
    num_servers: Any
    bandwidth_hz: Any
    arrival_rate_hz: Any
    initial_users: Any
    default_gain: Any
    max_wait_slots: Any
    rsd_threshold: Any
    true_reward: Any
    server_kv_cache: Any
    downlink: Any
    ctx_scale: Any
    scn_arrival: Any
    scn_bandwidth: Any
    scn_channel_db: Any
    scn_servers: Any
    num_users: int = struct.field(pytree_node=False, default=16)
    policy_true_reward: Any = False
    llm_only: Any = False
    server_model: str = struct.field(pytree_node=False, default="serving")
    max_batched_tokens: Any = DEFAULT_MAX_BATCHED_TOKENS
    prm_prefix_cache: Any = False
    llm_path: Any = None
    kv_budget_tokens: Any = math.inf
    prm_kv_ratio: Any = 1.0

    @property
    def serving(self) -> bool:
        """True for a roofline pair with the serving server (static)."""
        return bool(self.latency.roofline) and self.server_model == "serving"

    @property
    def feature_dim(self) -> int:
        return int(self.traces.feat.shape[1])

    @property
    def obs_dim(self) -> int:
        return self.feature_dim + 2


@struct.dataclass
class EnvState:
    """Per-user-slot arrays ([U]) and scalar counters.

    ``phase``: EMPTY/DRAFT/DECIDE/QUEUE/SERVICE; ``node``: current tree node; ``remaining``:
    slots left in DRAFT/SERVICE; ``wait``: slots the current request has queued; ``gain``: ΔQ of
    the pending nomination; ``draft_s``: compute delay of the current draft [s]; ``svc_bw_hz``
    and ``svc_comm_frac``: bandwidth held and communication share of the running job;
    ``edge_cached`` / ``server_cached``: tokens in the SLM / server KV cache (``prm_cached``:
    the online PRM's, ``cache_used``: the slot the user's server prefixes were last used, the
    prefix cache's LRU order; both None outside the serving server); ``arrival_slot``;
    accumulated ``proc_s``, ``comm_s``, ``queue_s`` [s], ``offloads``, ``outages``, ``steps``,
    ``fallbacks``; scalars ``t`` (next slot index), ``arrived`` (incl. blocked), ``finished``,
    ``blocked``; ``job``: the running jobs' remaining work under a roofline clock
    (``ServiceJob``; None under ``paper``, whose jobs count down ``remaining`` slots).
    """

    phase: Any
    node: Any
    remaining: Any
    wait: Any
    gain: Any
    draft_s: Any
    svc_bw_hz: Any
    svc_comm_frac: Any
    edge_cached: Any
    server_cached: Any
    arrival_slot: Any
    proc_s: Any
    comm_s: Any
    queue_s: Any
    offloads: Any
    outages: Any
    steps: Any
    fallbacks: Any
    t: Any
    arrived: Any
    finished: Any
    blocked: Any
    job: Any = None
    prm_cached: Any = None
    cache_used: Any = None

    @property
    def active(self):
        return self.phase != EMPTY


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


@struct.dataclass
class LLMPath:
    """What the LLM alone generates from each node to the end of the solution, following the
    LLM's branch (candidate 1) and the fallback where a child is missing ([N] each): ``tokens``
    (all the steps' tokens), ``steps``, ``correct`` (bool), ``fallbacks`` (missing children
    taken), ``last_tokens`` (the final step's tokens)."""

    tokens: Any
    steps: Any
    correct: Any
    fallbacks: Any
    last_tokens: Any


def llm_path(traces: TraceSet) -> LLMPath:
    """``LLMPath`` of a trace set (host-side NumPy, vectorised over nodes). Raises
    ``ValueError`` if the LLM's branch from some node never ends (a cycle)."""
    child = np.asarray(traces.child)
    term = np.asarray(traces.terminal).astype(bool)
    corr = np.asarray(traces.correct).astype(bool)
    tok = np.asarray(traces.cand_tokens).astype(np.int64)
    fb = np.asarray(traces.fallback)
    n = child.shape[0]
    cur = np.arange(n)
    alive = np.ones(n, bool)
    tokens = np.zeros(n, np.int64)
    steps = np.zeros(n, np.int64)
    fbs = np.zeros(n, np.int64)
    correct = np.zeros(n, bool)
    last = np.zeros(n, np.int64)
    for _ in range(n + 1):
        if not alive.any():
            break
        t1 = term[cur, 1]
        tokens += np.where(alive, tok[cur, 1], 0)
        steps += alive
        ended = alive & t1
        correct = np.where(ended, corr[cur, 1], correct)
        last = np.where(ended, tok[cur, 1], last)
        ch = child[cur, 1]
        nxt = np.where(ch >= 0, ch, fb[cur])
        fbs += alive & ~t1 & (ch < 0)
        alive = alive & ~t1
        cur = np.where(alive, nxt, cur)
    if alive.any():
        raise ValueError("traces: the LLM's branch from some node never reaches a terminal step")
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return LLMPath(tokens=i32(tokens), steps=i32(steps), correct=jnp.asarray(correct),
                   fallbacks=i32(fbs), last_tokens=i32(last))


@struct.dataclass
class EdgeAction:
    """Screening actions with the quality gain each nomination carries.

    Attributes:
      screen: [U] int32, 0 keep the draft, 1 nominate for the server.
      gain: [U] float32, ΔQ = Q(s,1) − Q(s,0) of the edge critic, PRM units.
    """

    screen: Any
    gain: Any


@struct.dataclass
class Noise:
    """All randomness of one step (drawn by ``draw_noise``; the NumPy reference takes the same).

    ``u_arrival``: float32 uniform in [0, 1), mapped by ``step`` to the slot's Poisson arrival
    count at the scenario's rate of that slot; ``problem``: [U] int32 problem for a new user in slot u;
    ``fading``: [U] float32 Rayleigh power gains |h|²; ``u_sched``: [U] float32 uniforms.
    """

    u_arrival: Any
    problem: Any
    fading: Any
    u_sched: Any


class DiscreteSpec(NamedTuple):
    shape: tuple
    dtype: Any
    num_values: int


# ----------------------------------------------------------------------------- params

def _traces_to_jnp(traces: TraceSet) -> TraceSet:
    return jax.tree.map(jnp.asarray, traces)


def make_params(traces: TraceSet, *, num_users: int = 16, scheduler="threshold",
                lambda_s: float = 0.0, mu: float = 0.0, beta: float = 0.2,
                tau_s: float = 0.05, num_servers: int | None = None,
                bandwidth_hz: float = 20e6,
                arrival_rate_hz: float = 4.0, initial_users: int | None = None,
                default_gain: float = 0.05, max_wait_slots: int = 20,
                rsd_threshold: float = 0.7, reward_mode: str = "coarse",
                policy_reward_mode: str = "coarse",
                server_kv_cache: bool | None = None, downlink: bool = True,
                ctx_scale: float = 1e-3, feature_dim: int | None = None,
                scenario=None, llm_only: bool = False, hardware: str = lat.DEFAULT_PAIR,
                latency: lat.LatencyParams | None = None, server_model: str = "serving",
                max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                prm_prefix_cache: bool | None = None, kv_budget_tokens: float | None = None,
                **latency_overrides) -> EnvParams:
    """Builds validated env params from a trace set.

    Defaults are assumptions (the paper does not publish them): τ = 50 ms, M = 4 server jobs
    (``DEFAULT_MAX_NUM_SEQS`` = 256 concurrent sequences under the serving server),
    B = 20 MHz, λ = 4 users/s, β = 0.2 PRM units per second, ΔQ = 0.05 for plain-int actions,
    at most 20 slots (1 s) of queueing, ``initial_users`` = ``num_users``.

    Args:
      traces: a ``TraceSet`` (NumPy or jnp arrays).
      policy_reward_mode: the reward the screening policy was trained with (``coarse`` or
        ``true``; ``policy_meta.json``'s ``reward_mode``): what the threshold rule still adds
        to the ΔQ a nomination carries. Another value raises ``errors.BadInput``.
      feature_dim: if given, the feature dim the caller (e.g. a policy) expects; a trace set with
        a different one is refused.
      scenario: an ``envs.scenarios.Scenario`` schedule (default: static, length 1).
      llm_only: the server LLM alone, no edge draft (``EnvParams.llm_only``); pair it with the
        ``offload_all`` scheduler, every step nominated, ``server_kv_cache`` (the server keeps
        the context it generated) and a ``max_wait_slots`` no queue reaches.
      hardware: the (edge, server) hardware pair of the clock (``prada_jax.latency.PAIRS``
        name or a JSON file, ``latency.pair_profiles``): ``paper`` (default) is the FLOP-only
        clock with fixed-slot jobs; any other pair the roofline clock with a batching server
        (docs/latency.md). Ignored when ``latency`` is given (its own ``clock`` holds).
      latency: latency constants (default ``prada_jax.latency.pair_latency_params(hardware)``);
        extra keyword arguments override its fields by name (e.g. ``snr_threshold_db=-inf``).
      server_model: ``serving`` (default) or ``legacy`` (``SERVER_MODELS``); only a roofline
        pair reads it. ``legacy`` also drops the lm_head FLOPs and uses the 7B LLM's shape as
        the PRM, as the results before issue 41 did.
      max_batched_tokens: the serving server's per-iteration token budget; must exceed M.
      server_kv_cache, prm_prefix_cache: ``EnvParams.server_kv_cache`` / ``prm_prefix_cache``;
        None (default): on under the serving server (the engines' default prefix cache), off
        under the legacy server and the ``paper`` clock (their results before issue 51).
        ``server_kv_cache=False`` under the serving server is the named no-cache ablation
        (every offload re-prefills its whole context).
      kv_budget_tokens: the serving server's KV budget [LLM-KV tokens]; None: the server's
        memory less the LLM's and the PRM's weights (``envs.prefix_cache.kv_budget_tokens``).
        A smaller budget (tests, ablations) must still hold M sequences of the longest length.

    Raises:
      ValueError: naming the field that is out of range. ``errors.BadInput`` (a ValueError)
        for an unknown pair, a profile out of range, or an M beyond what the server
        profile's KV memory holds at the trace set's longest server sequence.
    """
    if int(num_users) < 1:
        raise ValueError(f"num_users (U) must be >= 1, got {num_users}")
    if server_model not in SERVER_MODELS:
        raise BadInput(f"server_model must be one of {SERVER_MODELS}, got {server_model!r}")
    if num_servers is None:
        num_servers = (DEFAULT_MAX_NUM_SEQS if server_model == "serving"
                       and hardware != lat.PAPER and latency is None else 4)
    checks = (("num_servers (M)", num_servers), ("bandwidth_hz (B)", bandwidth_hz),
              ("tau_s (τ)", tau_s))
    for name, v in checks:
        if not (float(v) > 0 and math.isfinite(float(v))):
            raise ValueError(f"{name} must be > 0, got {v}")
    if int(num_servers) != num_servers:
        raise ValueError(f"num_servers (M) must be an integer, got {num_servers}")
    for name, v in (("arrival_rate_hz (λ)", arrival_rate_hz), ("lambda_s", lambda_s),
                    ("mu", mu), ("beta", beta), ("max_wait_slots", max_wait_slots)):
        if not (float(v) >= 0 and math.isfinite(float(v))):
            raise ValueError(f"{name} must be >= 0, got {v}")
    if not 0.0 <= float(rsd_threshold) <= 1.0:
        raise ValueError(f"rsd_threshold must be in [0, 1], got {rsd_threshold}")
    if not math.isfinite(float(default_gain)):
        raise ValueError(f"default_gain must be finite, got {default_gain}")
    if not (float(ctx_scale) > 0 and math.isfinite(float(ctx_scale))):
        raise ValueError(f"ctx_scale must be > 0, got {ctx_scale}")
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
    if policy_reward_mode not in REWARD_MODES:
        raise BadInput(f"policy_reward_mode (the screening policy's training reward) must be "
                       f"one of {REWARD_MODES}, got {policy_reward_mode!r}")
    if initial_users is None:
        initial_users = num_users
    if not 0 <= int(initial_users) <= int(num_users):
        raise ValueError(f"initial_users must be in [0, num_users={num_users}], "
                         f"got {initial_users}")
    if not isinstance(traces, TraceSet):
        raise ValueError(f"traces must be a prada_jax.traces.format.TraceSet, got {type(traces)}")
    feat = np.asarray(traces.feat)
    if feat.ndim != 2:
        raise ValueError(f"traces.feat must be [N, F], got shape {feat.shape}")
    if feature_dim is not None and feat.shape[1] != int(feature_dim):
        raise ValueError(f"traces.feat has feature dim {feat.shape[1]} but feature_dim="
                         f"{feature_dim} was expected")
    if np.asarray(traces.root).shape[0] < 1:
        raise ValueError("traces.root: the trace set has no problems")
    sched = scheduler_index(scheduler)
    if latency is None:
        latency = lat.pair_latency_params(hardware, **latency_overrides)
    else:
        hardware = "(the given latency params)"
        if latency_overrides:
            latency = latency.replace(**latency_overrides)
    if latency.roofline and server_model == "legacy":
        no_head = lambda m: m.replace(head_flops=0.0)  # noqa: E731
        latency = latency.replace(slm=no_head(latency.slm), llm=no_head(latency.llm),
                                  prm=no_head(lat.qwen25_7b()))
    lat.validate_latency_params(latency, hardware=hardware)
    scn = scenarios.validate(scenarios.static() if scenario is None else scenario)
    path = llm_path(traces)
    serving_on = bool(latency.roofline) and server_model == "serving"
    server_kv_cache = serving_on if server_kv_cache is None else bool(server_kv_cache)
    prm_prefix_cache = serving_on if prm_prefix_cache is None else bool(prm_prefix_cache)
    budget = _kv_budget(latency, traces, num_servers, scn, server_model, path, serving_on,
                        kv_budget_tokens)
    if latency.roofline:
        # M sequences must fit the server's KV memory at the longest server sequence (the
        # context plus the LLM step; the LLM alone's whole solution under the serving server)
        # of the trace set, at the scenario's largest M_t.
        m_max = int(math.floor(float(num_servers) * float(np.max(np.asarray(scn.servers)))
                               + 0.5))
        check_num_servers(latency, traces, m_max, hardware,
                          server_model=server_model, path=path)
    if serving_on and not (int(max_batched_tokens) == max_batched_tokens
                           and int(max_batched_tokens) > int(num_servers)):
        raise BadInput(f"max_batched_tokens must be an integer > num_servers (M = "
                       f"{int(num_servers)}: every running sequence decodes one token per "
                       f"iteration, and a prefill needs room), got {max_batched_tokens}")
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return EnvParams(
        traces=_traces_to_jnp(traces), latency=jax.tree.map(f32, latency), scheduler=i32(sched),
        lambda_s=f32(lambda_s), mu=f32(mu), beta=f32(beta), tau_s=f32(tau_s),
        num_servers=i32(num_servers), bandwidth_hz=f32(bandwidth_hz),
        arrival_rate_hz=f32(arrival_rate_hz), initial_users=i32(initial_users),
        default_gain=f32(default_gain), max_wait_slots=i32(max_wait_slots),
        rsd_threshold=f32(rsd_threshold), true_reward=jnp.asarray(reward_mode == "true"),
        server_kv_cache=jnp.asarray(bool(server_kv_cache)), downlink=jnp.asarray(bool(downlink)),
        ctx_scale=f32(ctx_scale), scn_arrival=f32(scn.arrival), scn_bandwidth=f32(scn.bandwidth),
        scn_channel_db=f32(scn.channel_db), scn_servers=f32(scn.servers),
        num_users=int(num_users), policy_true_reward=jnp.asarray(policy_reward_mode == "true"),
        llm_only=jnp.asarray(bool(llm_only)), server_model=server_model,
        max_batched_tokens=i32(max_batched_tokens if serving_on else DEFAULT_MAX_BATCHED_TOKENS),
        prm_prefix_cache=jnp.asarray(bool(prm_prefix_cache)), llm_path=path,
        kv_budget_tokens=f32(budget), prm_kv_ratio=f32(prefix_cache.prm_kv_ratio(latency)))


def _kv_budget(latency, traces, num_servers, scn, server_model, path, serving_on,
               kv_budget_tokens) -> float:
    """The prefix cache's KV budget [LLM-KV tokens] (``make_params``): the server's memory by
    default, or ``kv_budget_tokens`` checked to hold M_max sequences of the longest length
    (``errors.BadInput`` naming the flag otherwise). inf outside the serving server."""
    if not serving_on:
        return math.inf
    if kv_budget_tokens is None:
        return prefix_cache.kv_budget_tokens(latency)
    b = float(kv_budget_tokens)
    m_max = int(math.floor(float(num_servers) * float(np.max(np.asarray(scn.servers))) + 0.5))
    need = m_max * _longest_sequence(traces, server_model, path)
    if not (b >= need and b <= prefix_cache.kv_budget_tokens(latency)):
        raise BadInput(f"kv_budget_tokens={kv_budget_tokens}: must hold M = {m_max} running "
                       f"sequences of the longest length ({need:.0f} tokens) and fit the "
                       f"server's KV memory ({prefix_cache.kv_budget_tokens(latency):.0f} "
                       "tokens)")
    return b


def _longest_sequence(traces: TraceSet, server_model: str = "legacy", path=None) -> float:
    """Tokens of the longest server sequence: context + LLM step; under the serving server
    also the LLM alone's resident sequence (root context + its whole solution)."""
    longest = float(np.max(np.asarray(traces.ctx_tokens) + np.asarray(traces.cand_tokens)[:, 1]))
    if server_model == "serving":
        path = llm_path(traces) if path is None else path
        root = np.asarray(traces.root)
        whole = np.asarray(traces.ctx_tokens)[root] + np.asarray(path.tokens)[root]
        longest = max(longest, float(np.max(whole)))
    return longest


def max_num_servers(latency: lat.LatencyParams, traces: TraceSet, server_model: str = "legacy",
                    path=None) -> int:
    """The largest M (concurrent server sequences) the server profile's KV memory holds at
    the trace set's longest server sequence (``_longest_sequence``); host-side. The serving
    server hosts the online PRM's weights beside the LLM's (the RSD row runs on it).
    Unbounded (a very large int) under ``paper``."""
    return lat.max_sequences(latency, _longest_sequence(traces, server_model, path),
                             with_prm=server_model == "serving")


def check_num_servers(latency: lat.LatencyParams, traces: TraceSet, num_servers: int,
                      hardware: str = "", server_model: str = "legacy", path=None) -> None:
    """Raises ``errors.BadInput`` if ``num_servers`` (M, e.g. a sweep's grid value set with
    ``params.replace``) exceeds ``max_num_servers``; ``make_params`` calls it."""
    cap = max_num_servers(latency, traces, server_model, path)
    if int(num_servers) > cap:
        longest = _longest_sequence(traces, server_model, path)
        raise BadInput(f"num_servers (M) = {int(num_servers)} concurrent sequences exceeds the "
                       f"{cap} the server's KV memory holds under hardware {hardware} "
                       f"(sequences up to {longest:.0f} tokens)")


def with_scenario(params: EnvParams, scenario) -> EnvParams:
    """Params running the schedule ``scenario`` (an ``envs.scenarios.Scenario``, validated;
    :class:`envs.scenarios.ScenarioError` names a bad field). Same length L as before: no
    recompilation of a jitted rollout."""
    scn = scenarios.validate(scenario)
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    return params.replace(scn_arrival=f32(scn.arrival), scn_bandwidth=f32(scn.bandwidth),
                          scn_channel_db=f32(scn.channel_db), scn_servers=f32(scn.servers))


def slot_conditions(params: EnvParams, t):
    """The scenario at slot ``t`` (index ``t mod L``): dict of scalars ``arrival_rate_hz``
    [users/s], ``bandwidth_hz`` B_t [Hz], ``num_servers`` M_t (int32, units available) and
    ``channel_gain`` (linear factor on the fading power |h|²)."""
    i = jnp.mod(jnp.asarray(t, jnp.int32), params.scn_arrival.shape[0])
    m = jnp.floor(params.num_servers.astype(jnp.float32) * params.scn_servers[i] + 0.5)
    return dict(arrival_rate_hz=params.arrival_rate_hz * params.scn_arrival[i],
                bandwidth_hz=params.bandwidth_hz * params.scn_bandwidth[i],
                num_servers=m.astype(jnp.int32),
                channel_gain=jnp.power(10.0, params.scn_channel_db[i] / 10.0))


def free_resources(state: EnvState, params: EnvParams):
    """``(free_units int32, free_bw_hz float32)`` at the start of slot ``state.t``: M_t and
    B_t minus what running jobs hold, floored at 0 (a job keeps its unit when M_t drops)."""
    c = slot_conditions(params, state.t)
    in_service = state.phase == SERVICE
    if params.serving:
        # Serving server: a sequence is held until its last token; the uplink is shared per
        # slot (the uploads in flight need their slot-average bandwidth).
        in_job = in_service | (state.phase == SCORE)
        held = serving.holds_sequence(state.job, in_job)
        free_units = c["num_servers"] - jnp.sum(held.astype(jnp.int32))
        free_bw = c["bandwidth_hz"] - jnp.sum(serving.uplink_demand_hz(state.job, in_job,
                                                                         params.tau_s))
        return jnp.maximum(free_units, 0), jnp.maximum(free_bw, 0.0)
    free_units = c["num_servers"] - jnp.sum(in_service.astype(jnp.int32))
    free_bw = c["bandwidth_hz"] - jnp.sum(jnp.where(in_service, state.svc_bw_hz, 0.0))
    return jnp.maximum(free_units, 0), jnp.maximum(free_bw, 0.0)


def replace_traces(params: EnvParams, traces: TraceSet) -> EnvParams:
    """Swaps in another trace set; its feature dim must match (node counts may differ, which
    retraces a jitted step once per distinct shape)."""
    if np.asarray(traces.feat).shape[1] != params.feature_dim:
        raise ValueError(f"traces.feat has feature dim {np.asarray(traces.feat).shape[1]}, the "
                         f"params were built for {params.feature_dim}")
    return params.replace(traces=_traces_to_jnp(traces), llm_path=llm_path(traces))


def sched_params(params: EnvParams) -> SchedParams:
    return SchedParams(lambda_s=params.lambda_s, mu=params.mu, beta=params.beta,
                       tau_s=params.tau_s, num_servers=params.num_servers,
                       max_wait_slots=params.max_wait_slots, rsd_threshold=params.rsd_threshold,
                       policy_true_reward=params.policy_true_reward)


# ----------------------------------------------------------------------------- specs

def observation_spec(params: EnvParams) -> jax.ShapeDtypeStruct:
    """obs [U, F + 2] float32: node features, step index (depth), context tokens · ctx_scale."""
    return jax.ShapeDtypeStruct((params.num_users, params.obs_dim), jnp.float32)


def action_spec(params: EnvParams) -> DiscreteSpec:
    """[U] int32 in {0 keep draft, 1 nominate} (or an ``EdgeAction`` carrying gains)."""
    return DiscreteSpec(shape=(params.num_users,), dtype=jnp.int32, num_values=2)


# ----------------------------------------------------------------------------- helpers

def poisson_from_uniform(u, rate, max_count: int = _MAX_ARRIVALS):
    """Poisson(``rate``) count from one uniform ``u`` in [0, 1) by inverse CDF over
    ``0..max_count`` (int32). Cheaper to compile and run than ``jax.random.poisson`` (no rejection
    loop). Counts above ``max_count`` are truncated to it; with the default 64 that has
    probability < 1e-40 at 2 arrivals per slot (far beyond any U ≤ 64 env's capacity anyway)."""
    k = jnp.arange(max_count + 1, dtype=jnp.float32)
    log_pmf = k * jnp.log(jnp.maximum(rate, 1e-30)) - rate - jax.lax.lgamma(k + 1.0)
    cdf = jnp.cumsum(jnp.exp(log_pmf))
    n = jnp.sum((cdf < u).astype(jnp.int32))
    return jnp.where(rate > 0, jnp.minimum(n, max_count), 0).astype(jnp.int32)


def poisson_inverse_cdf(key, rate, max_count: int = _MAX_ARRIVALS):
    """Poisson(``rate``) sample (int32 scalar) from ``key``; see ``poisson_from_uniform``."""
    return poisson_from_uniform(jax.random.uniform(key, (), jnp.float32), rate, max_count)


def draw_noise(key, params: EnvParams) -> Noise:
    """All randomness of one slot from one key: 3·U + 1 uniforms in a single draw: the arrival
    uniform (``step`` maps it to a count at the slot's rate), the problems of new users (uniform over the trace set),
    Rayleigh power gains (Exp(1) = −log(1 − u)) and the scheduler's uniforms."""
    u = params.num_users
    n_problems = params.traces.root.shape[0]
    x = jax.random.uniform(key, (3 * u + 1,), jnp.float32)
    problem = jnp.minimum((x[1:u + 1] * n_problems).astype(jnp.int32), n_problems - 1)
    return Noise(
        u_arrival=x[0],
        problem=problem,
        fading=-jnp.log1p(-x[u + 1:2 * u + 1]),
        u_sched=x[2 * u + 1:])


def _slots(delay_s, tau_s):
    """Whole slots a phase of ``delay_s`` occupies: ``max(1, ceil(delay/τ))``."""
    s = jnp.ceil(jnp.minimum(delay_s / tau_s, float(_MAX_PHASE_SLOTS)))
    return jnp.maximum(s, 1.0).astype(jnp.int32)


def phase_slots(delay_s, tau_s):
    """Whole slots [int32] a phase of ``delay_s`` seconds holds its resources in this env:
    ``max(1, ceil(delay/τ))``, capped at ``_MAX_PHASE_SLOTS`` (an infinite delay, e.g. an
    upload at zero rate, is the cap). What the stage-2 learner counts as a job's service time."""
    return _slots(delay_s, tau_s)


def _start_draft(params: EnvParams, node, edge_cached, rsd_on):
    """Draft delay (s), its slots, and the SLM cache after drafting, for a user at ``node``
    (``llm_only``: no draft, 0 s and 0 slots)."""
    tr = params.traces
    ctx = tr.ctx_tokens[node]
    dtok = tr.cand_tokens[node, 0]
    cached = jnp.minimum(edge_cached, ctx)
    delay = lat.draft_delay_s(params.latency, ctx - cached, cached, dtok)
    if not params.serving:   # the serving server runs the PRM as a server job (SCORE)
        delay = delay + jnp.where(rsd_on, lat.prm_delay_s(params.latency, ctx + dtok), 0.0)
    delay = jnp.where(params.llm_only, 0.0, delay)
    slots = jnp.where(params.llm_only, 0, _slots(delay, params.tau_s))
    return delay, slots, ctx + dtok


def _successor(tr: TraceSet, node, branch):
    """(next node, terminal, correct, used fallback) of taking candidate ``branch`` at ``node``."""
    child = tr.child[node, branch]
    term = tr.terminal[node, branch].astype(bool)
    used_fb = ~term & (child < 0)
    nxt = jnp.where(term, node, jnp.where(child >= 0, child, tr.fallback[node]))
    return nxt, term, tr.correct[node, branch].astype(bool), used_fb


def _begin_score(s: EnvState, params: EnvParams, mask, fading, t):
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


def _observe(state: EnvState, params: EnvParams):
    tr = params.traces
    n = state.node
    obs = jnp.concatenate([tr.feat[n].astype(jnp.float32),
                           tr.depth[n].astype(jnp.float32)[:, None],
                           (tr.ctx_tokens[n].astype(jnp.float32) * params.ctx_scale)[:, None]],
                          axis=-1)
    return jnp.where(state.active[:, None], obs, 0.0)


def _admit(state: EnvState, params: EnvParams, n_arrivals, problem, slot, draft=True):
    """Places up to ``n_arrivals`` new users into EMPTY slots (index order), starting at ``slot``.

    Returns ``(state, blocked, admit [U] bool)``. With ``draft=False`` the first draft's delay,
    slots and SLM cache are left for the caller to fill (``step`` computes every draft that
    starts in a slot in one pass).
    """
    free = state.phase == EMPTY
    rank = jnp.cumsum(free.astype(jnp.int32)) - 1
    admit = free & (rank < n_arrivals)
    n_admit = jnp.sum(admit.astype(jnp.int32))
    root = params.traces.root[problem]
    if draft:
        rsd_on = params.scheduler == RSD_INDEX
        d_s, d_slots, cache = _start_draft(params, root, jnp.zeros_like(root), rsd_on)
    else:
        d_s, d_slots, cache = state.draft_s, state.remaining, state.edge_cached
    zf = jnp.zeros_like(state.proc_s)
    zi = jnp.zeros_like(state.offloads)
    w = lambda new, old: jnp.where(admit, new, old)  # noqa: E731
    # llm_only: no draft, the user decides at once.
    first = jnp.where(d_slots <= 0, DECIDE, DRAFT) if draft else DRAFT
    state = state.replace(
        phase=w(first, state.phase), node=w(root, state.node), remaining=w(d_slots, state.remaining),
        wait=w(zi, state.wait), gain=w(zf, state.gain), draft_s=w(d_s, state.draft_s),
        svc_bw_hz=w(zf, state.svc_bw_hz), svc_comm_frac=w(zf, state.svc_comm_frac),
        edge_cached=w(cache, state.edge_cached), server_cached=w(zi, state.server_cached),
        arrival_slot=w(jnp.full_like(zi, slot), state.arrival_slot),
        proc_s=w(zf, state.proc_s), comm_s=w(zf, state.comm_s), queue_s=w(zf, state.queue_s),
        offloads=w(zi, state.offloads), outages=w(zi, state.outages), steps=w(zi, state.steps),
        fallbacks=w(zi, state.fallbacks),
        prm_cached=None if state.prm_cached is None else w(zi, state.prm_cached),
        cache_used=None if state.cache_used is None else w(zi, state.cache_used),
        arrived=state.arrived + n_arrivals, blocked=state.blocked + n_arrivals - n_admit)
    return state, n_arrivals - n_admit, admit


def _empty_state(u: int, roofline: bool = False, serving_on: bool = False) -> EnvState:
    zi = jnp.zeros((u,), jnp.int32)
    zf = jnp.zeros((u,), jnp.float32)
    s0 = jnp.asarray(0, jnp.int32)
    job = ServiceJob(up_s=zf, prefill_s=zf, dec_tok=zf, ctx=zf, down_s=zf) if roofline else None
    if serving_on:
        job = serving.empty_job(u)
    return EnvState(phase=zi, node=zi, remaining=zi, wait=zi, gain=zf, draft_s=zf, svc_bw_hz=zf,
                    svc_comm_frac=zf, edge_cached=zi, server_cached=zi, arrival_slot=zi,
                    proc_s=zf, comm_s=zf, queue_s=zf, offloads=zi, outages=zi, steps=zi,
                    fallbacks=zi, t=s0, arrived=s0, finished=s0, blocked=s0, job=job,
                    prm_cached=zi if serving_on else None,
                    cache_used=zi if serving_on else None)


# ----------------------------------------------------------------------------- reset / step

def reset(key, params: EnvParams):
    """Empty env plus ``initial_users`` users with random problems (their first slot is 0).

    Returns:
      obs [U, F+2] float32, state ``EnvState``.
    """
    noise = draw_noise(key, params)
    state, _, _ = _admit(_empty_state(params.num_users, params.latency.roofline,
                                      params.serving), params,
                         params.initial_users, noise.problem, jnp.asarray(0, jnp.int32))
    return _observe(state, params), state


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
    tr, lp = params.traces, params.latency
    n = state.node
    ctx = tr.ctx_tokens[n]
    llm_tok = tr.cand_tokens[n, 1]
    srv_cached = jnp.where(params.server_kv_cache, jnp.minimum(state.server_cached, ctx), 0)
    up_tokens = ctx - srv_cached
    up_bits = up_tokens.astype(jnp.float32) * lp.bits_per_token
    cond = slot_conditions(params, state.t)
    snr = lat.snr_linear(lp, jnp.maximum(fading * cond["channel_gain"], 1e-12))
    bw = lat.request_bandwidth_hz(lp, up_bits, snr, cond["bandwidth_hz"])
    t_up = lat.transfer_delay_s(up_bits, bw, snr)
    t_down = jnp.where(params.downlink, lat.transfer_delay_s(
        llm_tok.astype(jnp.float32) * lp.bits_per_token, bw, snr), 0.0)
    if params.serving:
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
    if lp.roofline:
        # Service time on a full server: M_t sequences share every decode step.
        full = jnp.maximum(cond["num_servers"], 1).astype(jnp.float32)
        t_pre = lat.server_prefill_s(lp, up_tokens, srv_cached)
        t_srv = lat.server_delay_s(lp, up_tokens, srv_cached, llm_tok, batch=full)
        extra = dict(prefill_s=t_pre)
    else:
        t_srv = lat.server_delay_s(lp, up_tokens, srv_cached, llm_tok)
        extra = {}
    return dict(snr=snr, outage=lat.in_outage(lp, snr), bandwidth_hz=bw, upload_s=t_up,
                server_s=t_srv, download_s=t_down, delay_s=t_up + t_srv + t_down,
                upload_tokens=up_tokens, prefill_tokens=up_tokens, cached_tokens=srv_cached,
                **extra)


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


def step(key, state: EnvState, action, params: EnvParams):
    """One slot. ``action``: [U] int32 screening actions or an ``EdgeAction``.

    Returns:
      obs [U, F+2], state, reward [U] float32, done [U] bool (a user's solution ended this
      slot), info dict (see ``step_with_noise``).
    """
    return step_with_noise(state, action, params, draw_noise(key, params))


def step_with_noise(state: EnvState, action, params: EnvParams, noise: Noise):
    """``step`` with its randomness given (the NumPy reference takes the same ``noise``).

    A slot runs four phases: the scheduler decides the candidates (``_decide``), decisions
    move users to their next phase and earn rewards (``_resolve``), the slot's time is charged
    by phase (``_charge_slot``), and at the end of the slot finished phases advance
    (``_end_of_slot``) before arrivals are placed and new drafts start (``_start_drafts``).

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
    t = state.t
    cs = candidate_set(state, action, params, noise)
    cond = slot_conditions(params, t)
    n_arrivals = poisson_from_uniform(noise.u_arrival, cond["arrival_rate_hz"] * params.tau_s)
    dec, out_hit = _decide(state, params, cs)
    s, reward, res = _resolve(state, params, cs, dec, out_hit)
    s, in_draft, in_svc, slot_use = _charge_slot(s, params)
    s, done, info_user, cont_svc, cache_in, score_done = _end_of_slot(s, params, res, in_draft,
                                                                      in_svc, t)
    s, blocked = _start_drafts(s, params, noise, n_arrivals, res.cont_local, cont_svc, cache_in,
                               t)
    zero = jnp.zeros((), jnp.float32)
    prm_load = zero
    admitted = cs.x.candidate & (dec == IMMEDIATE)
    hits = dict(prefix_hit_tokens=jnp.sum(jnp.where(admitted, cs.req["cached_tokens"], 0)
                                          ).astype(jnp.float32),
                prefix_ctx_tokens=jnp.sum(jnp.where(admitted, params.traces.ctx_tokens[state.node],
                                                    0)).astype(jnp.float32),
                evicted_tokens=zero, kv_in_use_tokens=zero, kv_pinned_tokens=zero)
    if params.serving:
        # RSD under the serving server: every finished draft is scored by the PRM on the
        # server (a SCORE job) before its decision.
        to_score = ((params.scheduler == RSD_INDEX) & (s.phase == DECIDE) & ~score_done
                    & ~params.llm_only)
        s, prm_load, prm_hit, prm_ctx = _begin_score(s, params, to_score, noise.fading, t)
        s, kv = _cache_end_of_slot(s, params, in_svc, t)
        hits = dict(hits, prefix_hit_tokens=hits["prefix_hit_tokens"] + prm_hit,
                    prefix_ctx_tokens=hits["prefix_ctx_tokens"] + prm_ctx, **kv)
    decision = jnp.where(cs.x.candidate | cs.deciding, dec, -1)
    decision = jnp.where(cs.deciding & ~cs.nominated, LOCAL, decision)
    # Offered server work (evals' load ρ): new nominations that asked for the server (queued,
    # admitted, or lost to an outage), each at the slots it would hold a unit.
    offered = cs.nominated & ((dec != LOCAL) | out_hit)
    if params.serving:
        offered_s = jnp.where(offered, cs.req["load_s"], 0.0)
    else:
        offered_s = jnp.where(offered, _slots(cs.req["delay_s"], params.tau_s), 0).astype(
            jnp.float32) * params.tau_s
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
    return _observe(s, params), s, reward.astype(jnp.float32), done, info


def _cut_prefixes_at_fallback(s: EnvState, params: EnvParams, moved, node):
    """Under the serving server's prefix cache, users that move through a trace fallback (``moved`` [U]; the branch they took was not
    expanded, so they continue from another node of their problem, ``node`` [U] being where
    they were) keep on the server only the prefix their new context surely shares: the
    problem's prompt (the root's context). The rest of the cached prefix belongs to a path
    they left; reusing ``min(cached, context)`` of it would serve tokens that are not there.
    The legacy and ``paper`` servers keep the rule of their results (no cut)."""
    if not params.serving:
        return s
    tr = params.traces
    prompt = tr.ctx_tokens[tr.root[tr.problem[node]]]
    cut = lambda c: jnp.where(moved, jnp.minimum(c, prompt), c)  # noqa: E731
    return s.replace(server_cached=cut(s.server_cached),
                     prm_cached=None if s.prm_cached is None else cut(s.prm_cached))


def _cache_end_of_slot(s: EnvState, params: EnvParams, in_svc, t):
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
    holds = serving.holds_sequence(s.job, in_job)
    llm_c, prm_c, stats = prefix_cache.evict_lru(llm_c, prm_c, holds, s.job.ctx, used,
                                                 params.kv_budget_tokens, params.prm_kv_ratio)
    return s.replace(server_cached=llm_c, prm_cached=prm_c, cache_used=used), stats


def _decide(state: EnvState, params: EnvParams, cs: CandidateSet):
    """The scheduler's decisions after the env's hard rules.

    Returns ``(dec [U] int32, out_hit [U] bool)``: LOCAL / QUEUE / IMMEDIATE per candidate
    (LOCAL elsewhere) and the immediates turned local by an outage.
    """
    x, req = cs.x, cs.req
    cand = x.candidate
    dec = jax.lax.switch(params.scheduler, SCHEDULERS, x, cs.free_units, cs.free_bw_hz,
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

    nxt0, term0, corr0, fb0 = _successor(tr, n, jnp.zeros_like(n))
    _, _, _, fb1 = _successor(tr, n, jnp.ones_like(n))
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
        remaining=jnp.where(cont_local, _MAX_PHASE_SLOTS,
                            jnp.where(res_imm, _slots(req["delay_s"], tau), state.remaining)),
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
    s = _cut_prefixes_at_fallback(s, params, cont_local & fb0, n)
    if params.serving:
        j = state.job
        w = lambda new, old: jnp.where(res_imm, new, old)  # noqa: E731
        s = s.replace(job=j.replace(
            up_s=w(req["upload_s"], j.up_s), up_hz=w(req["up_hz"], j.up_hz),
            pf_tok=w(req["prefill_tokens"].astype(jnp.float32), j.pf_tok),
            pf_flops=w(req["pf_flops"], j.pf_flops), dec_tok=w(req["dec_tok"], j.dec_tok),
            ctx=w(tr.ctx_tokens[n].astype(jnp.float32), j.ctx),
            down_s=w(req["download_s"], j.down_s), down_hz=w(req["down_hz"], j.down_hz),
            seq=w(True, j.seq), prm=w(False, j.prm), ticket=w(state.t, j.ticket)))
    elif params.latency.roofline:
        j = state.job
        w = lambda new, old: jnp.where(res_imm, new, old)  # noqa: E731
        s = s.replace(job=ServiceJob(
            up_s=w(req["upload_s"], j.up_s), prefill_s=w(req["prefill_s"], j.prefill_s),
            dec_tok=w(tr.cand_tokens[n, 1].astype(jnp.float32), j.dec_tok),
            ctx=w(tr.ctx_tokens[n].astype(jnp.float32), j.ctx),
            down_s=w(req["download_s"], j.down_s)))
    return s, reward, _Resolution(fin_local=fin_local, cont_local=cont_local, corr_local=corr0)


def _charge_slot(s: EnvState, params: EnvParams):
    """This slot's time, by the phase each user occupies.

    Returns ``(state, in_draft [U], in_svc [U], slot_use)``, ``slot_use`` the scalars
    ``server_in_use``, ``bandwidth_in_use_hz`` [Hz] and ``queue_len`` of the slot, and the
    serving server's ``server_batch``, ``prefill_tokens``, ``decode_tokens``,
    ``server_busy_s`` [s], ``uplink_demand`` and ``downlink_demand`` (demand / capacity of
    the link; 0 under the other servers). Under the serving server ``in_svc`` is every user
    with a server job (SERVICE or SCORE) and ``server_in_use`` counts held sequences. Under a
    roofline clock the running jobs progress by ``_serve_slot`` and ``remaining`` is 0 for a job
    whose work is done, 1 otherwise.
    """
    tau = params.tau_s
    in_draft = s.phase == DRAFT
    in_svc = s.phase == SERVICE
    in_q = s.phase == QUEUE_PHASE
    zero = jnp.zeros((), jnp.float32)
    server_stats = dict(server_batch=zero, prefill_tokens=zero, decode_tokens=zero,
                        server_busy_s=zero, uplink_demand=zero, downlink_demand=zero)
    if params.serving:
        in_job = in_svc | (s.phase == SCORE)
        b_t = slot_conditions(params, s.t)["bandwidth_hz"]
        up_hz = jnp.sum(serving.uplink_demand_hz(s.job, in_job, tau))
        slot_use = dict(
            server_in_use=jnp.sum(serving.holds_sequence(s.job, in_job).astype(jnp.int32)),
            bandwidth_in_use_hz=jnp.minimum(up_hz, b_t),
            queue_len=jnp.sum(in_q.astype(jnp.int32)))
        job, comm, left, st = serving.serve_slot(s.job, in_job, params.latency, tau, b_t,
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
    slot_use = dict(server_in_use=jnp.sum(in_svc.astype(jnp.int32)),
                    bandwidth_in_use_hz=jnp.sum(jnp.where(in_svc, s.svc_bw_hz, 0.0)),
                    queue_len=jnp.sum(in_q.astype(jnp.int32)), **server_stats)
    if params.latency.roofline:
        job, comm_svc, left = _serve_slot(s.job, in_svc, params)
        comm_part = jnp.where(in_svc, comm_svc, 0.0)
        remaining = jnp.where(in_svc, left.astype(jnp.int32),
                              s.remaining - in_draft.astype(jnp.int32))
        s = s.replace(job=job)
    else:
        comm_part = jnp.where(in_svc, tau * s.svc_comm_frac, 0.0)
        remaining = s.remaining - (in_draft | in_svc).astype(jnp.int32)
    s = s.replace(
        proc_s=s.proc_s + jnp.where(in_draft, tau, 0.0) + jnp.where(in_svc, tau, 0.0) - comm_part,
        comm_s=s.comm_s + comm_part,
        queue_s=s.queue_s + jnp.where(in_q, tau, 0.0),
        wait=s.wait + in_q.astype(jnp.int32),
        remaining=remaining)
    return s, in_draft, in_svc, slot_use


def _serve_slot(job: ServiceJob, in_svc, params: EnvParams):
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
    nxt1, term1, corr1, fb1 = _successor(tr, s.node, jnp.ones_like(s.node))
    if params.serving:
        # The LLM alone's resident sequence decoded the whole solution: it ends here.
        path = params.llm_path
        whole = params.llm_only
        term1 = term1 | whole
        corr1 = jnp.where(whole, path.correct[s.node], corr1)
        more = jnp.where(svc_done & whole, path.steps[s.node] - 1, 0)
        s = s.replace(steps=s.steps + more, offloads=s.offloads + more,
                      fallbacks=s.fallbacks + jnp.where(
                          svc_done & whole, path.fallbacks[s.node] - fb1.astype(jnp.int32), 0))
    fin_svc = svc_done & term1
    cont_svc = svc_done & ~term1
    # SLM cache before each new draft: kept draft → as after drafting; LLM step → the prefix.
    cache_in = jnp.where(cont_svc, tr.ctx_tokens[s.node], s.edge_cached)
    phase2 = jnp.where(draft_done | score_done, DECIDE, s.phase)
    phase2 = jnp.where(cont_svc, DRAFT, phase2)
    phase2 = jnp.where(fin_svc, EMPTY, phase2)
    s = _cut_prefixes_at_fallback(s, params, cont_svc & fb1, s.node)
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
    s, blocked, admit = _admit(s, params, n_arrivals, noise.problem, t + 1, draft=False)
    fresh = cont_svc | admit
    starts = cont_local | fresh
    d_s, d_slots, cache_out = _start_draft(params, s.node, jnp.where(admit, 0, cache_in), rsd_on)
    left_local = d_slots - 1  # a kept step's next draft already used this slot
    s = s.replace(
        phase=jnp.where((cont_local & (left_local <= 0)) | (fresh & (d_slots <= 0)), DECIDE,
                        s.phase),
        remaining=jnp.where(cont_local, left_local, jnp.where(fresh, d_slots, s.remaining)),
        draft_s=jnp.where(starts, d_s, s.draft_s),
        edge_cached=jnp.where(starts, cache_out, s.edge_cached))
    return s, blocked
