"""Stage-2 verdict, the report: row names, per-seed summaries (mean ± 95% CI, paired
differences, power, budget, schedule), the Markdown table and the written outputs."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from envs import scenarios
from evals import plots
from prada_jax import stats
from prada_jax.jsonio import write_json


ROW_CONST = "PRADA (learned, constant)"
ROW_COND = "PRADA (learned, conditioned)"
ROW_BEST = "Best constant (grid, validation)"
ROW_HINDSIGHT = "Best constant (hindsight grid on the evaluated seeds)"
ROW_ZERO = "PRADA (λ=µ=0)"
ROW_FIFO = "FIFO-greedy"
#: Ablation: the rule's value filter with a first-come repair (``sched.threshold_fifo``).
ROW_FILTER = "Value filter, FIFO order (λ=µ=0)"
ROW_NOLIM = "Policy (no limits)"
#: Every step drafted, nominated and recomputed on the server (``offload_all``): not the
#: paper's All-LLM (the server LLM alone, ``evals.suite.ALL_LLM``), so named as it runs.
ROW_LLM = "Draft then LLM (recompute)"
ROWS = (ROW_CONST, ROW_COND, ROW_BEST, ROW_HINDSIGHT, ROW_ZERO, ROW_FILTER, ROW_FIFO,
        ROW_NOLIM, ROW_LLM)
METRICS = ("accuracy", "latency_mean_s", "latency_p95_s", "objective", "server_util",
           "queue_len", "blocked_rate", "capacity_bound_share", "bandwidth_bound_share")
PAIRS = {"learned_minus_zero": (ROW_CONST, ROW_ZERO),
         "learned_minus_fifo": (ROW_CONST, ROW_FIFO),
         "learned_minus_best_constant": (ROW_CONST, ROW_BEST),
         "conditioned_minus_zero": (ROW_COND, ROW_ZERO),
         "conditioned_minus_fifo": (ROW_COND, ROW_FIFO),
         "conditioned_minus_best_constant": (ROW_COND, ROW_BEST),
         # headroom: what any price could gain over λ = µ = 0 (the policy with no resource
         # limits is an upper reference, not a bound of the rule)
         "headroom_nolimits_minus_zero": (ROW_NOLIM, ROW_ZERO),
         # ablation: PRADA (λ=µ=0) − FIFO = (filter − FIFO) + (rule − filter)
         "filter_minus_fifo": (ROW_FILTER, ROW_FIFO),
         "zero_minus_filter": (ROW_ZERO, ROW_FILTER)}
#: Power of the verdict (``prada_jax.stats.min_detectable_effect``): two-sided paired t-test at
#: 5%, 80% power, from the spread of the per-seed learned − λ=µ=0 objective differences.
MDE_ALPHA, MDE_POWER = 0.05, 0.8
#: Issue 23's pre-registered gate (studies/stage2_verdict/registration.md): a scenario can show a
#: price's value only with headroom ≥ this (objective units) and MDE ≤ headroom / 2.
MIN_HEADROOM = 0.02


# ----------------------------------------------------------------------------- statistics

def summarize_rows(per_seed: dict, metrics=METRICS) -> dict:
    """{row: {metric: {"mean", "ci95"}}} from per-seed values {row: {metric: [S]}}."""
    out = {}
    for row, m in per_seed.items():
        out[row] = {k: stats.mean_ci(m[k], 0.95).to_ci95_dict() for k in metrics if k in m}
    return out


def paired_differences(per_seed: dict, a: str, b: str, metrics=METRICS) -> dict:
    """{metric: {"mean", "ci95"}} of the per-seed difference ``a − b`` (paired seeds)."""
    return {k: stats.paired_diff_ci(per_seed[a][k], per_seed[b][k], 0.95).to_ci95_dict()
            for k in metrics if k in per_seed[a] and k in per_seed[b]}


def schedule_report(name: str, length: int, slots: int, warmup: int, num_servers: int) -> dict:
    """How the measured window ``[warmup, slots)`` covers preset ``name``'s schedule of
    ``length`` slots (slot t reads index t mod length): ``{"length", "window", "cycles"
    (window slots / length), "reduced_capacity_share" (share of window slots with
    M_t = floor(M·servers[t] + ½) < M), "note"}``."""
    sc = scenarios.preset(name, int(length))
    t = np.arange(int(warmup), int(slots))
    m_t = np.floor(int(num_servers) * np.asarray(sc.servers, np.float64)[t % int(length)] + 0.5)
    share = float(np.mean(m_t < int(num_servers))) if t.size else 0.0
    cycles = t.size / int(length)
    note = (f"slot t reads the schedule at t mod {int(length)}; the window [{int(warmup)}, "
            f"{int(slots)}) holds {cycles:.2f} schedule lengths, counted slot by slot as run; "
            f"{100 * share:.1f}% of its slots have M_t < M")
    return {"length": int(length), "window": [int(warmup), int(slots)], "cycles": cycles,
            "reduced_capacity_share": share, "note": note}


def power_report(per_seed: dict) -> dict:
    """Headroom and minimum detectable effect of one scenario (objective, PRM units).

    ``headroom``: mean over seeds of Policy (no limits) − PRADA (λ=µ=0). ``mde``: the minimum
    detectable effect of a paired comparison against λ=µ=0 at this seed count
    (``stats.paired_mde``: two-sided paired t at ``MDE_ALPHA``, power ``MDE_POWER``), planned
    with the larger per-seed spread of learned − λ=µ=0 and no limits − λ=µ=0 (the first alone is
    0 when the learned price is λ = µ = 0, which says nothing about power). ``resolvable``:
    headroom >= :data:`MIN_HEADROOM` and MDE <= headroom / 2 (the pre-registered gate: room
    for a price, and seeds that can show one taking at least half of it); ``note`` names the
    condition that fails, or says both hold."""
    out = {"alpha": MDE_ALPHA, "power": MDE_POWER, "test": "two-sided paired t over seeds",
           "seeds": None, "headroom": None, "mde": None, "resolvable": None, "note": ""}
    if ROW_NOLIM in per_seed and ROW_ZERO in per_seed:
        d = (np.asarray(per_seed[ROW_NOLIM]["objective"], np.float64)
             - np.asarray(per_seed[ROW_ZERO]["objective"], np.float64))
        out["headroom"] = stats.finite_or_none(float(np.nanmean(d)))
    mdes = [stats.paired_mde(per_seed[r]["objective"], per_seed[ROW_ZERO]["objective"],
                             MDE_ALPHA, MDE_POWER)
            for r in (ROW_CONST, ROW_NOLIM) if r in per_seed and ROW_ZERO in per_seed]
    mdes = [m for m in mdes if math.isfinite(m)]
    if mdes:
        out["seeds"] = int(np.size(per_seed[ROW_ZERO]["objective"]))
        out["mde"] = float(max(mdes))
    h, m = out["headroom"], out["mde"]
    if h is None or m is None:
        out["note"] = "headroom or MDE undefined (too few finite seeds)"
    else:
        out["resolvable"] = bool(h >= MIN_HEADROOM and m <= h / 2)
        if h <= 0:
            out["note"] = (f"no headroom by the no-limits reference ({h:+.4f}; it is not an "
                           "upper bound where offloading without limits is itself costly): "
                           "a price's value cannot be shown against it")
        elif h < MIN_HEADROOM:
            out["note"] = (f"cannot resolve a price's value: headroom {h:+.4f} < "
                           f"{MIN_HEADROOM} (no room for a price; MDE {m:.4f} "
                           f"{'<=' if m <= h / 2 else '>'} headroom/2 {h / 2:.4f})")
        elif not out["resolvable"]:
            out["note"] = (f"cannot resolve a price's value: MDE {m:.4f} > headroom/2 "
                           f"{h / 2:.4f} at {out['seeds']} seeds")
        else:
            out["note"] = (f"resolvable: headroom {h:+.4f} >= {MIN_HEADROOM} and MDE {m:.4f} "
                           f"<= headroom/2 {h / 2:.4f}")
    return out


#: A row meets the occupancy budget if its mean occupancy is within this share of the cap.
BUDGET_TOLERANCE = 0.02



def budget_report(per_seed: dict, budget: float) -> dict:
    """Every row's mean occupancy (server utilisation, busy units / M) against the cap (not
    Policy (no limits): its M is U):
    ``{"cap", "tolerance", "occupancy": {row: mean}, "meets": {row: occupancy <= cap·(1 +
    tolerance)}, "exceed_share": {row: share of seeds whose occupancy is above cap·(1 +
    tolerance)}}``."""
    occ = {r: stats.finite_or_none(float(np.nanmean(m["server_util"])))
           for r, m in per_seed.items() if "server_util" in m and r != ROW_NOLIM}
    limit = budget * (1 + BUDGET_TOLERANCE)
    over = {r: float(np.mean(~(np.asarray(per_seed[r]["server_util"], np.float64) <= limit)))
            for r in occ}
    return {"cap": float(budget), "tolerance": BUDGET_TOLERANCE, "occupancy": occ,
            "meets": {r: (v is not None and v <= limit) for r, v in occ.items()},
            "exceed_share": over}


def scenario_report(per_seed: dict) -> dict:
    rows = summarize_rows({r: per_seed[r] for r in ROWS if r in per_seed})
    paired = {name: paired_differences(per_seed, a, b) for name, (a, b) in PAIRS.items()
              if a in per_seed and b in per_seed}
    return {"rows": rows, "paired": paired, "power": power_report(per_seed)}


# ----------------------------------------------------------------------------- outputs

_SHOW = ("objective", "accuracy", "latency_mean_s", "latency_p95_s", "server_util", "queue_len",
         "blocked_rate", "capacity_bound_share", "bandwidth_bound_share")


def _fmt(d, digits=3):
    if d is None or d.get("mean") is None:
        return "n/a"
    if d.get("ci95") is None:
        return f"{d['mean']:.{digits}f}"
    return f"{d['mean']:.{digits}f} ± {d['ci95']:.{digits}f}"


def _range(r) -> str:
    return "n/a" if not r else f"{r[0]}..{r[1] - 1}"


def _num(v, digits=4) -> str:
    return "n/a" if v is None else f"{v:+.{digits}f}"


def to_markdown(result: dict) -> str:
    meta = result.get("meta", {})
    lines = [f"Stage-2 verdict on SYNTHETIC gsm8k traces: {meta.get('seeds')} seeds × "
             f"{meta.get('slots')} slots (first {meta.get('warmup_slots')} discarded), env "
             f"{meta.get('env')}, nominations by the policy's "
             f"{meta.get('nominate_by', 'actor')}; mean ± 95% CI half-width over seeds.",
             "",
             f"Rows on the {meta.get('split_label', meta.get('split', 'all'))}, evaluation "
             f"seeds {_range(meta.get('eval_seed_range'))}; multipliers learned and the grid "
             f"reference chosen on the {meta.get('choice_split', 'same')} split (seeds "
             f"{_range(meta.get('choice_seed_range'))}). The hindsight row picks its pair on the "
             "evaluated seeds themselves (optimistic). Power: two-sided paired t at 5%, 80% "
             "power; headroom = Policy (no limits) − PRADA (λ=µ=0)."]
    for name, sc in result["scenarios"].items():
        lines += ["", f"### {name}", "", "| row | " + " | ".join(_SHOW) + " |",
                  "|---|" + "---|" * len(_SHOW)]
        for row, m in sc["rows"].items():
            lines.append(f"| {row} | " + " | ".join(_fmt(m.get(k)) for k in _SHOW) + " |")
        lines += ["", "| paired difference (per seed) | objective | accuracy | latency_mean_s |",
                  "|---|---|---|---|"]
        for pair, m in sc["paired"].items():
            lines.append(f"| {pair} | {_fmt(m.get('objective'), 4)} | "
                         f"{_fmt(m.get('accuracy'), 4)} | {_fmt(m.get('latency_mean_s'), 3)} |")
        bd = sc.get("budget")
        if bd:
            lines.append(f"\noccupancy cap {bd['cap']:g} (met within "
                         f"{100 * bd['tolerance']:g}%): " + "; ".join(
                             f"{r} {_num(v, 3)} {'meets' if bd['meets'][r] else 'VIOLATES'}"
                             for r, v in bd["occupancy"].items()))
        sch = sc.get("schedule")
        if sch and sch.get("reduced_capacity_share"):
            lines.append(f"\nschedule: {sch['note']}")
        pw = sc.get("power")
        if pw:
            lines.append(f"\nheadroom {_num(pw.get('headroom'))}, minimum detectable effect "
                         f"{_num(pw.get('mde'))} at {pw.get('seeds')} seeds: {pw.get('note')}")
        mult = sc.get("multipliers", {})
        g = sc.get("grid", {})
        if mult:
            lc = mult["learned_constant"]
            lines.append(f"\nlearned constant λ_s = {lc['lambda_s']:.4g}, µ = "
                         f"{lc['mu_per_mhz']:.4g} per MHz; grid best λ_s = "
                         f"{g.get('best', {}).get('lambda_s', float('nan')):.4g}, µ = "
                         f"{g.get('best', {}).get('mu_per_mhz', float('nan')):.4g} per MHz "
                         f"({g.get('evaluated')} pairs, chosen on "
                         f"{g.get('chosen_on', 'the evaluated seeds')}); scheduler "
                         f"{mult['scheduler']}")
    return "\n".join(lines) + "\n"


def write_outputs(result: dict, out: Path) -> None:
    out = Path(out)
    write_json(out / "stage2.json", result, allow_nan=False)
    md = to_markdown(result)
    (out / "stage2.md").write_text(md)
    names = list(result["scenarios"])
    series = {}
    for row in ROWS:
        vals = [result["scenarios"][n]["rows"].get(row, {}).get("objective") for n in names]
        if all(v is None for v in vals):
            continue
        m = np.array([np.nan if v is None or v["mean"] is None else v["mean"] for v in vals])
        h = np.array([np.nan if v is None or v["ci95"] is None else v["ci95"] for v in vals])
        series[row] = (m, m - h, m + h)
    if names and series:
        plots.plot_grouped_bars(names, series, ylabel="accuracy − β·latency (SYNTHETIC)",
                                title="stage 2 per scenario, 95% CI", path=out / "stage2.png")

