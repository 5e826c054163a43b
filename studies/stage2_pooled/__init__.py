"""Stage-2 verdict over policy samples and learner seeds (issue 33):
``python -m studies.stage2_pooled --out=DIR --policies=P0,P1,P2 [--learner_seeds=2]
[--scenarios=slow_server] [--seeds=8] [--budget=0.27] [--quick]``.

The policies are independently trained samples (``python -m train.policy_samples``: PPO +
critic refit, one seed each). For policy ``i`` and learner seed ``j`` it runs the one-policy
verdict ``studies.stage2_verdict.run`` in ``DIR/cells/p<i>_l<j>`` with the learners' ``config.seed = j``
and its own block of test seeds: cell ``(i, j)`` evaluates test seeds ``seed0 + (i·L + j)·S
… + S − 1`` (L learner seeds, S evaluation seeds), so no two cells share an evaluation seed.
The validation grid's reference pair is searched once per (policy, scenario) and reused by the
policy's learner seeds (it does not depend on the learner). The hindsight row is skipped.

Per claim (a paired per-seed difference of two rows) the per-seed values form ``x[P, L, S]``;
the pooled interval (``prada_jax.stats.hierarchical_interval``) is the union of the nested bootstrap
(policies → learner seeds → eval seeds) and the Student-t interval over the P policy means.
``DIR/pooled.json`` holds, per scenario: ``claims`` (the intervals), ``per_policy`` (each
policy's means and its own nested-bootstrap interval over its learner seeds and eval seeds),
``power``, ``budget`` (with ``--budget``), ``verdict`` (the rules below) and ``per_seed``
(``[P][L][S]`` per row and metric); every cell's ``stage2.json`` stays under ``cells/``.
``DIR/pooled.md`` is the same as tables.

Rules (studies/stage2_pooled/registration.md, written before its numbers):

* gate: pooled headroom (no limits − λ=µ=0, grand mean) ≥ 0.02 and pooled MDE ≤ headroom/2,
  the MDE a two-sided t at 5 %, power 80 % over the P policy means (``stats.
  min_detectable_effect`` of their sd, n = P; the larger for learned − λ=µ=0 and no limits −
  λ=µ=0);
* ``learned_beats_zero``: pooled interval of learned − λ=µ=0 above 0;
* ``learned_near_reference``: pooled mean of learned − validation-chosen constant ≥ −MDE;
* ``conditioned_beats_constant`` (outage scenarios): pooled interval above 0;
* ``budget``: every policy sample's mean test occupancy of the learned constant ≤ cap·1.02.

Bad input (exit 2, one stderr line naming the flag or folder, nothing written): fewer than
two policies, a policy folder listed twice, a policy trained on another split or trace set
than the verdict's (``--trace_seed``, ``--problems``, the gsm8k synthetic set, train split).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np

from evals import suite
from prada_jax import config_utils, latency, stats
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from prada_jax.rl import policy as rl_policy
from prada_jax.traces import synthetic
from train import policy_samples
from studies import stage2_verdict as s2
from studies.stage2_verdict.verdict import FAIL, PASS, UNRESOLVED

#: Claims judged on each scenario: name → (row a, row b) of the paired difference a − b.
OUTAGE_PREFIX = "outage"


def _claims():
    return {"learned_minus_zero": (s2.ROW_CONST, s2.ROW_ZERO),
            "learned_minus_best_constant": (s2.ROW_CONST, s2.ROW_BEST),
            "conditioned_minus_constant": (s2.ROW_COND, s2.ROW_CONST),
            "conditioned_minus_zero": (s2.ROW_COND, s2.ROW_ZERO),
            "best_constant_minus_zero": (s2.ROW_BEST, s2.ROW_ZERO),
            "headroom_nolimits_minus_zero": (s2.ROW_NOLIM, s2.ROW_ZERO)}


def check_policies(dirs, trace_seed: int = 0, problems: int = 0, flag: str = "--policies",
                   hardware: str | None = None, min_count: int = 2):
    """Loads every policy folder and checks that it was trained on the verdict's trace set:
    the gsm8k synthetic set of generator seed ``trace_seed`` with ``problems`` problems (0: the
    benchmark's count), its train split, and under the verdict's clock ``hardware`` (a pair of
    ``prada_jax.latency.PAIRS``; None: ``latency.CONFIG_PAIR``, the configs' default;
    ``train.policy_samples``). Returns the loaded policies. ``BadInput`` naming the folder (or
    ``flag``) otherwise; nothing is written."""
    dirs = [str(d) for d in dirs]
    if len(dirs) < int(min_count):
        raise BadInput(f"{flag}: a pooled verdict needs >= 2 independently trained policy "
                       f"samples, got {len(dirs)}")
    res = [str(Path(d).resolve()) for d in dirs]
    if len(set(res)) != len(res):
        raise BadInput(f"{flag}: a policy folder is listed twice ({','.join(dirs)})")
    want_total = int(problems) or int(synthetic.PRESETS["gsm8k"].problems)
    want = {"source": "synthetic:gsm8k", "split": "train", "trace_seed": int(trace_seed),
            "problems_total": want_total}
    hardware = str(hardware or latency.CONFIG_PAIR)
    latency.check_pair(hardware, "--hardware")
    metas = []
    for d in dirs:   # the metadata of every folder first (cheap), then the checkpoints
        if not Path(d).is_dir():
            raise BadInput(f"{flag}: {d}: no such policy folder")
        try:
            meta = rl_policy.read_policy_meta(d)
        except (FileNotFoundError, ValueError) as e:
            raise BadInput(f"{flag}: {e}") from None
        tr = meta.get("traces") if isinstance(meta, dict) else None
        tr = tr if isinstance(tr, dict) else {}
        got = {k: tr.get(k) for k in want}
        bad = [k for k in want if got[k] != want[k]]
        if bad:
            k = bad[0]
            raise BadInput(f"{flag}: {d} was trained on {k} {got[k]!r}, the verdict's is "
                           f"{want[k]!r} ({Path(d) / rl_policy.POLICY_META_FILE} traces)")
        metas.append(meta)
    for d, meta in zip(dirs, metas):   # then the clock: one pair for every step
        policy_samples.check_policy_pair(meta, hardware, f"{flag}: {d}")
    out = [suite.load_policy(d, flag=flag) for d in dirs]   # EvalError (BadInput) naming it
    return out


def cell_seed0(seed0: int, i: int, j: int, learner_seeds: int, seeds: int) -> int:
    """First test seed (offset into the test range) of cell (policy i, learner seed j)."""
    return int(seed0) + (int(i) * int(learner_seeds) + int(j)) * int(seeds)


#: Written beside a finished cell's stage2.json: the settings it was run with. A rerun with
#: the same settings reuses the cell instead of computing it again.
CELL_FILE = "cell.json"


def cell_key(policy, learner_seed, seed0, seeds, size, budget, tighten, hardware,
             nominate_by, scenario_names) -> dict:
    """The settings that determine one cell's stage2.json (``CELL_FILE``); ``policy`` names
    the policy by content (``suite.policy_record``'s ``policy_sha256``), not by the folder it
    happens to be stored in."""
    return {"policy_sha256": str(policy), "learner_seed": int(learner_seed),
            "seed0": int(seed0), "seeds": int(seeds), "size": str(size),
            "budget": None if budget is None else float(budget),
            "tighten": None if budget is None or tighten is None else
            {"confidence": float(tighten["confidence"]),
             "margins": [float(m) for m in tighten["margins"]]},
            "hardware": str(hardware), "nominate_by": str(nominate_by),
            "scenarios": list(scenario_names)}


def reuse_cell(d: Path, key: dict) -> dict | None:
    """The finished cell under ``d`` if its ``CELL_FILE`` equals ``key``, else None."""
    f, res = Path(d) / CELL_FILE, Path(d) / "stage2.json"
    if not (f.is_file() and res.is_file()):
        return None
    try:
        if json.loads(f.read_text()) != key:
            return None
        r = json.loads(res.read_text())
    except (OSError, ValueError):
        return None
    if not all(n in r.get("scenarios", {}) for n in key["scenarios"]):
        return None
    return r


def stack(cells: list[list[dict]], scenario: str, row: str, metric: str) -> np.ndarray:
    """``x[P, L, S]`` of one row's per-seed metric from the cells' stage2.json dicts."""
    return np.asarray([[c["scenarios"][scenario]["per_seed"][row][metric] for c in per_pol]
                       for per_pol in cells], np.float64)


def pooled_mde(diffs: list[np.ndarray], alpha: float = 0.05, power: float = 0.8) -> float:
    """The largest MDE over ``diffs`` (each ``x[P, L, S]``) of a t-test over the P policy
    means (``prada_jax.stats.min_detectable_effect``; NaN-free means only)."""
    out = [stats.policy_means_mde(x, alpha, power) for x in diffs]
    out = [v for v in out if math.isfinite(v)]
    return float(max(out)) if out else float("nan")


def judge_scenario(cells: list[list[dict]], scenario: str, budget: float | None,
                   resamples: int, seed: int = 0) -> dict:
    """Pooled claims, per-policy results, power, budget and verdict of one scenario."""
    rows_present = set(cells[0][0]["scenarios"][scenario]["per_seed"])
    claims, diffs = {}, {}
    for name, (a, b) in _claims().items():
        if a not in rows_present or b not in rows_present:
            continue
        x = (stack(cells, scenario, a, "objective") - stack(cells, scenario, b, "objective"))
        diffs[name] = x
        claims[name] = stats.hierarchical_interval(x, resamples=resamples, seed=seed)
    P = len(cells)
    per_policy = []
    occ_all = stack(cells, scenario, s2.ROW_CONST, "server_util")     # [P, L, S]
    for i in range(P):
        pp = {"claims": {}, "learned": [], "occupancy": {},
              # the learned constant's test occupancy (busy units / M), with or without a cap
              "learned_occupancy": {"mean": float(np.nanmean(occ_all[i])),
                                    "per_cell": [float(v) for v in np.nanmean(occ_all[i],
                                                                             axis=1)]}}
        for name, x in diffs.items():
            b = stats.hierarchical_bootstrap(x[i:i + 1], resamples=resamples, seed=seed)
            pp["claims"][name] = {"mean": b["mean"], "lo": b["lo"], "hi": b["hi"]}
        for c in cells[i]:
            sc = c["scenarios"][scenario]
            pp["learned"].append({"learner_seed": c["meta"].get("learner_seed"),
                                  "multipliers": sc.get("multipliers"),
                                  "grid_best": sc.get("grid", {}).get("best")})
        per_policy.append(pp)
    h = claims.get("headroom_nolimits_minus_zero", {}).get("mean")
    mde = pooled_mde([diffs[k] for k in ("learned_minus_zero", "headroom_nolimits_minus_zero")
                      if k in diffs])
    ok = (h is not None and math.isfinite(h) and math.isfinite(mde)
          and h >= s2.MIN_HEADROOM and mde <= h / 2)
    why = ("headroom or MDE undefined" if h is None or not math.isfinite(mde) else
           f"headroom {h:+.4f} {'>=' if h >= s2.MIN_HEADROOM else '<'} {s2.MIN_HEADROOM}, "
           f"MDE {mde:.4f} {'<=' if mde <= h / 2 else '>'} headroom/2 {h / 2:.4f}")
    t = {}
    if ok:
        t["learned_beats_zero"] = PASS if claims["learned_minus_zero"]["lo"] > 0 else FAIL
        t["learned_near_reference"] = (
            PASS if claims["learned_minus_best_constant"]["mean"] >= -mde else FAIL)
        if scenario.startswith(OUTAGE_PREFIX) and "conditioned_minus_constant" in claims:
            t["conditioned_beats_constant"] = (
                PASS if claims["conditioned_minus_constant"]["lo"] > 0 else FAIL)
    else:
        t["learned_beats_zero"] = t["learned_near_reference"] = UNRESOLVED
        if scenario.startswith(OUTAGE_PREFIX):
            t["conditioned_beats_constant"] = UNRESOLVED
    out = {"claims": claims, "per_policy": per_policy,
           "power": {"headroom": h, "mde": mde, "resolvable": bool(ok), "gate": why,
                     "mde_test": "two-sided t at 5 %, power 80 %, over the policy means"},
           "verdict": t}
    if budget is not None:
        limit = float(budget) * (1.0 + s2.BUDGET_TOLERANCE)
        occ = stack(cells, scenario, s2.ROW_CONST, "server_util")      # [P, L, S]
        zero = stack(cells, scenario, s2.ROW_ZERO, "server_util")
        pol_mean = np.nanmean(occ.reshape(P, -1), axis=1)
        margins = [[(c["scenarios"][scenario].get("budget") or {}).get("margin")
                    for c in per_pol] for per_pol in cells]
        for i in range(P):
            per_policy[i]["occupancy"] = {
                "learned_mean": float(pol_mean[i]),
                "learned_per_cell": [float(v) for v in np.nanmean(occ[i], axis=1)],
                "exceed_share": float(np.mean(~(occ[i] <= limit))),
                "zero_mean": float(np.nanmean(zero[i])),
                "margins": [None if m is None else m["margin"] for m in margins[i]]}
        holds = bool(np.all(pol_mean <= limit))
        out["budget"] = {"cap": float(budget), "limit": limit,
                         "learned_mean_per_policy": [float(v) for v in pol_mean],
                         "exceed_share_all_seeds": float(np.mean(~(occ <= limit))),
                         "holds_for_every_policy": holds}
        t["budget"] = PASS if holds else FAIL
    return out


@dataclasses.dataclass(frozen=True)
class Settings:
    """The settings of :func:`run_pooled` besides the folders and scenarios (module docstring;
    ``tighten``: ``studies.stage2_verdict.run``'s budget tightening, with ``budget`` only)."""
    learner_seeds: int = 2
    seeds: int | None = None
    size: str = "full"
    budget: float | None = None
    tighten: dict | None = None
    seed0: int = 0
    trace_seed: int = 0
    problems: int = 0
    nominate_by: str = "actor"
    resamples: int | None = None
    hardware: str | None = None
    only_policies: tuple | None = None


def run_pooled(out, policy_dirs, scenario_names, log=print, **settings) -> dict | None:
    """The pooled verdict; writes ``pooled.json`` / ``pooled.md`` under ``out`` and returns
    the dict (module docstring; ``settings``: the fields of :class:`Settings`). Checks every
    input before writing anything. With ``only_policies`` it runs those policies' cells only
    and returns None."""
    s, only, S, resamples = _check_inputs(policy_dirs, Settings(**settings))
    out = config_utils.check_output_dir(out, "--out")   # a file, or under one: refused
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cells, cell_meta, pol_records = _run_cells(out, policy_dirs, scenario_names, s, only, S,
                                               log, t0)
    if only is not None:
        log(f"cells of policies {only} written under {out / 'cells'}; pooled.json needs every "
            "policy's cells (run again without --only_policies: finished cells are reused)")
        return None
    result = {"meta": _meta(s, S, resamples, pol_records, cell_meta, len(policy_dirs)),
              "scenarios": {}}
    for name in scenario_names:
        rep = judge_scenario(cells, name, s.budget, resamples)
        rep["per_seed"] = {row: {m: stack(cells, name, row, m).tolist()
                                 for m in ("objective", "server_util")}
                           for row in cells[0][0]["scenarios"][name]["per_seed"]}
        result["scenarios"][name] = rep
    result["meta"]["wall_s"] = time.perf_counter() - t0
    write_json(out / "pooled.json", result, allow_nan=False)
    (out / "pooled.md").write_text(to_markdown(result))
    return result


def _check_inputs(policy_dirs, s: Settings):
    """Every check before anything is written: returns (settings with the hardware pair
    resolved, the sorted ``only_policies`` or None, seeds per cell, resamples)."""
    if int(s.learner_seeds) < 1:
        raise BadInput(f"--learner_seeds must be >= 1, got {s.learner_seeds}")
    s = dataclasses.replace(s, hardware=str(s.hardware or latency.CONFIG_PAIR))
    if len(policy_dirs) < 2:
        check_policies(policy_dirs, s.trace_seed, s.problems, hardware=s.hardware)  # message
    only = (None if s.only_policies is None
            else sorted({int(i) for i in s.only_policies}))
    if only is not None and (not only or min(only) < 0 or max(only) >= len(policy_dirs)):
        raise BadInput(f"--only_policies={s.only_policies}: indices into --policies "
                       f"(0..{len(policy_dirs) - 1})")
    check_policies([policy_dirs[i] for i in (only if only is not None
                                             else range(len(policy_dirs)))],
                   s.trace_seed, s.problems, hardware=s.hardware,
                   min_count=1 if only is not None else 2)
    S = int(s.seeds if s.seeds is not None else s2.SIZES[s.size]["seeds"])
    if S < 2:
        raise BadInput(f"--seeds must be >= 2 (a CI needs two seeds), got {S}")
    if s.budget is not None:
        s2.check_budget(s.budget)
    return s, only, S, int(s.resamples or stats.HIERARCHICAL_RESAMPLES)


def _run_cells(out: Path, policy_dirs, scenario_names, s: Settings, only, S: int, log,
               t0: float):
    """Runs (or reuses) every cell (policy i, learner seed j) under ``out/cells/p<i>_l<j>``;
    returns (cells[P][L] as stage2.json dicts, the cells' meta, the policy records)."""
    grid_cache: dict = {}
    cells, cell_meta = [], []
    L = int(s.learner_seeds)
    pol_records = {}
    for i, pdir in enumerate(policy_dirs):
        if only is not None and i not in only:
            continue
        per_pol = []
        pol_records[i] = suite.policy_record(pdir, out)
        for j in range(L):
            s0 = cell_seed0(s.seed0, i, j, L, S)
            d = out / "cells" / f"p{i}_l{j}"
            key = cell_key(pol_records[i]["policy_sha256"], j, s0, S, s.size, s.budget,
                           s.tighten, s.hardware, s.nominate_by, scenario_names)
            r = reuse_cell(d, key)
            if r is not None:
                log(f"[{time.perf_counter() - t0:6.0f}s] cell policy {i}, learner seed {j}: "
                    f"reusing {d / 'stage2.json'} (same {CELL_FILE})")
            else:
                log(f"[{time.perf_counter() - t0:6.0f}s] cell policy {i} ({pdir}), learner "
                    f"seed {j}, test seeds +{s0}..+{s0 + S - 1}")
                (d / CELL_FILE).unlink(missing_ok=True)
                r = s2.run(d, scenario_names, seeds=S, policy_dir=str(pdir), size=s.size,
                           nominate_by=s.nominate_by, budget=s.budget, seed0=s0,
                           learner_seed=j, grid_cache=grid_cache, hindsight=False,
                           hardware=s.hardware,
                           tighten=s.tighten if s.budget is not None else None,
                           log=lambda m: log("    " + m))
                write_json(d / CELL_FILE, key, allow_nan=False)
            per_pol.append(r)
            cell_meta.append({**pol_records[i], "policy_index": i, "learner_seed": j,
                              "eval_seed_range": r["meta"]["eval_seed_range"],
                              "stage2_json": str((d / "stage2.json").relative_to(out))})
        cells.append(per_pol)
    return cells, cell_meta, pol_records


def _meta(s: Settings, S: int, resamples: int, pol_records: dict, cell_meta: list,
          P: int) -> dict:
    """``pooled.json``'s ``meta`` (before ``wall_s``)."""
    return {"synthetic": True,
            "policies": [pol_records[i]["policy"] for i in range(P)],
            "policy_sha256": [pol_records[i]["policy_sha256"] for i in range(P)],
            "learner_seeds": int(s.learner_seeds), "eval_seeds_per_cell": S, "size": s.size,
            "budget": s.budget, "tighten": s.tighten, "seed0": int(s.seed0),
            "trace_seed": int(s.trace_seed), "problems": int(s.problems),
            "nominate_by": s.nominate_by, "resamples": resamples,
            "hardware": s.hardware,
            # the text committed pooled.json files carry (the function is now
            # prada_jax.stats.hierarchical_interval); kept so reruns match them
            "interval": "union of the nested bootstrap (policies → learner seeds "
                        "→ eval seeds, percentile) and the Student-t interval over "
                        "policy means (evals.stage2.hier), 95 %",  # the report's text of that time
            "cells": cell_meta}


def report_only(out) -> dict:
    """Recomputes ``out/pooled.json``'s scenarios (claims, verdict, per-seed values) and
    ``pooled.md`` from the cells' committed ``stage2.json`` (``meta.cells``), keeping its
    ``meta``; nothing is trained or evaluated. ``BadInput`` naming a missing file."""
    out = Path(out)
    f = out / "pooled.json"
    try:
        old = json.loads(f.read_text())
        m = old["meta"]
        grid = {(c["policy_index"], c["learner_seed"]): out / c["stage2_json"]
                for c in m["cells"]}
        P, L = len(m["policies"]), int(m["learner_seeds"])
        cells = [[json.loads(grid[(i, j)].read_text()) for j in range(L)] for i in range(P)]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"--out={out}: cannot read the pooled records ({e})") from None
    result = {"meta": m, "scenarios": {}}
    for name in old["scenarios"]:
        rep = judge_scenario(cells, name, m["budget"], int(m["resamples"]))
        rep["per_seed"] = {row: {k: stack(cells, name, row, k).tolist()
                                 for k in ("objective", "server_util")}
                           for row in cells[0][0]["scenarios"][name]["per_seed"]}
        result["scenarios"][name] = rep
    write_json(f, result, allow_nan=False)
    (out / "pooled.md").write_text(to_markdown(result))
    return result


def _iv(c: dict | None) -> str:
    if not c:
        return "n/a"
    return f"{c['mean']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]"


def to_markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"Pooled stage-2 verdict on SYNTHETIC gsm8k traces: {len(m['policies'])} policy "
             f"samples × {m['learner_seeds']} learner seeds × {m['eval_seeds_per_cell']} test "
             f"seeds per cell (disjoint), size {m['size']}. Intervals: {m['interval']}."]
    for name, sc in result["scenarios"].items():
        pw = sc["power"]
        lines += ["", f"### {name}", "", f"gate: {pw['gate']}", "",
                  "| claim (objective, a − b) | pooled mean [95 % interval] | bootstrap | "
                  "cluster t | " + " | ".join(f"policy {i}" for i in range(len(sc['per_policy'])))
                  + " |", "|---|---|---|---|" + "---|" * len(sc["per_policy"])]
        for cl, iv in sc["claims"].items():
            lines.append(f"| {cl} | {_iv(iv)} | [{iv['bootstrap']['lo']:+.4f}, "
                         f"{iv['bootstrap']['hi']:+.4f}] | [{iv['cluster_t']['lo']:+.4f}, "
                         f"{iv['cluster_t']['hi']:+.4f}] | " + " | ".join(
                             _iv(pp["claims"].get(cl)) for pp in sc["per_policy"]) + " |")
        lines.append("\nverdict: " + ", ".join(f"{k} **{v}**" for k, v in sc["verdict"].items()))
        bd = sc.get("budget")
        if bd:
            lines.append(f"\nbudget cap {bd['cap']:g} (limit {bd['limit']:.4f}): learned "
                         "occupancy per policy " + ", ".join(
                             f"{v:.3f}" for v in bd["learned_mean_per_policy"])
                         + f"; share of test seeds above the limit "
                         f"{100 * bd['exceed_share_all_seeds']:.0f} %; margins "
                         + "; ".join(str(pp["occupancy"].get("margins"))
                                     for pp in sc["per_policy"]))
        for i, pp in enumerate(sc["per_policy"]):
            lm = "; ".join(f"seed {x['learner_seed']}: λ_s="
                           f"{x['multipliers']['learned_constant']['lambda_s']:.4g}, µ="
                           f"{x['multipliers']['learned_constant']['mu_per_mhz']:.4g}/MHz"
                           for x in pp["learned"] if x.get("multipliers"))
            gb = pp["learned"][0].get("grid_best") or {}
            lo = pp.get("learned_occupancy") or {}
            occ = (f"; learned constant's test occupancy {lo['mean']:.3f} (per learner seed "
                   + ", ".join(f"{v:.3f}" for v in lo["per_cell"]) + ")") if lo else ""
            lines.append(f"\npolicy {i}: learned {lm}; grid best λ_s={gb.get('lambda_s')}, "
                         f"µ={gb.get('mu_per_mhz')}/MHz{occ}")
    return "\n".join(lines) + "\n"
