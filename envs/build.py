"""``make_params``: validated edge-env params from a trace set, built by small builders.

Defaults are assumptions (the paper does not publish them): τ = 50 ms, M = 4 server jobs
(``DEFAULT_MAX_NUM_SEQS`` = 256 concurrent sequences under the serving server), B = 20 MHz,
λ = 4 users/s, β = 0.2 PRM units per second, ΔQ = 0.05 for plain-int actions, at most 20 slots
(1 s) of queueing, ``initial_users`` = ``num_users``. The keywords are the fields of
``envs.params.EnvParams`` (units there), and:

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
  server_model: ``serving`` (default) or ``legacy`` (``envs.servers.registry.SERVER_MODELS``);
    only a roofline pair reads it. ``legacy`` also drops the lm_head FLOPs and uses the 7B
    LLM's shape as the PRM, as the results before issue 41 did.
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
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from envs import prefix_cache, scenarios, server_memory
from envs.llm_path import llm_path
from envs.params import (DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, REWARD_MODES,
                         EnvParams, _traces_to_jnp)
from envs.servers.registry import check_server_model
from prada_jax import latency as lat
from prada_jax.errors import BadInput
from prada_jax.sched.registry import scheduler_index
from prada_jax.traces.format import TraceSet


def _positive(name, v):
    if not (float(v) > 0 and math.isfinite(float(v))):
        raise ValueError(f"{name} must be > 0, got {v}")


def _non_negative(name, v):
    if not (float(v) >= 0 and math.isfinite(float(v))):
        raise ValueError(f"{name} must be >= 0, got {v}")


def default_num_servers(num_servers, server_model, hardware, latency) -> int:
    """M: ``num_servers``, or by default ``DEFAULT_MAX_NUM_SEQS`` sequences under the serving
    server of a named roofline pair and 4 jobs otherwise."""
    if num_servers is None:
        num_servers = (DEFAULT_MAX_NUM_SEQS if server_model == "serving"
                       and hardware != lat.PAPER and latency is None else 4)
    return num_servers


def check_cell(num_servers, bandwidth_hz, tau_s, arrival_rate_hz) -> None:
    """M, B and τ are finite and > 0 (M an integer); λ is finite and ≥ 0."""
    for name, v in (("num_servers (M)", num_servers), ("bandwidth_hz (B)", bandwidth_hz),
                    ("tau_s (τ)", tau_s)):
        _positive(name, v)
    if int(num_servers) != num_servers:
        raise ValueError(f"num_servers (M) must be an integer, got {num_servers}")
    _non_negative("arrival_rate_hz (λ)", arrival_rate_hz)


def check_scheduler_knobs(lambda_s, mu, beta, max_wait_slots, rsd_threshold, default_gain,
                          ctx_scale, reward_mode, policy_reward_mode) -> None:
    """The multipliers, β and the wait limit are finite and ≥ 0, the RSD threshold in [0, 1],
    ΔQ finite, the observation scale > 0, the reward modes known (``REWARD_MODES``)."""
    for name, v in (("lambda_s", lambda_s), ("mu", mu), ("beta", beta),
                    ("max_wait_slots", max_wait_slots)):
        _non_negative(name, v)
    if not 0.0 <= float(rsd_threshold) <= 1.0:
        raise ValueError(f"rsd_threshold must be in [0, 1], got {rsd_threshold}")
    if not math.isfinite(float(default_gain)):
        raise ValueError(f"default_gain must be finite, got {default_gain}")
    _positive("ctx_scale", ctx_scale)
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
    if policy_reward_mode not in REWARD_MODES:
        raise BadInput(f"policy_reward_mode (the screening policy's training reward) must be "
                       f"one of {REWARD_MODES}, got {policy_reward_mode!r}")


def check_users(num_users, initial_users) -> int:
    """``initial_users`` (default ``num_users``), checked to be in [0, U]."""
    if initial_users is None:
        initial_users = num_users
    if not 0 <= int(initial_users) <= int(num_users):
        raise ValueError(f"initial_users must be in [0, num_users={num_users}], "
                         f"got {initial_users}")
    return initial_users


def check_traces(traces, feature_dim) -> None:
    """A ``TraceSet`` with [N, F] features (F = ``feature_dim`` if given) and ≥ 1 problem."""
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


def build_latency(hardware, latency, server_model, overrides):
    """``(latency, hardware)``: the pair's latency params (or ``latency`` with ``overrides``),
    under the legacy server without lm_head FLOPs and with the 7B LLM's shape as the PRM;
    validated (``errors.BadInput`` naming the field)."""
    if latency is None:
        latency = lat.pair_latency_params(hardware, **overrides)
    else:
        hardware = "(the given latency params)"
        if overrides:
            latency = latency.replace(**overrides)
    if latency.roofline and server_model == "legacy":
        no_head = lambda m: m.replace(head_flops=0.0)  # noqa: E731
        latency = latency.replace(slm=no_head(latency.slm), llm=no_head(latency.llm),
                                  prm=no_head(lat.qwen25_7b()))
    lat.validate_latency_params(latency, hardware=hardware)
    return latency, hardware


def check_server_fit(latency, traces, num_servers, scn, hardware, server_model, path,
                     serving_on, max_batched_tokens) -> None:
    """Under a roofline pair, M sequences must fit the server's KV memory at the longest
    server sequence (the context plus the LLM step; the LLM alone's whole solution under the
    serving server) of the trace set, at the scenario's largest M_t; the serving server's
    token budget must exceed M (``errors.BadInput`` otherwise)."""
    if latency.roofline:
        m_max = int(math.floor(float(num_servers) * float(np.max(np.asarray(scn.servers)))
                               + 0.5))
        server_memory.check_num_servers(latency, traces, m_max, hardware,
                                        server_model=server_model, path=path)
    if serving_on and not (int(max_batched_tokens) == max_batched_tokens
                           and int(max_batched_tokens) > int(num_servers)):
        raise BadInput(f"max_batched_tokens must be an integer > num_servers (M = "
                       f"{int(num_servers)}: every running sequence decodes one token per "
                       f"iteration, and a prefill needs room), got {max_batched_tokens}")


def pack(traces, latency, scn, path, budget, *, num_users, sched, lambda_s, mu, beta, tau_s,
         num_servers, bandwidth_hz, arrival_rate_hz, initial_users, default_gain,
         max_wait_slots, rsd_threshold, reward_mode, policy_reward_mode, server_kv_cache,
         downlink, ctx_scale, llm_only, server_model, max_batched_tokens, prm_prefix_cache,
         serving_on) -> EnvParams:
    """The checked values as ``EnvParams`` leaves (float32 / int32 / bool arrays)."""
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
    """Builds validated env params from a trace set (defaults and arguments in the module
    docstring of ``envs.build``).

    Raises:
      ValueError: naming the field that is out of range. ``errors.BadInput`` (a ValueError)
        for an unknown pair or server model, a profile out of range, or an M beyond what the
        server profile's KV memory holds at the trace set's longest server sequence.
    """
    if int(num_users) < 1:
        raise ValueError(f"num_users (U) must be >= 1, got {num_users}")
    check_server_model(server_model)
    num_servers = default_num_servers(num_servers, server_model, hardware, latency)
    check_cell(num_servers, bandwidth_hz, tau_s, arrival_rate_hz)
    check_scheduler_knobs(lambda_s, mu, beta, max_wait_slots, rsd_threshold, default_gain,
                          ctx_scale, reward_mode, policy_reward_mode)
    initial_users = check_users(num_users, initial_users)
    check_traces(traces, feature_dim)
    sched = scheduler_index(scheduler)
    latency, hardware = build_latency(hardware, latency, server_model, latency_overrides)
    scn = scenarios.validate(scenarios.static() if scenario is None else scenario)
    path = llm_path(traces)
    serving_on = bool(latency.roofline) and server_model == "serving"
    server_kv_cache = serving_on if server_kv_cache is None else bool(server_kv_cache)
    prm_prefix_cache = serving_on if prm_prefix_cache is None else bool(prm_prefix_cache)
    budget = server_memory.kv_budget(latency, traces, num_servers, scn, server_model, path,
                                     serving_on, kv_budget_tokens)
    check_server_fit(latency, traces, num_servers, scn, hardware, server_model, path,
                     serving_on, max_batched_tokens)
    return pack(traces, latency, scn, path, budget, num_users=num_users, sched=sched,
                lambda_s=lambda_s, mu=mu, beta=beta, tau_s=tau_s, num_servers=num_servers,
                bandwidth_hz=bandwidth_hz, arrival_rate_hz=arrival_rate_hz,
                initial_users=initial_users, default_gain=default_gain,
                max_wait_slots=max_wait_slots, rsd_threshold=rsd_threshold,
                reward_mode=reward_mode, policy_reward_mode=policy_reward_mode,
                server_kv_cache=server_kv_cache, downlink=downlink, ctx_scale=ctx_scale,
                llm_only=llm_only, server_model=server_model,
                max_batched_tokens=max_batched_tokens, prm_prefix_cache=prm_prefix_cache,
                serving_on=serving_on)
