"""What fits in the server's memory (host-side, at ``make_params`` time): the longest server
sequence of a trace set, the largest M the server's KV memory holds at it, and the serving
server's KV budget of its prefix cache (``envs.prefix_cache``)."""
from __future__ import annotations

import math

import numpy as np

from envs import prefix_cache
from envs.llm_path import llm_path
from prada_jax import latency as lat
from prada_jax.errors import BadInput
from prada_jax.traces.format import TraceSet


def kv_budget(latency, traces, num_servers, scn, server_model, path, serving_on,
              kv_budget_tokens) -> float:
    """The prefix cache's KV budget [LLM-KV tokens] (``envs.build.make_params``): the server's
    memory by default, or ``kv_budget_tokens`` checked to hold M_max sequences of the longest
    length (``errors.BadInput`` naming the flag otherwise). inf outside the serving server."""
    if not serving_on:
        return math.inf
    if kv_budget_tokens is None:
        return prefix_cache.kv_budget_tokens(latency)
    b = float(kv_budget_tokens)
    m_max = int(math.floor(float(num_servers) * float(np.max(np.asarray(scn.servers))) + 0.5))
    need = m_max * longest_sequence(traces, server_model, path)
    if not (b >= need and b <= prefix_cache.kv_budget_tokens(latency)):
        raise BadInput(f"kv_budget_tokens={kv_budget_tokens}: must hold M = {m_max} running "
                       f"sequences of the longest length ({need:.0f} tokens) and fit the "
                       f"server's KV memory ({prefix_cache.kv_budget_tokens(latency):.0f} "
                       "tokens)")
    return b


def longest_sequence(traces: TraceSet, server_model: str = "legacy", path=None) -> float:
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
    the trace set's longest server sequence (``longest_sequence``); host-side. The serving
    server hosts the online PRM's weights beside the LLM's (the RSD row runs on it).
    Unbounded (a very large int) under ``paper``."""
    return lat.max_sequences(latency, longest_sequence(traces, server_model, path),
                             with_prm=server_model == "serving")


def check_num_servers(latency: lat.LatencyParams, traces: TraceSet, num_servers: int,
                      hardware: str = "", server_model: str = "legacy", path=None) -> None:
    """Raises ``errors.BadInput`` if ``num_servers`` (M, e.g. a sweep's grid value set with
    ``params.replace``) exceeds ``max_num_servers``; ``make_params`` calls it."""
    cap = max_num_servers(latency, traces, server_model, path)
    if int(num_servers) > cap:
        longest = longest_sequence(traces, server_model, path)
        raise BadInput(f"num_servers (M) = {int(num_servers)} concurrent sequences exceeds the "
                       f"{cap} the server's KV memory holds under hardware {hardware} "
                       f"(sequences up to {longest:.0f} tokens)")

