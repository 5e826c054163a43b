"""The edge env's state and per-slot inputs: user phases, ``EnvState``, ``EdgeAction``, ``Noise``.

Every module of ``envs/`` reads these; ``envs.edge`` re-exports them with the env's
functions.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from flax import struct

#: Phases of a user slot (``EnvState.phase``); SCORE (the online PRM's scoring job) only
#: under the serving server.
EMPTY, DRAFT, DECIDE, QUEUE_PHASE, SERVICE, SCORE = 0, 1, 2, 3, 4, 5


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
    count at the scenario's rate of that slot; ``problem``: [U] int32 problem for a new user in
    slot u; ``fading``: [U] float32 Rayleigh power gains |h|²; ``u_sched``: [U] float32 uniforms.
    """

    u_arrival: Any
    problem: Any
    fading: Any
    u_sched: Any


class DiscreteSpec(NamedTuple):
    shape: tuple
    dtype: Any
    num_values: int


def empty_state(u: int, server) -> EnvState:
    """``u`` empty user slots, the job arrays and prefix-cache arrays that ``server`` (an
    ``envs.servers.base.Server``) keeps."""
    zi = jnp.zeros((u,), jnp.int32)
    zf = jnp.zeros((u,), jnp.float32)
    s0 = jnp.asarray(0, jnp.int32)
    return EnvState(phase=zi, node=zi, remaining=zi, wait=zi, gain=zf, draft_s=zf, svc_bw_hz=zf,
                    svc_comm_frac=zf, edge_cached=zi, server_cached=zi, arrival_slot=zi,
                    proc_s=zf, comm_s=zf, queue_s=zf, offloads=zi, outages=zi, steps=zi,
                    fallbacks=zi, t=s0, arrived=s0, finished=s0, blocked=s0,
                    job=server.empty_job(u),
                    prm_cached=zi if server.tracks_prefixes else None,
                    cache_used=zi if server.tracks_prefixes else None)
