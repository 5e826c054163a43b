"""Resource sweeps: ``python -m evals.sweep --policy=PPO_WORKDIR [--dual=DUAL_WORKDIR]
--traces=DIR_OR_PRESET --out=DIR [--m_grid=1,2,3,4,6,8] [--b_grid_mhz=...] [--lam_grid=...]``.

For each of server capacity M, total bandwidth B and arrival rate λ (one varied at a time, the
others at the scenario's values) evaluates the rows over seeds and draws the paper-style
figures (PNG): accuracy and mean latency against M, B and λ with 95% CI bands, and the three
delay components (processing / communication / queueing) stacked against M and B. The knee of
a row along M or B is the smallest grid value beyond which its mean latency improves by less
than 5% (``prada_jax.stats.find_knee``); it is marked on the figures and printed.

All sweep points share one compiled rollout (M, B, λ are array leaves of the env params).

``--dual`` multipliers are checked (``evals.suite.check_scenario``) against the sweep's base
scenario, the values of the axes when not swept: learned for another one they are refused with
one line naming both (exit 2) unless ``--allow_scenario_mismatch`` (then a warning). The swept
axis values differ from the learned scenario on purpose and are not checked.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from evals import evaluate as ev
from evals import plots, report, suite
from prada_jax import config_utils, stats
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from prada_jax.metric_writer import MetricWriter

AXES = {
    # axis -> (env param, label, display scale, unit)
    "M": ("num_servers", "server capacity M (parallel LLM jobs)", 1.0, ""),
    "B": ("bandwidth_hz", "total bandwidth B (MHz)", 1e-6, "MHz"),
    "lam": ("arrival_rate_hz", "arrival rate λ (users / s)", 1.0, "/s"),
}
DEFAULT_GRIDS = {"M": [1, 2, 3, 4, 6, 8], "B": [0.25e6, 0.5e6, 1e6, 2e6, 5e6, 10e6, 20e6],
                 "lam": [1.0, 2.0, 4.0, 8.0, 12.0]}
KNEE_TOL = 0.05


def sweep_rows(has_policy: bool, multipliers: tuple[float, float] | None) -> list[ev.PolicySpec]:
    """Rows drawn in the sweep: All-SLM, the paper's All-LLM (the server LLM alone), the
    draft-then-recompute row, RSD and the PRADA row(s) available."""
    rows = suite.baseline_rows()
    if has_policy:
        rows += [s for s in ev.policy_specs(*(multipliers or (None, None)))
                 if s.name.startswith("PRADA")]
    return rows


def run_sweep(evaluator: ev.Evaluator, rows: Sequence[ev.PolicySpec], axis: str,
              values: Sequence[float], progress: Callable[[str], None] | None = None
              ) -> dict[float, dict[str, dict[str, np.ndarray]]]:
    """``{grid value: {row: {metric: [S]}}}`` with the axis' env param set to each value."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {sorted(AXES)}, got {axis!r}")
    field = AXES[axis][0]
    out = {}
    for v in values:
        if progress:
            progress(f"sweep {axis} = {v:g}")
        v = int(v) if field == "num_servers" else float(v)
        out[v] = {r.name: suite.run_row(evaluator, r, **{field: v}) for r in rows}
    return out


def summarize_sweep(results: Mapping[float, Mapping[str, Mapping[str, np.ndarray]]]
                    ) -> dict[float, dict[str, dict[str, stats.MeanCI]]]:
    return {v: report.summarize(per_seed) for v, per_seed in results.items()}


def _band(summ, row: str, metric: str, grid: Sequence[float]):
    """(mean, low, high) over the grid; a withheld latency (an unstable point) is NaN."""
    nan = float("nan")
    cis = [summ[v][row][metric] if not report.withheld(summ[v][row], metric)
           else stats.MeanCI(nan, nan, nan, nan, 0) for v in grid]
    return ([c.mean for c in cis], [c.low for c in cis], [c.high for c in cis])


def knees(summ, axis: str, grid: Sequence[float], metric: str = "latency_mean_s",
          tol: float = KNEE_TOL) -> dict[str, float | None]:
    """Knee per row of the mean ``metric`` (lower is better) along the grid, over the grid
    points where the row is stable (ρ < 1; an unstable point reports no latency); None with
    fewer than two stable points."""
    rows = next(iter(summ.values())).keys()
    out = {}
    for r in rows:
        ok = [v for v in grid if not report.withheld(summ[v][r], metric)]
        out[r] = (stats.find_knee(ok, [summ[v][r][metric].mean for v in ok], tol)
                  if len(ok) >= 2 else None)
    return out


def unstable_text(axis: str, summ, grid: Sequence[float]) -> str:
    """One line: per row, the grid values where it is unstable (mean ρ ≥ 1)."""
    _, _, scale, unit = AXES[axis]
    rows = next(iter(summ.values())).keys()
    parts = []
    for r in rows:
        bad = [v for v in grid if report.UNSTABLE in report.row_flags(summ[v][r])]
        parts.append(f"{r}: {', '.join(f'{v * scale:g}{unit}' for v in bad) or 'none'}")
    return f"unstable (ρ ≥ 1, latency withheld) along {axis}: " + "; ".join(parts)


def main_row(rows: Sequence[str]) -> str:
    for name in ("PRADA", "PRADA (λ=µ=0)", "All-LLM"):
        if name in rows:
            return name
    return list(rows)[0]


def sweep_figures(summ, axis: str, grid: Sequence[float], out_dir: Path, *, title: str
                  ) -> tuple[dict[str, Path], dict[str, float | None]]:
    """Accuracy and latency curves (+ stacked delays for M and B) of one axis."""
    _, label, scale, _ = AXES[axis]
    grid = sorted(grid)
    xs = [g * scale for g in grid]
    rows = list(next(iter(summ.values())).keys())
    kn = knees(summ, axis, grid) if axis in ("M", "B") else {}
    main = main_row(rows)
    knee_x = kn.get(main)
    knee_disp = None if knee_x is None else knee_x * scale
    figs = {}
    acc = {r: _band(summ, r, "accuracy", grid) for r in rows}
    lat = {r: _band(summ, r, "latency_mean_s", grid) for r in rows}
    figs[f"accuracy_vs_{axis}"] = plots.plot_curves(
        xs, acc, xlabel=label, ylabel="accuracy", title=f"accuracy vs {axis} — {title}",
        path=out_dir / f"accuracy_vs_{axis}.png", knee=knee_disp, knee_label=f"{main} knee")
    figs[f"latency_vs_{axis}"] = plots.plot_curves(
        xs, lat, xlabel=label, ylabel="mean end-to-end latency (s)",
        title=f"latency vs {axis} — {title}", path=out_dir / f"latency_vs_{axis}.png",
        knee=knee_disp, knee_label=f"{main} knee")
    if axis == "lam":  # the U cap: arrivals that found every user slot full
        blk = {r: _band(summ, r, "blocked_rate", grid) for r in rows}
        figs["blocked_vs_lam"] = plots.plot_curves(
            xs, blk, xlabel=label, ylabel="blocked arrivals / arrivals",
            title=f"blocked arrivals vs λ — {title}", path=out_dir / "blocked_vs_lam.png")
    if axis in ("M", "B"):
        for r in [x for x in (main, "All-LLM") if x in rows]:
            comps = {"processing": _band(summ, r, "processing_s", grid),
                     "communication": _band(summ, r, "communication_s", grid),
                     "queueing": _band(summ, r, "queueing_s", grid)}
            k = kn.get(r)
            slug = report.tag_name(r)
            figs[f"delays_vs_{axis}_{slug}"] = plots.plot_stacked_delays(
                xs, comps, xlabel=label, title=f"{r}: delay components vs {axis} — {title}",
                path=out_dir / f"delays_vs_{axis}_{slug}.png", total=lat[r],
                knee=None if k is None else k * scale)
    return figs, kn


def sweep_csv(all_summ: Mapping[str, Mapping[float, Mapping]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["axis", "value", "policy", "metric", "mean", "ci_low", "ci_high",
                "ci_half_width", "n_seeds", "flags"])
    for axis, summ in all_summ.items():
        for v, rows in summ.items():
            for r, metrics in rows.items():
                fl = ";".join(report.row_flags(metrics))
                for m, ci in metrics.items():
                    if report.withheld(metrics, m):
                        w.writerow([axis, v, r, m, "", "", "", "", ci.n, fl])
                    else:
                        w.writerow([axis, v, r, m, ci.mean, ci.low, ci.high, ci.half_width,
                                    ci.n, fl])
    return buf.getvalue()


def blocked_text(summ, grid: Sequence[float]) -> str:
    """One line: each row's blocked-arrival share at the largest λ of the sweep (the U cap
    hides load beyond it)."""
    top = max(grid)
    parts = [f"{r}: {summ[top][r]['blocked_rate'].mean * 100:.1f}%"
             for r in summ[top] if "blocked_rate" in summ[top][r]]
    return f"blocked arrivals at λ = {top:g}/s (U cap): " + "; ".join(parts)


def knee_text(axis: str, kn: Mapping[str, float | None]) -> str:
    _, _, scale, unit = AXES[axis]
    parts = []
    for r, k in kn.items():
        parts.append(f"{r}: {'none in grid' if k is None else f'{k * scale:g}{unit}'}")
    return (f"knee in {axis} (smallest stable {axis} beyond which mean latency improves by < "
            f"{100 * KNEE_TOL:.0f}%): " + "; ".join(parts))


def write_sweep_outputs(results_by_axis: Mapping[str, Mapping], out_dir: Path, *, title: str,
                        meta: dict) -> dict:
    """Figures, sweep.json, sweep.csv, knees and TensorBoard of a finished sweep."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    all_summ, figs, all_knees, lines = {}, {}, {}, []
    for axis, results in results_by_axis.items():
        grid = sorted(results)
        summ = summarize_sweep(results)
        all_summ[axis] = summ
        f, kn = sweep_figures(summ, axis, grid, out_dir, title=title)
        figs.update(f)
        if kn:
            all_knees[axis] = {r: (None if k is None else float(k)) for r, k in kn.items()}
            lines.append(knee_text(axis, kn))
        lines.append(unstable_text(axis, summ, grid))
        if axis == "lam":
            lines.append(blocked_text(summ, grid))
    data = {"meta": meta, "knees": all_knees, "knee_tolerance": KNEE_TOL, "axes": {}}
    for axis, summ in all_summ.items():
        data["axes"][axis] = {
            "param": AXES[axis][0],
            "grid": sorted(summ),
            "results": {str(v): report.to_json_dict(results_by_axis[axis][v], rows)
                        for v, rows in summ.items()}}
    write_json(out_dir / "sweep.json", data)
    (out_dir / "sweep.csv").write_text(sweep_csv(all_summ))
    (out_dir / "knees.txt").write_text("\n".join(lines) + "\n")
    with MetricWriter(out_dir / "tb") as w:
        for axis, summ in all_summ.items():
            for i, v in enumerate(sorted(summ)):
                sc = report.tb_scalars(summ[v], prefix=f"sweep_{axis}")
                w.write_scalars(i, sc)
        w.write_texts(0, {"sweep/knees": "\n\n".join(lines),
                          "sweep/grids": "\n\n".join(f"{a}: {sorted(s)}"
                                                     for a, s in all_summ.items())})
        w.write_images(0, {f"sweep/{k}": plots.png_to_rgb(p) for k, p in figs.items()})
    return {"figures": figs, "knees": all_knees, "knee_lines": lines,
            "json": out_dir / "sweep.json", "csv": out_dir / "sweep.csv", "tb": out_dir / "tb"}


# ----------------------------------------------------------------------------- CLI



def parse_grid(values: Sequence[str], name: str, scale: float = 1.0, integer: bool = False
               ) -> list[float]:
    """Parses a grid flag; refuses non-numbers, non-positive values, values float32 cannot
    hold (inf, NaN, 1e39: the env computes in float32), integers (``integer``: an M grid)
    above ``suite.MAX_ENV_COUNT`` and duplicates."""
    out = []
    for s in values:
        try:
            v = float(s) * scale
        except ValueError:
            raise BadInput(f"--{name}: '{s}' is not a number") from None
        why = config_utils.float32_problem(v)
        if why:
            raise BadInput(f"--{name}: {s}: {why}")
        if not v > 0:
            raise BadInput(f"--{name}: values must be > 0, got {s}")
        if integer:
            if v != int(v):
                raise BadInput(f"--{name}: values must be integers, got {s}")
            v = int(v)
            if v > suite.MAX_ENV_COUNT:
                raise BadInput(f"--{name}: {s} is above the largest count an env takes "
                               f"({suite.MAX_ENV_COUNT})")
        out.append(v)
    if not out:
        raise BadInput(f"--{name}: empty grid")
    if len(set(out)) != len(out):
        raise BadInput(f"--{name}: duplicate values in {values}")
    return sorted(out)
