"""The load curve (docs/design.md §8, the headline): latency (mean, p95), accuracy, objective,
goodput and offered server load ρ of the server LLM alone, All-SLM, RSD and PRADA against load,
with the crossover.

**Load** = λ / M: arrivals per second per server sequence slot (M is the number of sequences
the server runs at once; λ the Poisson arrival rate in users/s). The curve varies λ at fixed M,
U, B; every point is measured by ``evals.evaluate``'s rule (empty start, the cohort arriving in
the window, blocked and timed-out users at accuracy 0 and the timeout, ρ, flags).

**One evaluation.** Every (row, load) point of one hardware pair runs in ONE jitted, vmapped
call (``make_curve_fn``): the row's scheduler, screening mode, multipliers, the LLM-alone
switches and λ are array leaves of the env params, so the whole curve compiles once (per pair
kind: the paper clock and the roofline clock are different programs).

**Crossover** (``crossover``): the first load, in increasing order, at which PRADA's objective
exceeds the server LLM alone's with a paired 95 % CI (Student t over seeds, the same seeds
for both rows) whose lower bound is > 0, counting only loads where **both rows are stable on
every seed** (``evals.report.stable``: ρ < 1 and no ``U binds`` on any seed); an unstable
row's objective is shown but never makes a crossover. Needs at least ``MIN_CROSSOVER_SEEDS`` (8) seeds;
with fewer it is reported as undetermined. "None in the range tried" when no load qualifies.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from envs import edge
from evals import evaluate as ev
from evals import plots, report, suite
from prada_jax import stats
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from prada_jax.metric_writer import MetricWriter

LLM_ALONE = suite.ALL_LLM   # the paper's baseline: the server LLM alone
PRADA = "PRADA"
#: Metrics drawn (panel label) in this order.
CURVE_METRICS = {"latency_mean_s": "mean latency (s)", "latency_p95_s": "p95 latency (s)",
                 "accuracy": "accuracy", "objective": "objective (acc − β·latency)",
                 "goodput_hz": "goodput (correct / s)", "rho": "offered server load ρ"}
MIN_CROSSOVER_SEEDS = 8
LOAD_LABEL = "load λ/M (arrivals / s per server sequence slot)"
#: Env param leaves a curve point sets (the rest are shared by every point).
_VARYING = ("arrival_rate_hz", "scheduler", "lambda_s", "mu", "num_servers", "bandwidth_hz",
            "llm_only", "server_kv_cache", "max_wait_slots")


def curve_rows(multipliers: tuple[float, float] | None) -> list[ev.PolicySpec]:
    """The curve's rows: the server LLM alone, All-SLM, RSD and PRADA (the learned multipliers;
    None: λ_s = µ = 0, named ``PRADA (λ=µ=0)``)."""
    rows = [ev.PolicySpec(LLM_ALONE, "always", "offload_all"),
            ev.PolicySpec("All-SLM", "never", "keep_local"),
            ev.PolicySpec("RSD (online PRM)", "always", "rsd")]
    if multipliers is None:
        rows.append(ev.PolicySpec("PRADA (λ=µ=0)", "policy", "threshold"))
    else:
        rows.append(ev.PolicySpec(PRADA, "policy", "threshold", float(multipliers[0]),
                                  float(multipliers[1])))
    return rows


def point_params(base: edge.EnvParams, spec: ev.PolicySpec, load: float) -> dict:
    """The varying leaves (and screening inputs) of one (row, load) point: λ = load · M."""
    over = dict(suite.LLM_ONLY_OVERRIDES) if spec.name == LLM_ALONE else {}
    over["arrival_rate_hz"] = float(load) * float(base.num_servers)
    p = base.replace(**{k: jnp.asarray(v, getattr(base, k).dtype) for k, v in over.items()})
    p = ev.apply_spec(p, spec)
    out = {k: jnp.asarray(getattr(p, k)) for k in _VARYING}
    out["screen"] = ev.screen_mode(spec.screen)
    out["p_random"] = jnp.asarray(spec.p_random, jnp.float32)
    return out


def make_curve_fn(evaluate_fn: Callable) -> Callable:
    """``curve(keys [S], base_params, net_params, points) -> totals [P, S, ...]``, jitted:
    ``points`` is a dict of [P] arrays (``point_params`` stacked); each point replaces its
    leaves of ``base_params`` and runs ``evaluate_fn`` (``evals.evaluate.make_evaluator``'s)
    over the seeds. One compilation for all P points."""

    def curve(keys, base, net_params, points):
        def one(v):
            p = base.replace(**{k: v[k] for k in _VARYING})
            return evaluate_fn(keys, p, net_params, v["screen"], v["p_random"], None)

        return jax.vmap(one)(points)

    return jax.jit(curve)


def run_curve(evaluator: ev.Evaluator, rows: Sequence[ev.PolicySpec], loads: Sequence[float],
              curve_fn: Callable | None = None) -> dict[float, dict[str, dict[str, np.ndarray]]]:
    """``{load: {row: {metric: [S]}}}`` of every (row, load) point in one call of
    ``make_curve_fn(evaluator.evaluate_fn)`` (or ``curve_fn``)."""
    for r in rows:
        if r.screen == "policy" and not evaluator.has_policy:
            raise ValueError(f"row '{r.name}' needs a screening policy")
    base = evaluator.base_params
    pts = [(load, r) for load in loads for r in rows]
    points = jax.tree.map(lambda *a: jnp.stack(a), *[point_params(base, r, x) for x, r in pts])
    fn = curve_fn or make_curve_fn(evaluator.evaluate_fn)
    totals = jax.device_get(fn(evaluator.keys, base, evaluator.net_params, points))
    out: dict[float, dict[str, dict[str, np.ndarray]]] = {}
    for i, (load, r) in enumerate(pts):
        out.setdefault(float(load), {})[r.name] = evaluator.metrics(
            {k: v[i] for k, v in totals.items()}, base)
    return out


def crossover(results: Mapping[float, Mapping[str, Mapping[str, np.ndarray]]],
              policy: str = PRADA, reference: str = LLM_ALONE,
              min_seeds: int = MIN_CROSSOVER_SEEDS) -> dict[str, Any]:
    """The first load where ``policy``'s objective beats ``reference``'s with a paired 95 % CI
    > 0 (module docstring). Returns ``{"load": float | None, "status": "found" | "none in the
    range tried" | "undetermined (fewer than 8 seeds)" | "rows missing", "diffs": {load:
    MeanCI dict}, "unstable_loads": [loads skipped: a row unstable on some seed]}``."""
    loads = sorted(results)
    if not loads or any(policy not in results[x] or reference not in results[x] for x in loads):
        return {"load": None, "status": "rows missing", "policy": policy,
                "reference": reference, "diffs": {}}
    diffs, found, skipped = {}, None, []
    n_seeds = len(np.asarray(results[loads[0]][policy]["objective"]))
    for x in loads:
        d = stats.mean_ci(np.asarray(results[x][policy]["objective"])
                          - np.asarray(results[x][reference]["objective"]))
        diffs[x] = d
        summ = report.summarize({r: results[x][r] for r in (policy, reference)})
        if not all(report.stable(summ[r]) for r in (policy, reference)):
            skipped.append(x)
            continue
        if found is None and math.isfinite(d.low) and d.low > 0:
            found = x
    if n_seeds < min_seeds:
        status, found = f"undetermined (fewer than {min_seeds} seeds)", None
    else:
        status = "found" if found is not None else "none in the range tried"
    return {"load": found, "status": status, "policy": policy, "reference": reference,
            "seeds": n_seeds, "diffs": {str(x): d.to_json_dict() for x, d in diffs.items()},
            "unstable_loads": skipped}


def summarize_curve(results) -> dict[float, dict[str, dict[str, stats.MeanCI]]]:
    return {x: report.summarize(per_seed) for x, per_seed in results.items()}


def _band(summ, row: str, metric: str, loads: Sequence[float]):
    nan = float("nan")
    cis = [summ[x][row][metric] if not report.withheld(summ[x][row], metric)
           else stats.MeanCI(nan, nan, nan, nan, 0) for x in loads]
    return [c.mean for c in cis], [c.low for c in cis], [c.high for c in cis]


def crossover_text(pair: str, cx: Mapping[str, Any]) -> str:
    if cx["status"] == "found":
        return (f"[{pair}] crossover: {cx['policy']} beats {cx['reference']} on the objective "
                f"(paired 95% CI > 0) from load {cx['load']:g}/s per server sequence slot")
    return f"[{pair}] crossover: {cx['status']}"


def table_text(summ, loads: Sequence[float], pair: str) -> str:
    """One line per (load, row): objective, accuracy, mean / p95 latency (or ``unstable``),
    goodput, ρ and flags."""
    lines = [f"[{pair}] load  row  objective  accuracy  lat mean s  lat p95 s  goodput/s  ρ  "
             "flags"]
    for x in loads:
        for r, row in summ[x].items():
            fl = report.row_flags(row)
            lat = ("unstable" if report.UNSTABLE in fl else row["latency_mean_s"].fmt(2))
            p95 = ("unstable" if report.UNSTABLE in fl else row["latency_p95_s"].fmt(2))
            lines.append(f"  {x:g}  {r}  {row['objective'].fmt(3)}  {row['accuracy'].fmt(3)}  "
                         f"{lat}  {p95}  {row['goodput_hz'].fmt(2)}  {row['rho'].fmt(2)}  "
                         f"{', '.join(fl) or '-'}")
    return "\n".join(lines)


def results_from_json(data: Mapping, pair: str) -> dict[float, dict[str, dict[str, np.ndarray]]]:
    """The per-seed results of one pair back from a ``curve.json`` (``write_curve_outputs``'s
    ``data``): ``{load: {row: {metric: [S]}}}``, withheld latencies from their censored
    per-seed values (so the outputs can be redrawn without rerunning)."""
    out = {}
    for x, point in data["pairs"][pair]["points"].items():
        out[float(x)] = {
            row: {m: np.asarray([np.nan if v is None else v for v in
                                 (d.get("per_seed") if "per_seed" in d
                                  else d["per_seed_censored"])], np.float64)
                  for m, d in metrics.items()}
            for row, metrics in point["policies"].items()}
    return out


def pair_tags(pairs: Sequence[str]) -> dict[str, str]:
    """The name each hardware pair goes by in file names and TensorBoard tags: a
    ``latency.PAIRS`` name as it is, a pair file by its stem with anything but letters,
    digits, ``-``, ``_`` and ``.`` replaced by ``_`` (``--pairs=a/../../x.json`` draws
    ``curve_x.png`` inside the output folder, never a path under or outside it). ``BadInput``
    naming ``--pairs`` when two pairs would share a name."""
    tags: dict[str, str] = {}
    for pair in pairs:
        stem = Path(pair).stem if pair.endswith(".json") else pair
        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip(".") or "pair"
        clash = [p for p, t in tags.items() if t == tag]
        if clash:
            raise BadInput(f"--pairs: {clash[0]} and {pair} would both be drawn as "
                           f"curve_{tag}.png; rename one of the files")
        tags[pair] = tag
    return tags


def write_curve_outputs(results_by_pair: Mapping[str, Mapping], out_dir: Path, *, title: str,
                        meta: dict) -> dict:
    """``curve.json`` (per pair: every load, row and metric with its summary and per-seed
    values, flags, the crossover), ``curve_<tag>.png`` (``pair_tags``), ``curve.txt`` and
    TensorBoard (step = load index) under ``out_dir``. Rerun into a folder that holds an
    earlier curve, the new TensorBoard file starts with a restart mark at step 0, so the
    reader drops the earlier points instead of showing each point twice."""
    out_dir = Path(out_dir)
    tags = pair_tags(list(results_by_pair))
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "load_definition": LOAD_LABEL, "pairs": {}}
    figs, lines = {}, []
    rerun = any((out_dir / "tb").glob("events.out.tfevents.*"))
    with MetricWriter(out_dir / "tb") as w:
        if rerun:
            w.mark_restart(-1)   # a START event at step 0: earlier points are dropped
        for pair, results in results_by_pair.items():
            tag = tags[pair]
            loads = sorted(results)
            summ = summarize_curve(results)
            rows = list(next(iter(summ.values())))
            pol = next((r for r in rows if r.startswith("PRADA")), PRADA)
            cx = crossover(results, policy=pol)
            panels = {label: {r: _band(summ, r, m, loads) for r in rows}
                      for m, label in CURVE_METRICS.items()}
            figs[pair] = plots.plot_panels(
                loads, panels, xlabel="load λ/M (arrivals/s per server slot)",
                title=f"{title} — hardware pair {pair}; {crossover_text(pair, cx)}",
                path=out_dir / f"curve_{tag}.png", vline=cx["load"],
                vline_label="crossover" if cx["load"] is not None else "",
                hlines={CURVE_METRICS["rho"]: 1.0})
            lines += [table_text(summ, loads, pair), crossover_text(pair, cx)]
            data["pairs"][pair] = {
                "loads": loads, "crossover": cx,
                "points": {str(x): report.to_json_dict(results[x], summ[x]) for x in loads}}
            for i, x in enumerate(loads):
                w.write_scalars(i, report.tb_scalars(summ[x], prefix=f"curve_{tag}"))
                w.write_scalars(i, {f"curve_{tag}/load": float(x)})
        w.write_texts(0, {"curve/table": "```\n" + "\n".join(lines) + "\n```"})
        w.write_images(0, {f"curve/{tags[k]}": plots.png_to_rgb(p) for k, p in figs.items()})
    write_json(out_dir / "curve.json", data)
    (out_dir / "curve.txt").write_text("\n".join(lines) + "\n")
    return {"figures": figs, "lines": lines, "json": out_dir / "curve.json",
            "tb": out_dir / "tb", "crossovers": {p: d["crossover"]
                                                  for p, d in data["pairs"].items()}}
