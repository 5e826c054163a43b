"""Judges one ``studies.stage2_verdict`` scenario report by issue 23's pre-registered rules
(studies/stage2_verdict/registration.md, Part 1) and returns pass / fail / cannot-resolve per target.

Inputs are the per-scenario dicts of ``stage2.json`` (``scenarios[NAME]``: ``per_seed``,
``power``, optionally ``budget`` and ``grid``); every difference is recomputed from the
per-seed objectives (paired over the evaluation seeds, two-sided 95 % Student-t interval,
``prada_jax.stats.mean_ci``), so a judgement never depends on a stored summary alone. All
numbers are in the objective's units (accuracy − β·latency, PRM units).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from studies.stage2_verdict import report as stage2
from prada_jax import stats
from prada_jax.errors import BadInput

#: The gate of the issue's targets: a scenario is judged only if its headroom is at least this
#: and its MDE at most half of it (the constant ``studies.stage2_verdict``'s power note applies too).
MIN_HEADROOM = stage2.MIN_HEADROOM
PASS, FAIL, UNRESOLVED = "pass", "fail", "cannot resolve"


def paired_ci(per_seed: dict, a: str, b: str, metric: str = "objective") -> dict:
    """``{"mean", "lo", "hi", "n"}`` of the per-seed difference ``a − b`` (non-finite seeds
    dropped; NaN bounds below two seeds)."""
    ci = stats.paired_diff_ci(per_seed[a][metric], per_seed[b][metric], 0.95)
    return {"mean": ci.mean, "lo": ci.low, "hi": ci.high, "n": ci.n}


def _above_zero(ci: dict) -> bool:
    return math.isfinite(ci["lo"]) and ci["lo"] > 0.0


def _not_below_zero(ci: dict) -> bool:
    return math.isfinite(ci["hi"]) and ci["hi"] >= 0.0


def gate(headroom, mde) -> tuple[bool, str]:
    """``(resolvable, why)``: resolvable iff headroom ≥ :data:`MIN_HEADROOM` and MDE ≤
    headroom / 2."""
    if headroom is None or mde is None or not (math.isfinite(headroom)
                                               and math.isfinite(mde)):
        return False, "headroom or MDE undefined"
    if headroom < MIN_HEADROOM:
        return False, f"headroom {headroom:+.4f} < {MIN_HEADROOM}: no room for a price"
    if mde > headroom / 2:
        return False, f"MDE {mde:.4f} > headroom/2 {headroom / 2:.4f}: too few seeds"
    return True, f"resolvable: headroom {headroom:+.4f} >= {MIN_HEADROOM}, MDE {mde:.4f} <= " \
                 f"headroom/2"


def judge(report: dict, outage: bool = False) -> dict:
    """The verdict of one scenario report (``stage2.json`` ``scenarios[NAME]``).

    Returns ``{"headroom", "mde", "resolvable", "gate", "cis": {name: ci}, "targets":
    {target: pass|fail|cannot resolve}}``; targets ``learned_beats_zero`` (CI of learned
    constant − λ=µ=0 above 0), ``learned_near_reference`` (CI of learned − Best constant
    (grid, validation) not below 0), with ``outage`` also ``conditioned_beats_constant`` (CI
    of conditioned − learned constant above 0), all "cannot resolve" unless the gate passes;
    with a ``budget`` in the report, ``budget`` (see :func:`judge_budget`)."""
    ps = report["per_seed"]
    pw = report.get("power", {})
    h, m = pw.get("headroom"), pw.get("mde")
    ok, why = gate(h, m)
    cis = {"learned_minus_zero": paired_ci(ps, stage2.ROW_CONST, stage2.ROW_ZERO),
           "learned_minus_best_constant": paired_ci(ps, stage2.ROW_CONST, stage2.ROW_BEST),
           "best_constant_minus_zero": paired_ci(ps, stage2.ROW_BEST, stage2.ROW_ZERO),
           "conditioned_minus_constant": paired_ci(ps, stage2.ROW_COND, stage2.ROW_CONST),
           "nolimits_minus_zero": paired_ci(ps, stage2.ROW_NOLIM, stage2.ROW_ZERO),
           "zero_minus_fifo": paired_ci(ps, stage2.ROW_ZERO, stage2.ROW_FIFO)}
    if stage2.ROW_FILTER in ps:
        cis["filter_minus_fifo"] = paired_ci(ps, stage2.ROW_FILTER, stage2.ROW_FIFO)
        cis["zero_minus_filter"] = paired_ci(ps, stage2.ROW_ZERO, stage2.ROW_FILTER)
    t = {}
    if ok:
        t["learned_beats_zero"] = PASS if _above_zero(cis["learned_minus_zero"]) else FAIL
        t["learned_near_reference"] = (PASS if _not_below_zero(
            cis["learned_minus_best_constant"]) else FAIL)
        if outage:
            t["conditioned_beats_constant"] = (PASS if _above_zero(
                cis["conditioned_minus_constant"]) else FAIL)
    else:
        t["learned_beats_zero"] = t["learned_near_reference"] = UNRESOLVED
        if outage:
            t["conditioned_beats_constant"] = UNRESOLVED
    out = {"headroom": h, "mde": m, "resolvable": ok, "gate": why, "cis": cis, "targets": t}
    if report.get("budget"):
        out["budget"] = judge_budget(report)
        t["budget"] = out["budget"]["verdict"]
    return out


def judge_budget(report: dict) -> dict:
    """The budget target: (a) the learned constant's mean occupancy over the evaluation seeds
    ≤ cap·(1 + tolerance), (b) λ=µ=0's above it, (c) learned − Best constant (grid,
    validation, budget-feasible there) ≥ −MDE; "cannot resolve" for (c) when no grid pair was
    budget-feasible on validation. ``verdict``: pass iff (a), (b), (c) all pass."""
    bd = report["budget"]
    cap, tol = float(bd["cap"]), float(bd["tolerance"])
    ps = report["per_seed"]
    occ = {r: float(np.nanmean(ps[r]["server_util"])) for r in
           (stage2.ROW_CONST, stage2.ROW_COND, stage2.ROW_BEST, stage2.ROW_ZERO,
            stage2.ROW_FIFO) if r in ps}
    limit = cap * (1.0 + tol)
    a = occ[stage2.ROW_CONST] <= limit
    b = occ[stage2.ROW_ZERO] > limit
    mde = report.get("power", {}).get("mde")
    diff = paired_ci(ps, stage2.ROW_CONST, stage2.ROW_BEST)
    feasible = report.get("grid", {}).get("budget_feasible", True)
    if not feasible or mde is None or not math.isfinite(mde):
        c = UNRESOLVED
    else:
        c = PASS if diff["mean"] >= -mde else FAIL
    parts = {"learned_meets_cap": PASS if a else FAIL,
             "zero_violates_cap": PASS if b else FAIL, "learned_near_best_feasible": c}
    if FAIL in parts.values():
        verdict = FAIL
    elif UNRESOLVED in parts.values():
        verdict = UNRESOLVED
    else:
        verdict = PASS
    return {"cap": cap, "limit": limit, "occupancy": occ, "parts": parts,
            "learned_minus_best_feasible": diff, "mde": mde, "verdict": verdict}


# ----------------------------------------------------------------------------- the records

#: The registered runs of issue 23 (registration.md Part 2): the ``stage2.json`` of each
#: command, committed as ``results/stage2_verdict_<run>.json``.
REGISTERED_RUNS = ("nominal", "presets", "variants", "budget")
#: Their tables as the command printed them (``to_markdown``), one section per run.
TABLES_FILE = "stage2_verdict_tables.md"
#: The tables file's header as committed with the runs (it names the command and the page by
#: their names of that time, ``evals.stage2`` and ``stage2_verdict.md``).
TABLES_HEAD = ("# Full stage-2 tables of the issue-23 verdict (SYNTHETIC gsm8k, test split, "
               "16 seeds)\n\nAs printed by `evals.stage2` (one section per run; per-seed values "
               "in `stage2_verdict_<run>.json`). Judged in `stage2_verdict.md`.\n\n")


def run_file(results_dir, run: str) -> Path:
    """The committed ``stage2.json`` of registered run ``run``."""
    return Path(results_dir) / f"stage2_verdict_{run}.json"


def read_runs(results_dir) -> dict:
    """``{run: stage2.json dict}`` of the registered runs; ``BadInput`` naming a missing or
    unreadable file."""
    out = {}
    for run in REGISTERED_RUNS:
        f = run_file(results_dir, run)
        try:
            out[run] = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise BadInput(f"--out={results_dir}: cannot read {f.name} ({e})") from None
    return out


def tables_markdown(runs: dict) -> str:
    """``TABLES_FILE``'s text from the runs' ``stage2.json`` dicts (``read_runs``)."""
    return TABLES_HEAD + "\n".join(f"## run `{run}`\n\n" + stage2.to_markdown(r)
                                   for run, r in runs.items())


def judge_runs(runs: dict) -> dict:
    """``{run: {scenario: judge(...)}}`` by the registered rules (outage scenarios with the
    outage target)."""
    return {run: {name: judge(sc, outage=name.startswith("outage"))
                  for name, sc in r["scenarios"].items()} for run, r in runs.items()}
