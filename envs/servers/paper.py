"""The ``paper`` clock's server (``make_params(hardware="paper")``, the default): a job is
priced by FLOPs (``prada_jax.latency.server_delay_s``) and holds one of the M units and its
bandwidth for ``max(1, ceil(D/τ))`` whole slots, D = upload + server compute + download; each
slot of it is split between communication and processing in proportion to (upload + download)
: server compute. The server keeps no job arrays and (with ``server_kv_cache``) an unbounded
cache of each user's context; the RSD baseline's PRM is charged to the draft at the edge."""
from __future__ import annotations

import jax.numpy as jnp

from envs.servers import base
from prada_jax import latency as lat


def _server_time(lp, cond, up_tokens, srv_cached, llm_tok):
    return lat.server_delay_s(lp, up_tokens, srv_cached, llm_tok), {}


def request(state, params, fading):
    """``Server.request``: the FLOP-priced job of ``base.slotted_request``."""
    return base.slotted_request(state, params, fading, _server_time)


def _count_down(s, in_draft, in_svc, params):
    comm_part = jnp.where(in_svc, params.tau_s * s.svc_comm_frac, 0.0)
    return s, comm_part, s.remaining - (in_draft | in_svc).astype(jnp.int32)


def serve(s, params):
    """``Server.serve``: every running job counts down one of its whole slots."""
    return base.slotted_serve(s, params, _count_down)


SERVER = base.Server(
    name="paper", tracks_prefixes=False, scores_on_server=False,
    empty_job=lambda u: None, free_resources=base.slotted_free_resources, request=request,
    start_jobs=base.keep_jobs, serve=serve, finish_jobs=base.plain_finish,
    cut_at_fallback=base.no_cut, end_slot=base.no_end_slot, offered_s=base.slotted_offered_s)
