"""PRADA's Lagrangian threshold scheduler (DESIGN §6), hard and temperature-smoothed.

For candidate i with quality gain ΔQ_i (PRM units), delay if run now D_i (s) and bandwidth b_i
(Hz), and expected further wait q_i = queue_len / M slots (an assumption: one queue position
clears per server unit per slot):

* ``w_i  = ΔQ_i − β·D_i``                   net advantage of immediate over local;
* ``w̄_i  = ΔQ_i − β·(D_i + τ·(1 + q_i))``  net advantage of queueing over local;
* ``g_i  = w_i − λ_s − µ·b_i``              priced advantage of immediate.

Hard rule: immediate if ``g_i ≥ max(w̄_i, 0)``; else queue if ``w̄_i > 0``; else local. A request
that has waited ``max_wait_slots`` is kept local. Feasibility repair: the immediates are admitted
greedily by reduced gain ``g_i − max(w̄_i, 0)`` (largest first; ties — common, since with
``w̄_i > 0`` it equals ``β·τ·(1+q) − λ_s − µ·b_i`` — by larger ``g_i``, then user slot;
a request that does not fit is skipped);
a rejected one queues if ``w̄_i > 0`` and it has not expired, else stays local.

Smoothed rule (temperature T > 0): probabilities ``softmax([0, w̄_i, g_i] / T)`` of
(local, queue, immediate) — the hard rule is its T → 0 limit — and the expected per-slot demand
``Σ_i p_imm,i`` server units and ``Σ_i p_imm,i·b_i`` Hz, differentiable in (λ_s, µ).

Opt-in admission price (``queue_price=True``, static; off by default, DESIGN §6's rule above is
the default). The price is charged to queueing too — a queued request will use a unit and its
upload later — so the per-candidate Lagrangian choice is the argmax over
``{local: 0, queue: w̄_i − λ_s − µ·b_i, immediate: g_i}`` (ties to immediate, then queue), and
λ_s, µ become pure admission prices (local vs server). Because ``g_i − (w̄_i − λ_s − µ·b_i) =
β·τ·(1 + q_i) ≥ 0``, queue is never the unrepaired choice: a candidate asks to run iff
``g_i ≥ 0`` and is otherwise kept local. The feasibility repair is unchanged (same ranking by
``g_i − max(w̄_i, 0)``; a rejected request queues iff ``w̄_i > 0`` and it has not expired).
The smoothed form uses logits ``[0, w̄_i − λ_s − µ·b_i, g_i] / T`` and reports as demand what
the price controls: admissions ``Σ_i (p_queue,i + p_imm,i)`` units and
``Σ_i (p_queue,i + p_imm,i)·b_i`` Hz. The env runs this rule as scheduler
``"threshold_admission"`` (``prada_jax.sched.registry``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from prada_jax.sched.base import (IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams, expired,
                                  greedy_fill_ranked, priority_rank)


def advantages(x: SchedInputs, sp: SchedParams):
    """Returns ``(w, w_bar, g)``, each [C] float32 (PRM units); see the module docstring."""
    q = x.queue_len.astype(jnp.float32) / jnp.asarray(sp.num_servers, jnp.float32)
    gain = x.gain.astype(jnp.float32)
    w = gain - sp.beta * x.delay_s
    w_bar = gain - sp.beta * (x.delay_s + sp.tau_s * (1.0 + q))
    g = w - sp.lambda_s - sp.mu * x.bandwidth_hz
    return w, w_bar, g


def reduced_gain(x: SchedInputs, sp: SchedParams):
    """[C] ``g_i − max(w̄_i, 0)``, computed in closed form so equal requests tie exactly:
    ``β·τ·(1 + q_i) − λ_s − µ·b_i`` where ``w̄_i > 0``, else ``g_i``."""
    _, w_bar, g = advantages(x, sp)
    q = x.queue_len.astype(jnp.float32) / jnp.asarray(sp.num_servers, jnp.float32)
    return jnp.where(w_bar > 0, sp.beta * sp.tau_s * (1.0 + q) - sp.lambda_s
                     - sp.mu * x.bandwidth_hz, g)


def queue_value(x: SchedInputs, sp: SchedParams, queue_price: bool = False):
    """[C] Lagrangian value of queueing (PRM units): ``w̄_i``, or with ``queue_price``
    ``w̄_i − λ_s − µ·b_i`` (the admission price charged to a queued request too)."""
    _, w_bar, _ = advantages(x, sp)
    if not queue_price:
        return w_bar
    return w_bar - sp.lambda_s - sp.mu * x.bandwidth_hz


def threshold_decide(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams,
                     queue_price: bool = False):
    """Hard threshold rule with feasibility repair. Returns [C] int8 decisions.

    ``queue_price`` (static Python bool): charge λ_s + µ·b_i to queueing too (module
    docstring); the repair is the same either way.
    """
    _, w_bar, g = advantages(x, sp)
    live = x.candidate & ~expired(x, sp)
    if not queue_price:
        floor = jnp.maximum(w_bar, 0.0)
        want_imm = live & (g >= floor)
    else:
        qv = queue_value(x, sp, queue_price=True)
        want_imm = live & (g >= jnp.maximum(qv, 0.0))
    reduced = reduced_gain(x, sp)
    rank = priority_rank(jnp.where(want_imm, -reduced, jnp.inf), jnp.where(want_imm, -g, jnp.inf))
    admitted = greedy_fill_ranked(want_imm, rank, x.bandwidth_hz, free_units, free_bw_hz)
    if not queue_price:
        queue = live & ~admitted & (w_bar > 0)
    else:
        # Rejected by the repair: queue iff w̄ > 0 (repair unchanged); not asking to run:
        # the Lagrangian argmax (queue iff its priced value is > 0; never when β·τ > 0).
        queue = live & ~admitted & jnp.where(want_imm, w_bar > 0, qv > 0)
    return jnp.where(admitted, IMMEDIATE, jnp.where(queue, QUEUE, LOCAL)).astype(jnp.int8)


def threshold_admission_decide(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams):
    """``threshold_decide(..., queue_price=True)`` with the common scheduler signature (the
    registry's ``"threshold_admission"``). Returns [C] int8 decisions."""
    return threshold_decide(x, free_units, free_bw_hz, sp, queue_price=True)


def threshold_soft(x: SchedInputs, sp: SchedParams, temperature, queue_price: bool = False):
    """Smoothed decision probabilities and expected resource demand.

    Args:
      x: candidates of one slot ([C] fields).
      sp: multipliers and constants (``lambda_s``, ``mu`` may be traced for gradients).
      temperature: T > 0 in PRM units.
      queue_price: static bool; queue logit ``w̄ − λ_s − µ·b`` instead of ``w̄``.

    Returns:
      probs: [C, 3] float32, P(local, queue, immediate); rows of non-candidates are 0;
        an expired request has probability 1 of local.
      demand_units: float32 scalar, expected server units the price controls: Σ p_imm
        (default) or Σ (p_queue + p_imm) (``queue_price``: admissions).
      demand_bw_hz: float32 scalar, the same weighted by b (Hz).
    """
    _, _, g = advantages(x, sp)
    qv = queue_value(x, sp, queue_price)
    logits = jnp.stack([jnp.zeros_like(g), qv, g], axis=-1) / temperature
    probs = jax.nn.softmax(logits, axis=-1)
    local_only = jnp.array([1.0, 0.0, 0.0], jnp.float32)
    probs = jnp.where(expired(x, sp)[:, None], local_only, probs)
    probs = probs * x.candidate[:, None].astype(probs.dtype)
    charged = probs[:, IMMEDIATE]
    if queue_price:
        charged = charged + probs[:, QUEUE]
    demand_units = jnp.sum(charged)
    demand_bw = jnp.sum(charged * x.bandwidth_hz)
    return probs, demand_units, demand_bw


def threshold_rule(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams,
                   temperature: float = 0.0, queue_price: bool = False):
    """``temperature == 0`` (a Python number): hard decisions [C] int8 (``threshold_decide``);
    ``> 0``: the smoothed ``(probs [C,3], demand_units, demand_bw_hz)`` of ``threshold_soft``.
    ``queue_price``: the opt-in admission-price form of either (module docstring)."""
    if temperature == 0:
        return threshold_decide(x, free_units, free_bw_hz, sp, queue_price=queue_price)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return threshold_soft(x, sp, temperature, queue_price=queue_price)
