"""Counts every arrival as evals does: blocked or timed-out users at accuracy 0, latency D·τ.

The rule of ``evals.evaluate`` (module docstring): a run starts empty; a user that finishes
within the timeout ``D`` slots of its arrival counts with its answer and latency; a blocked
arrival, or one still unfinished ``D`` slots after it arrived, counts at accuracy 0 and latency
``D·τ``; means are per arrival. This module holds the pure pieces the stage-2 rollouts
(``prada_jax.dual.rollout``, ``trainer``, ``gap``) use, below ``evals`` in the layers:

* :func:`resolve` — per user and slot, who resolves: finished within the timeout, or timed
  out (each admitted user exactly once);
* :func:`censored_means` — accuracy and mean latency per arrival from window sums.

Env conventions (``envs.edge``): an arrival counted in slot ``s``'s info has
``arrival_slot = s + 1``; a user finishing in slot ``t`` reports ``user_latency_s`` =
(``t`` or ``t + 1`` − ``arrival_slot``)·τ.
"""
from __future__ import annotations

import jax.numpy as jnp

#: Timeout D of a stage-2 measurement, in slots: ``evals.evaluate.DEFAULT_DRAIN_SLOTS`` (a test
#: pins the two equal; stage2 sits below evals and cannot import it).
DEFAULT_TIMEOUT_SLOTS = 400


def latency_slots(user_latency_s, tau_s):
    """A finished user's latency in whole slots (int32), as ``evals`` rounds it."""
    return jnp.round(user_latency_s / tau_s).astype(jnp.int32)


def resolve(t, active, arrival_slot, done, user_latency_s, tau_s, timeout_slots: int):
    """Who resolves in slot ``t``: ``(ok [U] bool, timed_out [U] bool)``.

    Args:
      t: the slot (the env state's ``t`` before the step).
      active, arrival_slot: [U] of the env state before the step.
      done, user_latency_s: [U] of the step's outputs.
      tau_s: slot length; timeout_slots: D ≥ 1.
    ``ok``: finished in this slot within the timeout (latency ≤ D slots). ``timed_out``: present
    before the step, D slots after its arrival (``t = arrival_slot + D``) and not ``ok`` now: it
    can no longer finish within D. A user finishing later was counted here already.
    """
    ok = done & (latency_slots(user_latency_s, tau_s) <= timeout_slots)
    timed_out = active & (t - arrival_slot == timeout_slots) & ~ok
    return ok, timed_out


def censored_means(arrivals, finished, correct, latency_s, timeout_s):
    """``(accuracy, latency_mean_s)`` per arrival (float32; NaN where no arrival; jit-able).

    Args (sums over a window, arrays broadcast): arrivals (blocked included), finished (within
    the timeout), correct (of those), latency_s (their latency sum), timeout_s (D·τ).
    Failures ``arrivals − finished`` count at accuracy 0 and latency ``timeout_s``.
    """
    a = jnp.asarray(arrivals, jnp.float32)
    fail = a - jnp.asarray(finished, jnp.float32)
    acc = jnp.asarray(correct, jnp.float32) / a           # 0/0 = NaN: no arrival
    lat = (jnp.asarray(latency_s, jnp.float32) + fail * timeout_s) / a
    return acc, lat
