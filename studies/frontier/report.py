"""The frontier study's report (``report.md``) and plot (``frontier_<pair>.png``) from
``studies.frontier.analysis.analyse``'s results; formatting only."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from evals import plots  # noqa: F401  (selects the Agg backend before pyplot is imported)
import matplotlib.pyplot as plt

from studies.frontier.analysis import (ALL_SLM, LLM_ALONE, METHOD_ORDER, ORACLE, PRADA, RANDOM,
                                       RSD, headline_r, rkey)
from studies.frontier.measure import split_sample

def _f(v, d=3):
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{d}f}"


def _cap_cell(s: Mapping) -> str:
    if "reading" in s:
        return s["reading"]
    if "capacity" in s:
        ge = "≥ " if s["censored"] else ""
        return (f"{ge}{s['capacity']:.3g} (seed mean {ge}{s['seed_mean']:.3g} "
                f"[{s['seed_lo']:.3g}, {s['seed_hi']:.3g}])")
    per = ", ".join(f"#{split_sample(k)[1]} " + (f"{v:.3g}" if isinstance(v, float) else v)
                    for k, v in s["per_sample"].items())
    ge = "≥ " if s.get("censored") else ""
    return f"{ge}{s['seed_mean']:.3g} [{s['seed_lo']:.3g}, {s['seed_hi']:.3g}] ({per})"


def _ratio_cell(v: Mapping) -> str:
    if v.get("mean") is None:
        return v["reading"]
    return f"{v['mean']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]: {v['reading']}"


def capacity_table(a: Mapping, retentions: Sequence[float], samples: int = 3) -> str:
    """The headline table: capacity at each r per method (users/s per server GPU)."""
    rs = [rkey(r) for r in retentions]
    head = "| method | " + " | ".join(f"r = {r}" for r in rs) + " |"
    lines = [head, "|" + "---|" * (len(rs) + 1)]
    names = {LLM_ALONE: "LLM alone", ALL_SLM: "All-SLM", RSD: "RSD (PRM τ)",
             RANDOM: "Random (p)", ORACLE: "Oracle (k)",
             PRADA: f"PRADA (θ or m, {samples} sample{'s' * (samples != 1)})"}
    for m in METHOD_ORDER:
        if m not in a["summary"][rs[0]]:
            continue
        lines.append(f"| {names[m]} | " + " | ".join(_cap_cell(a["summary"][r][m])
                                                    for r in rs) + " |")
    return "\n".join(lines)


def _header(meta: Mapping) -> list[str]:
    sz = meta["sizes"]
    out = ["# PRADA's frontier: capacity per server GPU at a required retention — SYNTHETIC "
           "gsm8k", "",
           "Registration: studies/frontier/README.md. Every number is from SYNTHETIC step "
           "traces and the roofline clock of the named pair; serving server (continuous "
           f"batching, chunked prefill, max_num_seqs {sz['num_servers']}, "
           "max_batched_tokens 2048, prefix cache on), B 20 MHz. Capacity: users/s per "
           "server GPU, bisection to "
           f"{sz['resolution']:.0%} (the capacity is the bracket's low end; '≥' censored at "
           "the top); stability and p90 per seed, accuracy pooled over seeds against the exact "
           "test-pool accuracy (evals.capacity). Ratios: mean over policy samples × seeds of "
           "per-seed capacity ratios, 95 % interval = union of the nested bootstrap and the "
           f"cluster t over samples. Sizes: {sz}.", ""]
    if meta["size"] != "study":
        out += [f"**Size `{meta['size']}`: no verdict at this size** ({len(sz['samples'])} "
                f"policy sample(s), {sz['seeds']} seeds, a few knob settings): it shows the "
                "machinery; the registered numbers are studies/frontier/results/report.md.", ""]
    return out


def _capacity_section(a: Mapping, meta: Mapping, h) -> list[str]:
    """The gate, the capacity table and the readings (or why there are none)."""
    if "capacities" not in a:
        return ["Phase C (capacities) not complete for this pair: no capacity, no reading.",
                ""]
    sz, g = meta["sizes"], a["gate"]
    out = ["### Gate", "",
           f"* G1 contention (LLM alone saturates inside the bracket, load binding): "
           f"{'passed' if g['G1']['passed'] else 'not passed'} (per seed "
           f"{g['G1']['llm_alone_per_seed']}, first broken {g['G1']['binds']}).",
           f"* G2 headroom (best chosen setting at r = {h}: {g['G2'].get('best')}; "
           f"server-s/user {_f(g['G2'].get('best_s'), 4)} vs the LLM alone's "
           f"{_f(g['G2'].get('llm_alone_s'), 4)}, difference "
           f"{_f(g['G2'].get('difference'), 4)} vs paired MDE "
           f"{_f(g['G2'].get('mde'), 4)}, relative {_f(g['G2'].get('relative'), 2)}): "
           f"{'passed' if g['G2']['passed'] else 'not passed'}.",
           f"* Gate: **{'passed' if g['passed'] else 'not passed: no verdict'}**.",
           "", "### Capacity at retention r (users/s per server GPU, test)", "",
           capacity_table(a, sz["retentions"], len(sz["samples"])), "",
           "### Readings" + ("" if meta["size"] == "study"
                             else f" (size {meta['size']}: no verdict)"), ""]
    for r, rd in a["readings"].items():
        out.append(f"* r = {r}: " + "; ".join(f"{k} {_ratio_cell(v)}" for k, v in rd.items()))
    return out + [""]


def _screening_section(s: Mapping, h) -> list[str]:
    out = ["### PRADA vs random at equal share (test, light load, paired over "
           f"seeds; PRADA's r = {h} setting)", ""]
    for g, v in s["per_sample"].items():
        if "diff" in v:
            out.append(f"* {g}: {v['row']} share {v['share']:.3f} vs random p "
                       f"{v['p']:.3f} share {v['random_share']:.3f}: accuracy "
                       f"difference {v['diff']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]")
        else:
            out.append(f"* {g}: {v['reading']}")
    if s.get("mean") is not None:
        out.append(f"* over samples × seeds: {s['mean']:+.3f} [{s['lo']:+.3f}, "
                   f"{s['hi']:+.3f}]: **{s['reading']}**")
    return out + [""]


def _latency_section(lat_: Mapping, h) -> list[str]:
    out = [f"### Latency (PRADA's r = {h} setting − LLM alone, p90, paired over seeds)", ""]
    for k, v in lat_.items():
        if "lo" in v:
            out.append(f"* {k}/s: {v['prada_minus_llm_p90_s']:+.2f} s "
                       f"[{v['lo']:+.2f}, {v['hi']:+.2f}] (LLM alone p90 "
                       f"{v['llm_p90_s']:.2f} s): {v['reading']}")
        else:
            out.append(f"* {k}/s: {v['reading']}")
    return out + [""]


def _sensitivity_section(sens: Mapping) -> list[str]:
    out = ["### Sensitivity of the accuracy clause (after the numbers; not a registered "
           "reading)", "",
           "Capacity of each chosen setting from the same probes, registered clause "
           "(evals.capacity's interval) → the clause judged on a ratio-estimator "
           "bootstrap (Σ correct / Σ arrivals over resampled seeds, same one-sided "
           "95 % level), on the rates the registered bisection probed (a row "
           "censored at the top was probed at the bracket's two ends only): README "
           "caveat.", ""]
    for r, rows in sens.items():
        out.append(f"* r = {r}: " + ", ".join(f"{g} {v[0]:.3g} → {v[1]:.3g}"
                                            for g, v in rows.items()))
    return out + [""]


def _ablation_section(abl: Mapping) -> list[str]:
    out = ["### No-cache server (ablation; capacity, users/s)", ""]
    for r, rows in abl.items():
        out.append(f"* r = {r}: " + ", ".join(f"{k} {v:g}" for k, v in rows.items()))
    return out + [""]


def _selection_section(a: Mapping, retentions) -> list[str]:
    out = ["### Selection on validation (phase A: lowest server-s/user at retention ≥ r)", "",
           "| group | " + " | ".join(f"r = {rkey(r)}" for r in retentions) + " |",
           "|" + "---|" * (len(retentions) + 1)]
    for g, by_r in a["selection"].items():
        if g in (LLM_ALONE, ALL_SLM):   # single points: the capacity rule judges them
            continue
        out.append(f"| {g} | " + " | ".join(
            (c["row"] + f" ({c['retention']:.3f}, {c['server_s_per_user']:.4f} s)")
            if c["row"] else c["reading"] for c in by_r.values()) + " |")
    return out + [""]


def _frontier_tables(a: Mapping, light_rate: float) -> list[str]:
    out = []
    for which in ("validation", "test"):
        out += [f"### Light-load frontier ({which}, {light_rate:g} users/s)", "",
                "| row | accuracy [95 % CI] | retention | offload share | server-s/user |",
                "|---|---|---|---|---|"]
        for t in a[f"frontier_{which}"]:
            out.append(f"| {t['row']} | {_f(t['accuracy'])} [{_f(t['accuracy_lo'])}, "
                       f"{_f(t['accuracy_hi'])}] | {_f(t['retention'])} | "
                       f"{_f(t['share'])} | {_f(t['server_s'], 4)} |")
        out.append("")
    return out


def to_markdown(results: Mapping, meta: Mapping) -> str:
    """The report: the header, then per pair its sections in a fixed order."""
    sz = meta["sizes"]
    h = headline_r(sz["retentions"])
    out = _header(meta)
    for pair, a in results.items():
        out += [f"## {pair}", "",
                f"Exact pool accuracy of the LLM alone: validation "
                f"{a['pools']['validation']:.4f}, test {a['pools']['test']:.4f}.", ""]
        out += _capacity_section(a, meta, h)
        if "screening" in a:
            out += _screening_section(a["screening"], h)
        if "latency" in a:
            out += _latency_section(a["latency"], h)
        if "sensitivity" in a:
            out += _sensitivity_section(a["sensitivity"])
        if "ablation" in a:
            out += _ablation_section(a["ablation"])
        out += _selection_section(a, sz["retentions"])
        out += _frontier_tables(a, sz["light_rate"])
    return "\n".join(out) + "\n"


def plot_frontier(a: Mapping, pair: str, path: Path) -> None:
    """Accuracy against offload share and against server-seconds per user (test, light
    load), one colour per method, 95 % intervals."""
    colors = {LLM_ALONE: "k", ALL_SLM: "grey", RSD: "tab:red", RANDOM: "tab:orange",
              ORACLE: "tab:green", PRADA: "tab:blue"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (x, lo, hi, label) in zip(axes, (("share", "share_lo", "share_hi",
                                              "offload share"),
                                             ("server_s", "server_s_lo", "server_s_hi",
                                              "server GPU-seconds per user"))):
        seen = set()
        for t in a["frontier_test"]:
            m = t["method"]
            xs, ys = t[x], t["accuracy"]
            if xs is None or ys is None or not (math.isfinite(xs) and math.isfinite(ys)):
                continue
            ax.errorbar([xs], [ys], yerr=[[ys - t["accuracy_lo"]], [t["accuracy_hi"] - ys]],
                        fmt="o", ms=3.5, color=colors.get(m, "tab:purple"), alpha=0.8,
                        label=None if m in seen else m)
            seen.add(m)
        ax.set_xlabel(label)
        ax.set_ylabel("accuracy (pooled)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"{pair}: screening frontier at light load (test) — SYNTHETIC", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png", metadata={"Software": None})
    plt.close(fig)
