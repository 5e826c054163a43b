"""The per-slot Lagrangian problem of the stage-2 threshold rule and the batch of slots it is posed on.

A candidate ``i`` of slot ``t`` has run-now value ``w_i``, queue value ``w̄_i`` (PRM units),
bandwidth ``b_i`` (Hz) and service time ``k_i`` (slots it holds a server unit and its
bandwidth). The threshold rule (``prada_jax.sched.threshold``) charges the price
``p_i = λ_s + µ·b_i`` to every admission (queue or run now), so the Lagrangian value of a
candidate is ``max(0, w̄_i − p_i, w_i − p_i)``. Each admission occupies ``k_i`` unit-slots
(its own service time: Little's law, the long-run busy units are the admissions per slot times
*their* service times), so the long-run occupancy constraints are

    mean_t Σ_{i new} admit_i·k_i ≤ ρ·mean_t M_t,    mean_t Σ_{i new} admit_i·b_i·k_i ≤ mean_t B_t

(:func:`excess_demand`: unit-slots and Hz-slots per slot). The rule's price is per admission,
so the dual function prices admissions against the capacity in admissions, ``ρ·M_t / k̄_u``
and ``B_t / k̄_b``, with ``k̄_u`` (``k̄_b``) the mean (bandwidth-weighted mean) service time of
the admissions at the current prices (:func:`service_time`, a constant: no gradient):

    D(λ_s, µ) = mean_t [ Σ_{i new} max(0, w̄_i − p_i, w_i − p_i) + ρ·λ_s·M_t / k̄_u + µ·B_t / k̄_b ]

Its slope in λ_s at those prices is ``−(mean_t Σ admit_i·k_i − ρ·mean_t M_t) / k̄_u``: minus
the occupancy excess in admissions, zero exactly where the admitted demand fills ρ·M (likewise
µ). An earlier version divided by the mean service time of *all* new nominations; the price
admits the valuable ones, whose service times differ (on the issue-23 budget scenario 8 %
longer), so that constraint was not the occupancy it names (docs/dual.md, "Occupancy counted
with each admission's own service time"). Only new nominations count (``SlotBatch.fresh``: a
queued request was admitted once, in the slot it was nominated). The constraint counts the
demand the rule admits before the env's repair: admissions that never run (an outage keeps
them local, the repair turns them local, a queued one expires) make the measured occupancy
lower, so it bounds the measured occupancy from above, and at ρ = 1 it still sees demand that
outruns the capacity (the measured occupancy never can). With ``k = 1``, ``fresh = valid`` and
the capacity equal to the slot's free units this is the per-slot admission dual.

A slot of the edge env becomes a :class:`SlotBatch` through ``envs.stage2.env_slot`` (the
env's candidate set, ``envs.edge.candidate_set``) and ``envs.stage2.slot_from_sched``.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from prada_jax.sched.base import LOCAL
from prada_jax.sched.threshold import choice_values as _choice_values
from prada_jax.sched.threshold import hard_choice, soft_choice

@struct.dataclass
class SlotBatch:
    """Candidate sets of S slots (any leading shape ``[...]`` works; N candidates per slot).

    w, w_bar: [..., N] float32, value of run now / queue over local before the price (PRM).
    b: [..., N] float32, bandwidth each candidate needs while it runs (Hz).
    valid: [..., N] bool, live candidates (new or queued, not expired): the slot problem.
    free_units: [...] float32, server units free this slot (the per-slot oracle's limit).
    free_bw: [...] float32, bandwidth free this slot (Hz).
    load: [..., K] float32, load features for the conditioned variant (zeros otherwise).
    work: [..., N] float32, service time k_i of each candidate (slots, ≥ 1).
    fresh: [..., N] bool, new nominations (the admissions the long-run constraints count).
    capacity_units: [...] float32, server units of the system this slot (M_t).
    capacity_bw: [...] float32, bandwidth of the system this slot (B_t, Hz).
    """

    w: jax.Array
    w_bar: jax.Array
    b: jax.Array
    valid: jax.Array
    free_units: jax.Array
    free_bw: jax.Array
    load: jax.Array
    work: jax.Array
    fresh: jax.Array
    capacity_units: jax.Array
    capacity_bw: jax.Array


def finite_candidates(w, w_bar, valid):
    """``(w, w̄, valid)`` with candidates of non-finite value dropped and every masked entry's
    values set to 0 ([..., N] each).

    A request with a zero upload rate this slot (log2(1 + SNR) = 0 in float32: a fading draw at
    the env's floor) has an infinite communication delay, so w = w̄ = −∞ (coarse accounting):
    it can never run (the env's rule keeps it local, worth max(0, −∞) = 0 at any price), so it
    is no candidate of the learner's problem. Left in, its wait cost w − w̄ = −∞ + ∞ was NaN,
    and even masked by ``jnp.where`` it made the dual's gradient NaN (0 · NaN): issue 33's
    diverged conditioned learner (docs/dual.md, "The conditioned learner's NaN").
    """
    w = jnp.asarray(w, jnp.float32)
    w_bar = jnp.asarray(w_bar, jnp.float32)
    valid = jnp.asarray(valid, bool) & jnp.isfinite(w) & jnp.isfinite(w_bar)
    return jnp.where(valid, w, 0.0), jnp.where(valid, w_bar, 0.0), valid


def make_batch(w, w_bar, b, valid, free_units, free_bw, load=None, load_features: int = 3,
               work=None, fresh=None, capacity_units=None, capacity_bw=None) -> SlotBatch:
    """SlotBatch from arrays (casts dtypes; candidates of non-finite value are dropped,
    :func:`finite_candidates`). Defaults: ``load`` zeros [..., load_features],
    ``work`` 1, ``fresh`` = ``valid``, capacities = the free units / bandwidth (with these
    defaults the long-run dual is the per-slot admission dual)."""
    w, w_bar, valid = finite_candidates(w, w_bar, valid)
    free_units = jnp.asarray(free_units, jnp.float32)
    free_bw = jnp.asarray(free_bw, jnp.float32)
    if load is None:
        load = jnp.zeros(w.shape[:-1] + (load_features,), jnp.float32)
    return SlotBatch(
        w=w, w_bar=w_bar, b=jnp.asarray(b, jnp.float32), valid=valid,
        free_units=free_units, free_bw=free_bw, load=jnp.asarray(load, jnp.float32),
        work=jnp.ones_like(w) if work is None else jnp.asarray(work, jnp.float32),
        fresh=valid if fresh is None else jnp.asarray(fresh, bool) & valid,
        capacity_units=free_units if capacity_units is None else jnp.asarray(
            capacity_units, jnp.float32),
        capacity_bw=free_bw if capacity_bw is None else jnp.asarray(capacity_bw, jnp.float32))


class Multipliers(NamedTuple):
    """λ_s (reward per admission) and µ (reward per Hz); scalars or [...] per slot."""

    lambda_s: jax.Array
    mu: jax.Array


def priced(w, w_bar, b, lambda_s, mu):
    """(g, c): priced run-now value ``w − λ_s − µ·b`` and wait cost ``w − w̄`` ([..., N])."""
    g = w - (jnp.asarray(lambda_s)[..., None] + jnp.asarray(mu)[..., None] * b)
    return g, w - w_bar


def choice_values(w, w_bar, b, lambda_s, mu) -> jax.Array:
    """Per-candidate Lagrangian value of (local, queue, immediate): [..., N, 3] =
    ``(0, w̄ − p, w − p)``, ``p = λ_s + µ·b`` (``sched.threshold.choice_values``).
    w, w_bar, b: [..., N]; lambda_s, mu: scalars or [...] (µ in the unit of 1/b)."""
    return _choice_values(*priced(w, w_bar, b, lambda_s, mu))


def hard_decision(w, w_bar, b, lambda_s, mu, valid=None) -> jax.Array:
    """The threshold rule before any feasibility repair (``sched.threshold.hard_choice``):
    [..., N] int8 in {0 local, 1 queue, 2 immediate}; invalid candidates are local."""
    g, c = priced(w, w_bar, b, lambda_s, mu)
    return hard_choice(g, c, valid)


def soft_decision(w, w_bar, b, lambda_s, mu, temp, valid=None) -> jax.Array:
    """Smoothed threshold rule [..., N, 3] (``sched.threshold.soft_choice``); invalid
    candidates get probability 1 on local."""
    g, c = priced(w, w_bar, b, lambda_s, mu)
    return soft_choice(g, c, temp, valid)


def admitted(batch: SlotBatch, mult: Multipliers) -> jax.Array:
    """[..., N] float32: 1 where a new nomination is admitted (queue or run now) by the hard
    rule before repair at ``mult`` (scalars or per slot [...]), else 0."""
    d = hard_decision(batch.w, batch.w_bar, batch.b, mult.lambda_s, mult.mu, batch.fresh)
    return (d != LOCAL).astype(jnp.float32)


def service_time(batch: SlotBatch, mult: Multipliers, weights=None) -> jax.Array:
    """[2] ``(k̄_u, k̄_b)``: mean service time (slots) of the admissions at ``mult``, plain
    (server units) and weighted by bandwidth (bandwidth), pooled over all slots of the batch
    with slot ``weights`` [...] (default 1), no gradient.

    Both are ≥ 1. Without any admission in the batch: the same means over every new
    nomination; without those either: 1. With them the dual's capacity terms ``ρ·M_t / k̄_u``
    and ``B_t / k̄_b`` make its slopes the occupancy excess of :func:`excess_demand` in
    admissions (module docstring).
    """
    wts = jnp.ones_like(batch.capacity_units) if weights is None else weights
    wts = wts[..., None]
    f = batch.fresh.astype(jnp.float32) * wts
    a = jax.lax.stop_gradient(admitted(batch, mult)) * wts
    k = batch.work

    def mean_of(x):  # weighted mean service time over the candidates weighted by x
        return jnp.sum(x * k) / jnp.maximum(jnp.sum(x), 1e-30)

    out = []
    for x_adm, x_fresh in ((a, f), (a * batch.b, f * batch.b)):
        v = jnp.where(jnp.sum(x_adm) > 0, mean_of(x_adm),
                      jnp.where(jnp.sum(x_fresh) > 0, mean_of(x_fresh), 1.0))
        out.append(jnp.maximum(v, 1.0))
    return jax.lax.stop_gradient(jnp.stack(out))


def slot_dual(batch: SlotBatch, b_s, cap_bw_s, m, kbar, temp, utilisation=1.0):
    """Per-slot dual value [...]; hard max if ``temp`` is None, else smooth max at ``temp``.

    b_s, cap_bw_s in units of the learner's bandwidth scale; m: [..., 2] or [2] (λ_s,
    µ_scaled); kbar: ``(k̄_u, k̄_b)`` [2] (:func:`service_time`) or one number for both;
    utilisation: ρ, the unit capacity counted is ρ·M_t.
    """
    vals = _choice_values(*priced(batch.w, batch.w_bar, b_s, m[..., 0], m[..., 1]))
    # Entries that are not new nominations count 0; zero them before the max as well, so a
    # non-finite value there cannot reach the gradient (jnp.where passes 0 · NaN = NaN).
    vals = jnp.where(batch.fresh[..., None], vals, 0.0)
    if temp is None:
        best = vals.max(axis=-1)
    else:
        best = temp * jax.nn.logsumexp(vals / temp, axis=-1)
    inner = jnp.sum(jnp.where(batch.fresh, best, 0.0), axis=-1)
    kbar = jnp.broadcast_to(jnp.asarray(kbar, jnp.float32), (2,))
    return inner + (m[..., 0] * utilisation * batch.capacity_units / kbar[0]
                    + m[..., 1] * cap_bw_s / kbar[1])


def weighted_mean(v, weights):
    """Σ weights·v / max(Σ weights, 1) over all leading dims of v [..., (k)]."""
    wts = weights.reshape(-1)
    v = v.reshape((wts.shape[0],) + v.shape[weights.ndim:])
    wts = wts.reshape((-1,) + (1,) * (v.ndim - 1))
    return jnp.sum(wts * v, axis=0) / jnp.maximum(jnp.sum(wts), 1.0)


def excess_demand(batch: SlotBatch, mult: Multipliers, utilisation: float = 1.0) -> jax.Array:
    """Long-run occupancy excess of the hard rule before repair, per slot: [..., 2].

    [..., 0] = Σ admit_i·k_i − ρ·M_t over the new nominations (busy unit-slots the slot's
    admissions ask for minus the allowed busy units; ρ = ``utilisation``); [..., 1] =
    Σ admit_i·b_i·k_i − B_t (Hz·slots minus Hz). Each admission counts with its own service
    time ``k_i``, so the mean over slots is the admitted demand's long-run occupancy minus the
    cap (Little's law); divided by ``service_time`` it is minus the dual's slope (module
    docstring). With ``k = 1`` it is admissions − ρ·M_t and admitted bandwidth − B_t.
    """
    adm = admitted(batch, mult)
    k = batch.work
    return jnp.stack([(adm * k).sum(-1) - utilisation * batch.capacity_units,
                      (adm * batch.b * k).sum(-1) - batch.capacity_bw], axis=-1)
