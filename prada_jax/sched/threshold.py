"""PRADA's Lagrangian threshold rule (docs/design.md §6): one implementation, hard and smoothed.

Value accounting (each cost charged once). A nomination carries ``ΔQ_i = Q(s,1) − Q(s,0)`` of
the edge critic under the policy's *training* reward (``SchedParams.policy_true_reward``):

* ``coarse`` (stage-1 default): that reward already charged ``β·`` the server's compute delay,
  so the rule adds only communication (upload + download from the user's channel now,
  ``SchedInputs.comm_s``): ``w_i = ΔQ_i − β·C_i``;
* ``true``: that reward also charged communication and the waiting the policy saw in
  training, so the rule adds nothing to running now: ``w_i = ΔQ_i``.

Either way queueing costs the *extra* wait of at least one slot plus the expected further wait
``q_i = queue_len / M_t`` slots (M_t the server units available this slot, at least 1; an
assumption: one queue position clears per server unit per slot): ``c = β·τ·(1 + q) ≥ 0`` and
``w̄_i = w_i − c``. All in PRM units.

Admission prices. λ_s (per admission to the server) and µ (per Hz of its bandwidth) are
charged to every request that will use the server, whether it runs now or waits:
``p_i = λ_s + µ·b_i``, ``g_i = w_i − p_i``. The per-candidate Lagrangian values of
(local, queue, immediate) are ``(0, g_i − c, g_i)`` (:func:`choice_values`). Because ``c ≥ 0``
the unrepaired choice is immediate iff ``g_i ≥ 0`` and local otherwise (queue never wins
before the repair). Everything below works from ``(g, c)``, with ``c`` one number per slot,
so equal requests tie exactly: no float32 rounding of separately computed ``w̄`` and ``g``
decides between equal candidates.

Hard rule (:func:`threshold_decide`): requests with ``g_i ≥ 0`` (not expired) ask to run now;
the feasibility repair admits them greedily by the value lost if rejected,
``g_i − max(g_i − c, 0)`` (= ``c`` where queueing is still worth it, else ``g_i``; largest
first, ties by larger ``g_i``, then user slot; a request that does not fit is skipped); a
rejected request queues iff ``g_i − c > 0`` and it has not expired, else stays local. The
repair's rank is one stable sort for large slots and C² comparisons for small ones
(:func:`repair_rank`; the same ranks either way).

Smoothed rule (temperature T > 0, :func:`soft_choice`): ``softmax((0, g − c, g) / T)``; the hard
rule's unrepaired choice is its T → 0 limit. :func:`threshold_soft` adds the expected
admissions ``Σ (p_queue + p_imm)`` and their bandwidth, differentiable in (λ_s, µ).
The multiplier learner (``prada_jax.dual``) uses :func:`choice_values`, :func:`hard_choice`
and :func:`soft_choice` on arrays, so the rule exists once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from prada_jax.sched.base import SORT_ABOVE  # noqa: F401  (re-exported: the rank switch)
from prada_jax.sched.base import (IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams, auto_rank,
                                  expired, greedy_fill_ranked)


def repair_rank(*keys):
    """[C] int32 rank ascending by ``keys`` (first most significant), ties by position:
    ``base.auto_rank`` (one stable sort if C > ``SORT_ABOVE``, else pairwise comparisons)."""
    return auto_rank(*keys)


def wait_cost(x: SchedInputs, sp: SchedParams):
    """``c = β·τ·(1 + queue_len / M_t)`` (PRM units), float32 scalar: extra cost of queueing.

    M_t is the server units available this slot (``x.num_servers_t``; the nominal
    ``sp.num_servers`` when the inputs do not carry it), floored at 1 so a slot with every unit
    taken still has a finite cost.
    """
    m = sp.num_servers if x.num_servers_t is None else jnp.maximum(x.num_servers_t, 1)
    q = x.queue_len.astype(jnp.float32) / jnp.asarray(m, jnp.float32)
    return (jnp.asarray(sp.beta, jnp.float32) * jnp.asarray(sp.tau_s, jnp.float32)
            * (1.0 + q))


def run_value(x: SchedInputs, sp: SchedParams):
    """``w_i`` [C] float32 (PRM units): ΔQ minus what the policy's training reward did not
    charge for running now (communication for ``coarse``, nothing for ``true``)."""
    gain = x.gain.astype(jnp.float32)
    if x.comm_s is None:
        return gain
    comm = jnp.asarray(sp.beta, jnp.float32) * x.comm_s.astype(jnp.float32)
    return jnp.where(jnp.asarray(sp.policy_true_reward, bool), gain, gain - comm)


def price(x: SchedInputs, sp: SchedParams):
    """Admission price ``p_i = λ_s + µ·b_i`` [C] float32 (PRM units)."""
    return sp.lambda_s + sp.mu * x.bandwidth_hz.astype(jnp.float32)


def advantages(x: SchedInputs, sp: SchedParams):
    """``(w, w̄, g)``, each [C] float32 (PRM units): run-now value, queue value (both before
    the price) and the priced run-now value ``g = w − λ_s − µ·b``."""
    w = run_value(x, sp)
    return w, w - wait_cost(x, sp), w - price(x, sp)


def choice_values(g, c):
    """Lagrangian values of (local, queue, immediate), ``[..., N, 3]`` = ``(0, g − c, g)``.

    g: [..., N] priced run-now value; c: wait cost, broadcastable to g (≥ 0).
    """
    g = jnp.asarray(g, jnp.float32)
    return jnp.stack([jnp.zeros_like(g), g - c, jnp.broadcast_to(g, (g - c).shape)], axis=-1)


def hard_choice(g, c, live=None):
    """Unrepaired Lagrangian argmax [..., N] int8: immediate iff ``g ≥ max(g − c, 0)`` (ties to
    immediate), else queue iff ``g − c > 0``, else local; non-``live`` candidates local."""
    qv = g - c
    d = jnp.where(g >= jnp.maximum(qv, 0.0), IMMEDIATE, jnp.where(qv > 0.0, QUEUE, LOCAL))
    if live is not None:
        d = jnp.where(live, d, LOCAL)
    return d.astype(jnp.int8)


def soft_choice(g, c, temperature, live=None):
    """``softmax((0, g − c, g) / T)`` [..., N, 3] of (local, queue, immediate); non-``live``
    candidates get probability 1 on local."""
    p = jax.nn.softmax(choice_values(g, c) / temperature, axis=-1)
    if live is not None:
        p = jnp.where(live[..., None], p, jnp.array([1.0, 0.0, 0.0], p.dtype))
    return p


def _priced(x: SchedInputs, sp: SchedParams):
    w, _, g = advantages(x, sp)
    return g, wait_cost(x, sp), x.candidate & ~expired(x, sp)


def admission_priority(x: SchedInputs, sp: SchedParams, rank_fn=repair_rank):
    """What the hard rule's repair works from (module docstring).

    Returns ``(want_imm, rank, live, queue_ok)``: [C] bool (asks to run now), [C] int32
    priority rank of the repair (0 first: value lost if rejected, descending; then ``g``
    descending; then user slot), [C] bool (candidate, not expired), [C] bool (``g − c > 0``).
    ``rank_fn``: :func:`repair_rank` (the rule: a sort for large C, pairwise for small),
    ``fill.sorted_rank`` (one stable sort, C log C) or ``base.priority_rank`` (C² pairwise
    comparisons); all three give the same ranks.
    """
    g, c, live = _priced(x, sp)
    want_imm = hard_choice(g, c, live) == IMMEDIATE
    queue_ok = (g - c) > 0
    lost = jnp.where(queue_ok, c, g)  # g − max(g − c, 0), with c exact: equal requests tie
    rank = rank_fn(jnp.where(want_imm, -lost, jnp.inf), jnp.where(want_imm, -g, jnp.inf))
    return want_imm, rank, live, queue_ok


def threshold_decide(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams,
                     rank_fn=repair_rank):
    """Hard threshold rule with feasibility repair (module docstring). Returns [C] int8.

    ``rank_fn``: see :func:`admission_priority` (the default is the rule)."""
    want_imm, rank, live, queue_ok = admission_priority(x, sp, rank_fn)
    admitted = greedy_fill_ranked(want_imm, rank, x.bandwidth_hz, free_units, free_bw_hz)
    queue = live & ~admitted & queue_ok
    return jnp.where(admitted, IMMEDIATE, jnp.where(queue, QUEUE, LOCAL)).astype(jnp.int8)



def threshold_fifo_decide(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams):
    """Ablation: the threshold rule's value filter alone. The same requests ask to run now
    (``g_i ≥ 0``, not expired) and a rejected one queues iff ``g_i − c > 0``, but the repair
    admits them first come first served (longest waiting first, ties by user slot) instead of
    by value lost. Between FIFO-greedy (no filter) and the rule, it separates what the filter
    buys from what the value order buys. Returns [C] int8."""
    want_imm, _, live, queue_ok = admission_priority(x, sp)
    rank = auto_rank(jnp.where(want_imm, -x.wait_slots.astype(jnp.float32), jnp.inf))
    admitted = greedy_fill_ranked(want_imm, rank, x.bandwidth_hz, free_units, free_bw_hz)
    queue = live & ~admitted & queue_ok
    return jnp.where(admitted, IMMEDIATE, jnp.where(queue, QUEUE, LOCAL)).astype(jnp.int8)


def threshold_soft(x: SchedInputs, sp: SchedParams, temperature):
    """Smoothed decision probabilities and expected admissions.

    Args:
      x: candidates of one slot ([C] fields).
      sp: multipliers and constants (``lambda_s``, ``mu`` may be traced for gradients).
      temperature: T > 0 in PRM units.

    Returns:
      probs: [C, 3] float32, P(local, queue, immediate); rows of non-candidates are 0;
        an expired request has probability 1 of local.
      demand_units: float32 scalar, expected admissions Σ (p_queue + p_imm) (server units).
      demand_bw_hz: float32 scalar, the same weighted by b (Hz).
    """
    g, c, live = _priced(x, sp)
    probs = soft_choice(g, c, temperature, ~expired(x, sp))
    probs = probs * x.candidate[:, None].astype(probs.dtype)
    charged = probs[:, IMMEDIATE] + probs[:, QUEUE]
    del live
    return probs, jnp.sum(charged), jnp.sum(charged * x.bandwidth_hz)


def threshold_rule(x: SchedInputs, free_units, free_bw_hz, sp: SchedParams,
                   temperature: float = 0.0):
    """``temperature == 0`` (a Python number): hard decisions [C] int8 (``threshold_decide``);
    ``> 0``: the smoothed ``(probs [C,3], demand_units, demand_bw_hz)`` of ``threshold_soft``."""
    if temperature == 0:
        return threshold_decide(x, free_units, free_bw_hz, sp)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return threshold_soft(x, sp, temperature)
