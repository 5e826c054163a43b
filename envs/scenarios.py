"""Scenario schedules for the edge env (docs/design.md §6, "dynamic edge networks").

A :class:`Scenario` is four per-slot arrays of one common length L, each a *factor* applied to
the env's scalar parameters (so sweeps over λ, M and B keep working under any scenario):

* ``arrival`` [L] ≥ 0: arrival rate at slot t = ``arrival_rate_hz · arrival[t]`` [users/s];
* ``bandwidth`` [L] > 0: total bandwidth B_t = ``bandwidth_hz · bandwidth[t]`` [Hz];
* ``channel_db`` [L] finite: offset added to every user's mean SNR at slot t [dB] (a fading
  draw |h|² is multiplied by ``10^(channel_db[t]/10)``);
* ``servers`` [L] in [0, 1]: server units available at slot t,
  M_t = ``floor(num_servers · servers[t] + 0.5)`` (the rest taken by other tenants).

Slot t of an episode reads index ``t mod L`` (the schedule repeats; a length-1 schedule is a
static scenario). The arrays are leaves of ``envs.edge.EnvParams``, so every scenario with the
same L runs in ONE compiled rollout; all presets here share :data:`DEFAULT_LENGTH` for that
reason. Units already running when M_t or B_t drops finish their job (no preemption); the env
admits new jobs only while the units and bandwidth in use stay within M_t and B_t.

Presets (``preset(name, length)``; the factors are assumptions chosen to stress the scheduler,
not measurements of a real network):

* ``nominal``: all factors 1 (the env's scalar parameters).
* ``heavy``: arrivals × 2.5 throughout.
* ``burst``: arrivals × 0.6 most of the time, × 4 for 40 slots (2 s at τ = 50 ms) out of every
  200 (mean × 1.28): bursts 4/0.6 ≈ 6.7 times the quiet rate, 3 times the mean.
* ``diurnal``: arrivals follow ``1.5 + 1.2·sin(2π t / L)`` (one slow cycle per schedule,
  between × 0.3 and × 2.7).
* ``degraded``: arrivals × 1.5; for the middle 40% of the schedule the bandwidth is × 0.3, the
  channel 6 dB worse and about half the server units are taken by another tenant: the factor
  0.45 gives M_t = ⌊0.45·M + ½⌋ < M at every M ≥ 1 (M = 1 → 0, an outage; 2, 3 → 1; 4 → 2;
  8 → 4; 16 → 7), where a factor of 0.5 would leave M = 1 untouched.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from prada_jax.errors import BadInput

__all__ = ["Scenario", "ScenarioError", "PRESETS", "DEFAULT_LENGTH", "preset", "validate",
           "static", "parse_names"]

DEFAULT_LENGTH = 1200  # slots (60 s at τ = 50 ms)


class ScenarioError(BadInput):
    """A scenario schedule is malformed; the message names the field."""


class Scenario(NamedTuple):
    """Per-slot factors, each [L] float32 (see module docstring for units)."""

    arrival: np.ndarray
    bandwidth: np.ndarray
    channel_db: np.ndarray
    servers: np.ndarray

    @property
    def length(self) -> int:
        return int(np.shape(self.arrival)[0])


FIELDS = Scenario._fields


def validate(scn: Scenario, length: int | None = None) -> Scenario:
    """Returns the scenario as float32 NumPy arrays, or raises :class:`ScenarioError` naming the
    field: every field 1-D, all of one length (``length`` if given), arrival ≥ 0, bandwidth > 0,
    servers in [0, 1], all finite."""
    arrays = {}
    for name in FIELDS:
        try:
            a = np.asarray(getattr(scn, name), np.float64)
        except (TypeError, ValueError):
            raise ScenarioError(f"scenario.{name} must be an array of numbers") from None
        if a.ndim != 1 or a.shape[0] < 1:
            raise ScenarioError(f"scenario.{name} must be a non-empty 1-D array, got shape "
                                f"{a.shape}")
        if not np.all(np.isfinite(a)):
            raise ScenarioError(f"scenario.{name} has non-finite values")
        arrays[name] = a
    want = arrays["arrival"].shape[0] if length is None else int(length)
    for name, a in arrays.items():
        if a.shape[0] != want:
            raise ScenarioError(f"scenario.{name} has length {a.shape[0]}, expected {want} "
                                f"(all fields share one schedule length)")
    if np.any(arrays["arrival"] < 0):
        raise ScenarioError("scenario.arrival (rate factor) must be >= 0")
    if np.any(arrays["bandwidth"] <= 0):
        raise ScenarioError("scenario.bandwidth (bandwidth factor) must be > 0")
    if np.any((arrays["servers"] < 0) | (arrays["servers"] > 1)):
        raise ScenarioError("scenario.servers (available share of server units) must be in "
                            "[0, 1]")
    return Scenario(**{k: v.astype(np.float32) for k, v in arrays.items()})


def static(length: int = 1, arrival: float = 1.0, bandwidth: float = 1.0,
           channel_db: float = 0.0, servers: float = 1.0) -> Scenario:
    """A constant schedule of ``length`` slots."""
    f = lambda v: np.full((int(length),), v, np.float32)  # noqa: E731
    return Scenario(f(arrival), f(bandwidth), f(channel_db), f(servers))


def _nominal(n):
    return static(n)


def _heavy(n):
    return static(n, arrival=2.5)


def _burst(n):
    t = np.arange(n)
    arr = np.where((t % 200) < 40, 4.0, 0.6)
    return static(n)._replace(arrival=arr.astype(np.float32))


def _diurnal(n):
    t = np.arange(n)
    arr = 1.5 + 1.2 * np.sin(2.0 * math.pi * t / n)
    return static(n)._replace(arrival=arr.astype(np.float32))


#: Share of server units ``degraded`` leaves (module docstring): below ½ so one unit of one goes.
DEGRADED_SERVERS = 0.45


def _degraded(n):
    t = np.arange(n)
    bad = (t >= int(0.3 * n)) & (t < int(0.7 * n))
    s = static(n, arrival=1.5)
    return s._replace(bandwidth=np.where(bad, 0.3, 1.0).astype(np.float32),
                      channel_db=np.where(bad, -6.0, 0.0).astype(np.float32),
                      servers=np.where(bad, DEGRADED_SERVERS, 1.0).astype(np.float32))


PRESETS = {"nominal": _nominal, "heavy": _heavy, "burst": _burst, "diurnal": _diurnal,
           "degraded": _degraded}


def preset(name: str, length: int = DEFAULT_LENGTH) -> Scenario:
    """The named preset as a validated schedule of ``length`` slots."""
    if name not in PRESETS:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(PRESETS)}")
    if int(length) < 1:
        raise ScenarioError(f"scenario length must be >= 1, got {length}")
    return validate(PRESETS[name](int(length)))


def parse_names(text: str, flag: str = "--scenarios") -> list[str]:
    """Comma-separated preset names → list (each known, no duplicates), else ScenarioError
    naming ``flag``."""
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    if not names:
        raise ScenarioError(f"{flag}: no scenario given; known: {', '.join(PRESETS)}")
    for n in names:
        if n not in PRESETS:
            raise ScenarioError(f"{flag}: unknown scenario {n!r}; known: {', '.join(PRESETS)}")
    if len(set(names)) != len(names):
        raise ScenarioError(f"{flag}: a scenario is listed twice: {text}")
    return names
