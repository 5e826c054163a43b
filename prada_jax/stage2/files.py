"""Reads and writes the run files of a stage-2 run: ``multipliers.json`` and ``gap.json``.

Both are written atomically (a temporary file renamed over the target), so a reader never sees
a half-written file. Layout of a run directory: docs/dual.md.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from prada_jax.jsonio import write_json
from prada_jax.stage2.problem import Multipliers

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


def load_multipliers(workdir) -> Multipliers:
    """(λ_s, µ) learned by a ``train.dual`` run, as plain floats (µ per Hz).

    Reads ``<workdir>/multipliers.json`` (written at every checkpoint and at the end).
    For a load-conditioned run these are its multipliers at the mean load features of the
    last training chunk (the scalar form the paper and the evaluation use). Raises
    FileNotFoundError / ValueError naming the file.
    """
    path = Path(workdir) / MULTIPLIERS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (is {workdir} a train.dual run directory "
                                "that saved at least one checkpoint?)")
    try:
        d = json.loads(path.read_text())
        lam, mu = float(d["lambda_s"]), float(d["mu"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed ({type(e).__name__}: {e})") from None
    for name, v in (("lambda_s", lam), ("mu", mu)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{path}: field '{name}' must be a finite number >= 0, got {v}")
    return Multipliers(lambda_s=lam, mu=mu)


def save_gap(path, gap: dict) -> Path:
    """Writes a :func:`prada_jax.stage2.gap.measure_gap` report to ``path`` (``gap.json`` of a
    run, or where ``benchmarks.duality_gap --out`` says); returns the path."""
    return write_json(Path(path), gap, newline=False)
