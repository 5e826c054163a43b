"""The edge env's server models by name, the one place a model is chosen.

``SERVER_MODELS`` are the models a roofline pair can run (``make_params(server_model=...)``,
static ``EnvParams.server_model``): ``serving`` the continuous-batching server with its prefix
cache (``envs.servers.serving``, the default since issue 41); ``legacy`` the batching server of
earlier results (``envs.servers.legacy``: a job holds its unit through its download, prefills
run in parallel, the LLM alone re-queues every step, lm_head FLOPs not counted). The ``paper``
clock has its own fixed-slot server (``envs.servers.paper``) whatever ``server_model`` says.
"""
from __future__ import annotations

from envs.servers import legacy, paper, serving
from envs.servers.base import Server
from prada_jax.errors import BadInput

SERVER_MODELS = ("serving", "legacy")
#: Every model by name: the two of ``SERVER_MODELS`` and the ``paper`` clock's.
SERVERS = {"serving": serving.SERVER, "legacy": legacy.SERVER, "paper": paper.SERVER}


def check_server_model(name) -> str:
    """``name`` if it is one of ``SERVER_MODELS``; raises ``errors.BadInput`` naming the field
    ``server_model`` otherwise."""
    if name not in SERVER_MODELS:
        raise BadInput(f"server_model must be one of {SERVER_MODELS}, got {name!r}")
    return name


def get(name) -> Server:
    """The ``Server`` of a model name (``SERVERS``); raises ``errors.BadInput`` naming the field
    ``server_model`` for an unknown one."""
    if name not in SERVERS:
        raise BadInput(f"server_model must be one of {tuple(SERVERS)}, got {name!r}")
    return SERVERS[name]


def server_of(params) -> Server:
    """The server an ``EnvParams`` runs (static): ``paper`` under the FLOP-only clock, else
    the pair's ``server_model``."""
    return get(params.server_model if params.latency.roofline else "paper")
