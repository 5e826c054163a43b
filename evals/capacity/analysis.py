"""Capacity analysis (the rules ``studies/capacity/README.md`` registers): capacities,
capacity multipliers with nested-bootstrap and cluster-t intervals, the gate, the targets,
the SLO sweep, the objective curve and the report.

Input per pair: the reference run (LLM alone, lightest rate, validation), the fitted prices
and the test grid ``{rate: {row: {metric: [S]}}}`` (``evals.capacity.measure``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np

from evals import capacity as cap
from evals import plots, report
from evals.stage2 import hier
from evals.capacity.measure import ALL_SLM, FITTED, LLM_ALONE, RSD, ZERO, sample_row

#: The registered SLO (README) and the sweep beside it.
LATENCY_SCALE, RETENTION = 2.0, 0.95
SWEEP_SCALES = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
SWEEP_RETENTIONS = (0.85, 0.9, 0.95, 0.975, 1.0)
#: PRADA (fitted prices) may be below All-SLM by at most this much objective at any rate.
ALL_SLM_MARGIN = 0.01
BASELINES = (LLM_ALONE, ALL_SLM, RSD)


def _grid(test: Mapping) -> dict[float, dict]:
    return {float(r): rows for r, rows in test.items()}


def _samples(test: Mapping) -> list[int]:
    rows = next(iter(test.values()))
    return sorted(int(r.rsplit("#", 1)[1]) for r in rows if r.startswith(FITTED + " #"))


def capacities(test: Mapping, slo: cap.SLO) -> dict:
    """``{row: capacity dict}`` for the baselines and each sample's PRADA rows."""
    g = _grid(test)
    rows = list(next(iter(g.values())))
    return {r: cap.capacity(g, r, slo) for r in rows}


def multiplier(caps: Mapping, samples: list[int], ref: str, num: str = FITTED) -> dict:
    """m = mean over (sample, seed) of c_num(p, s) / c_ref(s) with both intervals
    (``evals.stage2.hier.interval``) and the registered reading."""
    c_num = np.array([caps[sample_row(num, k)]["per_seed"] for k in samples])
    x, dropped = cap.ratio_cells(c_num, np.array(caps[ref]["per_seed"]))
    if np.all(np.isnan(x)):
        return {"reference": ref, "mean": None, "lo": None, "hi": None, "dropped_seeds": dropped,
                "reading": f"undefined ({ref}'s capacity is 0 on every seed)"}
    iv = hier.interval(x)
    return {"reference": ref, "mean": iv["mean"], "lo": iv["lo"], "hi": iv["hi"],
            "bootstrap": [iv["bootstrap"]["lo"], iv["bootstrap"]["hi"]],
            "cluster_t": [iv["cluster_t"]["lo"], iv["cluster_t"]["hi"]],
            "policy_means": iv["policy_means"], "dropped_seeds": dropped,
            "reading": cap.reading(iv)}


def gate(test: Mapping, caps: Mapping, samples: list[int]) -> dict:
    """The registered gate: contention (the LLM alone's capacity is below the grid's top on
    every seed) and learning (each sample's PRADA λ=µ=0 objective above All-SLM's at the
    lightest rate)."""
    g = _grid(test)
    top = max(g)
    light = g[min(g)]
    contended = all(c < top for c in caps[LLM_ALONE]["per_seed"])
    slm = float(np.nanmean(light[ALL_SLM]["objective"]))
    learns = {str(k): float(np.nanmean(light[sample_row(ZERO, k)]["objective"])) - slm
              for k in samples}
    ok = contended and all(v > 0 for v in learns.values())
    return {"contended": contended, "llm_alone_per_seed": caps[LLM_ALONE]["per_seed"],
            "learns_objective_over_all_slm": learns,
            "passed": ok}


def targets(test: Mapping, samples: list[int]) -> dict:
    """Per rate: PRADA (fitted) − All-SLM objective (mean over samples × seeds; target
    ≥ −0.01), and, where λ=µ=0 is unstable on some seed of some sample, fitted − λ=µ=0 with
    both intervals."""
    g = _grid(test)
    out = {}
    for r in sorted(g):
        pt = g[r]
        slm = np.asarray(pt[ALL_SLM]["objective"])
        fit = np.array([pt[sample_row(FITTED, k)]["objective"] for k in samples])
        zero = np.array([pt[sample_row(ZERO, k)]["objective"] for k in samples])
        d_slm = float(np.nanmean(fit - slm[None, :]))
        unstable_zero = any(not report.stable(report.summarize(
            {"z": pt[sample_row(ZERO, k)]})["z"]) for k in samples)
        entry = {"fitted_minus_all_slm": d_slm, "meets": d_slm >= -ALL_SLM_MARGIN,
                 "zero_unstable": unstable_zero}
        if unstable_zero:
            iv = hier.interval((fit - zero)[:, None, :])
            entry["fitted_minus_zero"] = {"mean": iv["mean"], "lo": iv["lo"], "hi": iv["hi"]}
        out[f"{r:g}"] = entry
    return out


def sweep(test: Mapping, ref: Mapping, samples: list[int]) -> dict:
    """Capacity against the SLO sweep: baselines, and PRADA (fitted) per sample."""
    g = _grid(test)
    rows = list(BASELINES) + [sample_row(FITTED, k) for k in samples] \
        + [sample_row(ZERO, k) for k in samples]
    return {r: cap.sweep(g, r, ref, SWEEP_SCALES, SWEEP_RETENTIONS, LATENCY_SCALE, RETENTION)
            for r in rows}


def pooled_capacity(caps: Mapping, name: str, samples: list[int]) -> dict:
    vals = [caps[sample_row(name, k)]["capacity"] for k in samples]
    return {"median": float(np.median(vals)), "min": float(min(vals)), "max": float(max(vals)),
            "per_sample": vals,
            "binds": [caps[sample_row(name, k)]["binds"] for k in samples]}


def crossover(test: Mapping, samples: list[int]) -> dict:
    """First rate where PRADA (fitted, pooled over samples) beats the LLM alone's objective
    (both intervals' low > 0) with every sample's row and the LLM alone stable on every
    seed."""
    g = _grid(test)
    skipped, found = [], None
    for r in sorted(g):
        pt = g[r]
        rows = [LLM_ALONE] + [sample_row(FITTED, k) for k in samples]
        summ = report.summarize({n: pt[n] for n in rows})
        if not all(report.stable(summ[n]) for n in rows):
            skipped.append(r)
            continue
        d = np.array([pt[sample_row(FITTED, k)]["objective"] for k in samples]) \
            - np.asarray(pt[LLM_ALONE]["objective"])[None, :]
        iv = hier.interval(d[:, None, :])
        if found is None and iv["lo"] > 0:
            found = r
    return {"rate": found, "unstable_rates": skipped}


def analyse(pair_data: Mapping) -> dict:
    """Every registered quantity of one pair from ``{"reference", "prices", "test"}``."""
    ref, test = pair_data["reference"], pair_data["test"]
    slo = cap.slo_from_reference(ref, LATENCY_SCALE, RETENTION)
    samples = _samples(test)
    caps = capacities(test, slo)
    return {"slo": slo._asdict(), "samples": samples, "capacities": caps,
            "headline": {**{r: caps[r]["capacity"] for r in BASELINES},
                         FITTED: pooled_capacity(caps, FITTED, samples),
                         ZERO: pooled_capacity(caps, ZERO, samples)},
            "multipliers": {LLM_ALONE: multiplier(caps, samples, LLM_ALONE),
                            RSD: multiplier(caps, samples, RSD)},
            "gate": gate(test, caps, samples), "targets": targets(test, samples),
            "sweep": sweep(test, ref, samples), "crossover": crossover(test, samples),
            "rates": sorted(float(r) for r in test)}


def _c(v: float, top: float) -> str:
    return f"≥ {v:g}" if v >= top else f"{v:g}"


def headline_table(results: Mapping[str, Mapping]) -> str:
    """Markdown: capacity [users/s per GPU] per row and pair, and the multipliers."""
    pairs = list(results)
    lines = ["| row | " + " | ".join(pairs) + " |", "|---|" + "---:|" * len(pairs)]
    for row in BASELINES + (FITTED, ZERO):
        cells = []
        for p in pairs:
            a = results[p]
            top = a["rates"][-1]
            h = a["headline"][row]
            if isinstance(h, dict):
                cells.append(f"{_c(h['median'], top)} [{_c(h['min'], top)}, "
                             f"{_c(h['max'], top)}]")
            else:
                cells.append(_c(h, top))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    for ref in (LLM_ALONE, RSD):
        cells = []
        for p in pairs:
            m = results[p]["multipliers"][ref]
            cells.append("—" if m["mean"] is None else
                         f"{m['mean']:.2f} [{m['lo']:.2f}, {m['hi']:.2f}] {m['reading']}")
        lines.append(f"| PRADA (fitted) / {ref} | " + " | ".join(cells) + " |")
    slo = [f"L {results[p]['slo']['latency_p90_s']:.2f} s, A {results[p]['slo']['accuracy']:.3f}"
           for p in pairs]
    lines.append("| SLO (p90 latency, accuracy) | " + " | ".join(slo) + " |")
    return "\n".join(lines)


def to_markdown(results: Mapping[str, Mapping], meta: Mapping) -> str:
    out = ["# Capacity per server GPU under an SLO (issue 42) — SYNTHETIC gsm8k", "",
           "Registration: studies/capacity/README.md. Capacity in users/s per server GPU "
           "(the largest grid rate met on every seed); PRADA rows: median [min, max] over "
           f"{len(meta['samples'])} policy samples; multipliers: mean over samples × seeds with "
           "the union of the nested-bootstrap and cluster-t 95 % intervals. Sizes: "
           f"{meta['sizes']}.", "", headline_table(results), ""]
    for p, a in results.items():
        out += [f"## {p}", "",
                f"* gate: {'passed' if a['gate']['passed'] else 'NOT passed'} (contended: "
                f"{a['gate']['contended']}; PRADA λ=µ=0 − All-SLM objective at the lightest "
                f"rate per sample: " + ", ".join(f"#{k} {v:+.3f}" for k, v in
                                                 a['gate']['learns_objective_over_all_slm']
                                                 .items()) + ")",
                "* what binds first (per seed): " + "; ".join(
                    f"{r}: {sorted(set(str(b) for b in a['capacities'][r]['binds']))}"
                    for r in BASELINES),
                "* PRADA (fitted) ≥ All-SLM − 0.01 at every rate: "
                f"{all(t['meets'] for t in a['targets'].values())} (worst "
                f"{min(t['fitted_minus_all_slm'] for t in a['targets'].values()):+.3f})",
                f"* objective crossover vs the LLM alone (stable rates only): "
                f"{a['crossover']['rate']} (rates skipped as unstable: "
                f"{a['crossover']['unstable_rates']})", ""]
    return "\n".join(out) + "\n"


def plot(results: Mapping[str, Mapping], path: Path) -> Path:
    """Capacity against the SLO sweep (latency scale; accuracy retention), one line per row
    and pair (PRADA: the median over samples)."""
    import matplotlib  # lazy: plotting only when a report is written
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    styles = ["-", "--", ":"]
    for i, (p, a) in enumerate(results.items()):
        sw, samples = a["sweep"], a["samples"]
        for j, row in enumerate(BASELINES + (FITTED,)):
            for ax, axis in zip(axes, ("latency_scale", "retention")):
                if row == FITTED:
                    ys = np.median([[v for v in sw[sample_row(FITTED, k)][axis].values()]
                                    for k in samples], axis=0)
                else:
                    ys = list(sw[row][axis].values())
                xs = [float(x) for x in sw[row if row != FITTED else
                                           sample_row(FITTED, samples[0])][axis]]
                ax.plot(xs, ys, styles[i % 3], marker="o", ms=3, color=f"C{j}",
                        label=f"{row} [{p}]")
    axes[0].set_xlabel("latency SLO: p90 ≤ scale × LLM alone's light-load p90")
    axes[1].set_xlabel("accuracy SLO: ≥ retention × LLM alone's light-load accuracy")
    for ax in axes:
        ax.set_ylabel("capacity (users/s per GPU)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    fig.suptitle("Capacity under an SLO sweep (SYNTHETIC gsm8k, test split); registered: "
                 f"scale {LATENCY_SCALE:g}, retention {RETENTION:g}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def curve_plot(results: Mapping[str, Mapping], tests: Mapping[str, Mapping], path: Path
               ) -> Path:
    """The second view: objective, accuracy, p90 latency and ρ against the rate per GPU
    (default pair: the first), mean over seeds (PRADA: over samples × seeds)."""
    p = next(iter(results))
    g, samples = _grid(tests[p]), results[p]["samples"]
    rates = sorted(g)
    panels = {}
    for m, label in (("objective", "objective (acc − β·latency)"), ("accuracy", "accuracy"),
                     ("latency_p90_s", "p90 latency (s)"), ("rho", "offered server load ρ")):
        panels[label] = {}
        for row in BASELINES + (FITTED, ZERO):
            names = [row] if row in BASELINES else [sample_row(row, k) for k in samples]
            mean, lo, hi = [], [], []
            for r in rates:
                v = np.array([g[r][n][m] for n in names], np.float64).ravel()
                mu, sd = float(np.nanmean(v)), float(np.nanstd(v))
                mean.append(mu)
                lo.append(mu - 1.96 * sd / math.sqrt(max(v.size, 1)))
                hi.append(mu + 1.96 * sd / math.sqrt(max(v.size, 1)))
            panels[label][row] = (mean, lo, hi)
    return plots.plot_panels(rates, panels, xlabel="arrival rate λ (users/s per server GPU)",
                             title=f"Objective curve, {p} (SYNTHETIC gsm8k, test)", path=path,
                             hlines={"offered server load ρ": 1.0}, ncols=2)
