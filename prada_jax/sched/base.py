"""Shared types of the stage-2 schedulers: per-candidate inputs, multipliers, decision codes.

Every scheduler is a pure function with one signature::

    decide(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams) -> decision [C] int8

over ``C`` candidate slots (the env passes one per user slot, with a ``candidate`` mask), where
``decision`` is ``LOCAL`` (0, keep the draft), ``QUEUE`` (1, wait for a later slot) or
``IMMEDIATE`` (2, upload, run on the LLM, download). Non-candidates get ``LOCAL`` (ignored).
Every scheduler here returns decisions that respect ``free_units`` and ``free_bw_hz``; the env
enforces the hard limits again whatever a scheduler returns.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

LOCAL, QUEUE, IMMEDIATE = 0, 1, 2


@struct.dataclass
class SchedInputs:
    """Per-candidate scalars a nomination carries to the server (all ``[C]``).

    Attributes:
      candidate: bool, this slot holds a request to decide (new nomination or queued).
      gain: float32, quality gain ΔQ the nomination carries (PRM units; the edge critic's
        Q(s,1) − Q(s,0)).
      delay_s: float32, D_i = upload + server compute + download delay if run now (s).
      bandwidth_hz: float32, b_i, bandwidth the request needs while it runs (Hz).
      wait_slots: int32, slots this request has already waited in the queue.
      ctx_tokens: int32, context tokens the request would upload.
      snr: float32, this slot's linear uplink SNR of the user.
      draft_prm: float32, PRM score of the prefix + the SLM draft (only the RSD rule reads it).
      u_rand: float32 in [0, 1), per-candidate uniform noise (only the random rule reads it).
      queue_len: int32 scalar, requests waiting in the queue at the start of the slot.
    """

    candidate: Any
    gain: Any
    delay_s: Any
    bandwidth_hz: Any
    wait_slots: Any
    ctx_tokens: Any
    snr: Any
    draft_prm: Any
    u_rand: Any
    queue_len: Any


@struct.dataclass
class SchedParams:
    """Scheduler constants and multipliers (array leaves: change or learn them without recompiling).

    Attributes:
      lambda_s: price of one server unit (PRM units), ≥ 0.
      mu: price of bandwidth (PRM units per Hz), ≥ 0.
      beta: quality–latency trade-off β (PRM units per second of delay).
      tau_s: slot length τ (s).
      num_servers: M, server units (for the expected queue wait q_i = queue_len / M).
      max_wait_slots: a request that has waited this many slots is kept local.
      rsd_threshold: RSD rule keeps the draft if its PRM score ≥ this (default 0.7).
    """

    lambda_s: Any = 0.0
    mu: Any = 0.0
    beta: Any = 0.2
    tau_s: Any = 0.05
    num_servers: Any = 4
    max_wait_slots: Any = 20
    rsd_threshold: Any = 0.7


def greedy_fill(want, order, bandwidth_hz, free_units, free_bw_hz):
    """Admits requests one by one in ``order`` while a server unit and the bandwidth remain.

    A request that does not fit is skipped (later, smaller ones may still fit).

    Args:
      want: [C] bool, requests asking to run now.
      order: [C] int32, a permutation of ``range(C)``: ``order[k]`` is the k-th in priority.
      bandwidth_hz: [C] float32, bandwidth each request needs.
      free_units: int32 scalar, server units free this slot.
      free_bw_hz: float32 scalar, bandwidth free this slot (Hz).

    Returns:
      [C] bool, admitted requests; their count ≤ ``free_units`` and bandwidth sum ≤ ``free_bw_hz``.
    """
    want_o = want[order]
    bw_o = bandwidth_hz[order].astype(jnp.float32)

    def _body(carry, xs):
        units, bw = carry
        w, b = xs
        ok = w & (units >= 1) & (b <= bw)
        return (units - ok.astype(units.dtype), jnp.where(ok, bw - b, bw)), ok

    init = (jnp.asarray(free_units, jnp.int32), jnp.asarray(free_bw_hz, jnp.float32))
    _, ok_o = jax.lax.scan(_body, init, (want_o, bw_o))
    return jnp.zeros_like(want).at[order].set(ok_o)


def expired(x: SchedInputs, sp: SchedParams):
    """[C] bool: requests that have waited ``max_wait_slots`` and must be resolved locally."""
    return x.wait_slots >= sp.max_wait_slots
