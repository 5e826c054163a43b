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

Presets that make a resource bind under a trained policy's *own* nominations (issue 23;
measured shares in docs/dual.md). Their factors need env scalars other than the defaults, given
by :data:`PRESET_ENV` (``preset_env(name)``; ``studies.stage2_verdict`` applies them per scenario):

* ``bandwidth_bound``: M = 16 units and B = 3 MHz (all factors 1): units are plentiful, the
  band is not, so requests of different widths wait while units are free (µ's job).
* ``outage_burst``: M = 4; every 400 slots another tenant takes ¾ of the units for 120 slots
  (factor 0.25: M_t = 1 at M = 4, 2 at M = 8, 1 at M = 2) and arrivals come in bursts (× 4
  for 40 slots out of every 200, × 0.6 otherwise), one burst starting with each outage: a
  time-varying M_t ≥ 1 at M ≥ 2.
* ``bandwidth_bound_dense``: ``bandwidth_bound`` at 4× the arrival rate (48 users/s) and
  U = 128 user slots: under the demo policy's own nominations the band binds for the λ = µ = 0
  rule (in ≈ 40 % of validation slots; the original preset: ≈ 1 %).
* ``outage_burst_m2``: ``outage_burst``'s schedule at M = 2 (M_t = 1 in an outage), 24
  users/s, U = 64: capacity binds for the rule in ≈ 18 % of validation slots (original: ≈ 5 %).
Presets at the contended operating points of the roofline clock (issue 33 item 5; chosen on
validation for the seed-0 policy under ``a100_orin_int4``, studies/stage2_pooled/registration.md
Part 1b):
* ``contended``: all factors 1 at M = 4 server sequence slots and λ = 4·√2 ≈ 5.66 users/s
  (load 1.41 per slot, a point of the load curve's grid): the λ = µ = 0 rule keeps the server
  ≈ 73 % busy and capacity binds in ≈ 31 % of validation slots, where the server LLM alone
  would be unstable (studies/load_curve/README.md).
* ``outage_burst_m4``: ``outage_burst``'s schedule at M = 4 and 2 users/s (load 0.5 per
  slot): outside outages the server is lightly used (the rule's occupancy ≈ 25 %); in an
  outage (M_t = 1) with its arrival burst, requests queue (capacity binds in ≈ 26 % of
  validation slots).
* ``slow_server``: the server computes 10× slower (``server_speed`` 0.1: 31 TFLOP/s peak, an
  edge-class accelerator instead of an A100; an assumption), so at the verdict's load (M = 1,
  12 users/s) the actor's own nominations keep the unit busy and capacity binds.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from prada_jax import latency
from prada_jax.errors import BadInput

__all__ = ["Scenario", "ScenarioError", "PRESETS", "PRESET_ENV", "DEFAULT_LENGTH", "preset",
           "preset_env", "validate", "static", "parse_names"]

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


def _outage_burst(n):
    t = np.arange(n)
    arr = np.where((t % 200) < 40, 4.0, 0.6)
    out = (t % 400) < 120
    return static(n)._replace(arrival=arr.astype(np.float32),
                              servers=np.where(out, OUTAGE_SERVERS, 1.0).astype(np.float32))


#: Share of units ``outage_burst`` leaves during an outage (M = 4 → 1).
OUTAGE_SERVERS = 0.25


def _degraded(n):
    t = np.arange(n)
    bad = (t >= int(0.3 * n)) & (t < int(0.7 * n))
    s = static(n, arrival=1.5)
    return s._replace(bandwidth=np.where(bad, 0.3, 1.0).astype(np.float32),
                      channel_db=np.where(bad, -6.0, 0.0).astype(np.float32),
                      servers=np.where(bad, DEGRADED_SERVERS, 1.0).astype(np.float32))


PRESETS = {"nominal": _nominal, "heavy": _heavy, "burst": _burst, "diurnal": _diurnal,
           "degraded": _degraded, "bandwidth_bound": _nominal, "outage_burst": _outage_burst,
           "slow_server": _nominal, "bandwidth_bound_dense": _nominal,
           "outage_burst_m2": _outage_burst, "contended": _nominal,
           "outage_burst_m4": _outage_burst}

#: Arrival rate of ``contended`` [users/s]: load 4·√2 / M = √2 per server sequence slot at
#: M = 4 (the load curve's grid point 2^(1/2)).
CONTENDED_RATE_HZ = 4.0 * math.sqrt(2.0)

#: Env scalars a preset assumes, overriding the evaluation's (keys of ``evals.suite``'s env
#: settings plus ``server_speed``, a factor on the server's peak FLOP/s; see module docstring).
PRESET_ENV = {"bandwidth_bound": {"num_servers": 16, "bandwidth_hz": 3e6},
              "outage_burst": {"num_servers": 4},
              "slow_server": {"server_speed": 0.1},
              # variants chosen on validation seeds for the trained demo policy, where the
              # originals did not bind under its own nominations (studies/stage2_verdict/registration.md)
              "bandwidth_bound_dense": {"num_servers": 16, "bandwidth_hz": 3e6,
                                        "arrival_rate_hz": 48.0, "num_users": 128},
              "outage_burst_m2": {"num_servers": 2, "arrival_rate_hz": 24.0, "num_users": 64},
              # contended operating points of the roofline clock (issue 33 item 5)
              "contended": {"num_servers": 4, "arrival_rate_hz": CONTENDED_RATE_HZ},
              "outage_burst_m4": {"num_servers": 4, "arrival_rate_hz": 2.0}}


def preset_env(name: str) -> dict:
    """The env overrides of preset ``name`` (empty for the presets that act by factors
    alone); :class:`ScenarioError` for an unknown name."""
    if name not in PRESETS:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(PRESETS)}")
    return dict(PRESET_ENV.get(name, {}))


def preset(name: str, length: int = DEFAULT_LENGTH) -> Scenario:
    """The named preset as a validated schedule of ``length`` slots."""
    if name not in PRESETS:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(PRESETS)}")
    if int(length) < 1:
        raise ScenarioError(f"scenario length must be >= 1, got {length}")
    return validate(PRESETS[name](int(length)))


def latency_overrides(env: dict) -> dict:
    """``edge.make_params`` latency keyword arguments for the ``server_speed`` factor of an env
    dict (1 or absent: none; else the default server peak FLOP/s times the factor)."""
    speed = float(env.get("server_speed", 1.0))
    if not (speed > 0 and math.isfinite(speed)):
        raise ScenarioError(f"server_speed must be a finite number > 0, got {speed}")
    if speed == 1.0:
        return {}
    return {"server_peak_flops": latency.default_latency_params().server_peak_flops * speed}


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
