"""Reads and writes the run files of a stage-2 run: ``multipliers.json`` and ``gap.json``.

Both are written atomically (a temporary file renamed over the target), so a reader never sees
a half-written file. Layout of a run directory: docs/dual.md.
"""
from __future__ import annotations

import math
from pathlib import Path

from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from prada_jax.dual.problem import Multipliers

MULTIPLIERS_FILE = "multipliers.json"
GAP_FILE = "gap.json"


def save_multipliers(workdir, mult: Multipliers, info: dict | None = None) -> Path:
    """Writes ``<workdir>/multipliers.json``; returns the path.

    Fields: ``lambda_s`` (PRM units per server unit), ``mu`` (PRM units per Hz),
    ``mu_per_mhz``, plus ``info`` (mode, chunk, slots, scenario, ...). Negative or non-finite
    multipliers raise ValueError.
    """
    lam, mu = float(mult.lambda_s), float(mult.mu)
    if not (math.isfinite(lam) and math.isfinite(mu) and lam >= 0 and mu >= 0):
        raise ValueError(f"save_multipliers: multipliers must be finite and >= 0, got "
                         f"lambda_s={lam}, mu={mu}")
    payload = dict(info or {}, lambda_s=lam, mu=mu, mu_per_mhz=mu * 1e6)
    return write_json(Path(workdir) / MULTIPLIERS_FILE, payload, sort_keys=True, default=str,
                      newline=False)


def read_multipliers(workdir, error: type[BadInput] = BadInput) -> tuple[Multipliers, dict]:
    """The one reader of ``<workdir>/multipliers.json`` (written by a ``train.dual`` run at
    every checkpoint and at the end): ``(Multipliers(λ_s, µ per Hz) as plain floats, info)``,
    ``info`` holding every other field of the file (``scenario``, ``mode``, ``chunk``, ...).

    For a load-conditioned run these are its multipliers at the mean load features of the
    last training chunk (the scalar form the paper and the evaluation use). A missing or
    malformed file, or a multiplier that is not a finite number >= 0, raises ``error`` (a
    ``BadInput``, so a ``ValueError``) naming the file and the field.
    """
    path = Path(workdir) / MULTIPLIERS_FILE
    d = read_json(path, missing=f"is {workdir} a train.dual run directory that saved at least "
                  "one checkpoint?", error=error)
    for name in ("lambda_s", "mu"):
        v = d.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v >= 0):
            raise error(f"{path}: field '{name}' must be a finite number >= 0, got {v!r}")
    info = {k: v for k, v in d.items() if k not in ("lambda_s", "mu")}
    return Multipliers(lambda_s=float(d["lambda_s"]), mu=float(d["mu"])), info


def load_multipliers(workdir) -> Multipliers:
    """(λ_s, µ per Hz) of a ``train.dual`` run (:func:`read_multipliers` without the info)."""
    return read_multipliers(workdir)[0]


def save_gap(path, gap: dict) -> Path:
    """Writes a :func:`prada_jax.dual.gap.measure_gap` report to ``path`` (``gap.json`` of a
    run, or where ``benchmarks.duality_gap --out`` says); returns the path."""
    return write_json(Path(path), gap, newline=False)
