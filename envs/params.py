"""The edge env's parameters (``EnvParams``) and what reads them each slot: the scenario of a
slot (``slot_conditions``), the scheduler's constants (``sched_params``), the slots a phase
holds (``phase_slots``). ``envs.build.make_params`` builds and validates them.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import scenarios
from envs.llm_path import llm_path
from prada_jax import latency as lat
from prada_jax.sched.base import SchedParams
from prada_jax.traces.format import TraceSet

REWARD_MODES = ("coarse", "true")
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
MAX_PHASE_SLOTS = 1_000_000  # caps ceil(delay/τ) so a near-zero-rate upload stays an int32


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
      server_model: ``serving`` or ``legacy`` (``envs.servers.registry.SERVER_MODELS``;
        static; read only under a roofline pair; ``envs.servers.registry.server_of`` picks
        the model).
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



def _traces_to_jnp(traces: TraceSet) -> TraceSet:
    return jax.tree.map(jnp.asarray, traces)


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


def _slots(delay_s, tau_s):
    """Whole slots a phase of ``delay_s`` occupies: ``max(1, ceil(delay/τ))``."""
    s = jnp.ceil(jnp.minimum(delay_s / tau_s, float(MAX_PHASE_SLOTS)))
    return jnp.maximum(s, 1.0).astype(jnp.int32)


def phase_slots(delay_s, tau_s):
    """Whole slots [int32] a phase of ``delay_s`` seconds holds its resources in this env:
    ``max(1, ceil(delay/τ))``, capped at ``MAX_PHASE_SLOTS`` (an infinite delay, e.g. an
    upload at zero rate, is the cap). What the stage-2 learner counts as a job's service time."""
    return _slots(delay_s, tau_s)

