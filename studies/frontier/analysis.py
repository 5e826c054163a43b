"""The frontier study's rules (registered in ``studies/frontier/README.md`` before any number):
the selection of each method's setting on validation, the capacities at each retention r from
the bisection probes, the gate, the readings, the latency comparison, the report and the
plots. Pure functions of the per-seed JSON parts (``studies.frontier`` writes them); nothing
here measures.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from evals import capacity as cap
from evals import report as ev_report
from prada_jax import stats
from prada_jax.stats import hierarchical as hier
from studies.frontier import measure as fm
from studies.frontier.measure import (ALL_SLM, LLM_ALONE, ORACLE, PRADA, RANDOM, RSD,
                                      method_of, split_sample)

#: The SLO's latency scale (× the LLM alone's lightly loaded validation p90, per the capacity
#: study) and the retention at which the gate, the screening and the latency readings are
#: taken (the middle of a size's ``retentions``: 0.95 at the registered size).
LATENCY_SCALE, HEADLINE_R = 2.0, 0.95


def headline_r(retentions: Sequence[float]) -> str:
    """The key of the retention the gate and the screening and latency readings use: the
    middle of ``retentions`` (0.95 of (0.90, 0.95, 0.98))."""
    return rkey(retentions[len(retentions) // 2])
NOT_REACHED = "does not reach r at any knob"
#: Methods with a knob (selection among settings); LLM alone and All-SLM are single points.
KNOBBED = (PRADA, RANDOM, RSD, ORACLE)
METHOD_ORDER = (LLM_ALONE, ALL_SLM, RSD, RANDOM, ORACLE, PRADA)


def rkey(r: float) -> str:
    return f"{float(r):g}"


def pooled_retention(rec: Mapping, anchor: float) -> float:
    """Σ correct / Σ arrivals over seeds ÷ the exact pool accuracy ``anchor``."""
    return cap.pooled_accuracy(rec) / float(anchor)


def selection_groups(rows: Mapping[str, Mapping]) -> dict[str, list[str]]:
    """``{group: [row]}``: one group per knobbed method, PRADA one per policy sample
    (``PRADA #k``: its critic θ and actor m rows together), and the single points."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        m = method_of(row)
        _, k = split_sample(row)
        g = fm.sample_name(m, k) if m == PRADA else m
        groups.setdefault(g, []).append(row)
    return groups


def choose(rows: Mapping[str, Mapping], names: Sequence[str], anchor: float, r: float
           ) -> dict:
    """The registered selection among ``names`` (records in ``rows[name]["record"]``): the
    lowest mean server-seconds per user among the settings whose pooled validation retention
    is ≥ ``r`` (ties: the name's order); ``{"row": None, "reading": NOT_REACHED}`` if none."""
    ok = []
    for i, n in enumerate(names):
        rec = rows[n]["record"]
        ret = pooled_retention(rec, anchor)
        if math.isfinite(ret) and ret >= float(r):
            ok.append((fm.finite_mean(rec["server_s_per_user"]), i, n, ret))
    if not ok:
        return {"row": None, "reading": NOT_REACHED}
    s, _, n, ret = min(ok)
    return {"row": n, "server_s_per_user": s, "retention": ret}


def select(phase_a: Mapping, anchor: float, retentions: Sequence[float]) -> dict:
    """``{group: {r: choice}}`` for every selection group of phase A's rows."""
    rows = phase_a["rows"]
    return {g: {rkey(r): choose(rows, names, anchor, r) for r in retentions}
            for g, names in selection_groups(rows).items()}


def chosen_rows(selection: Mapping) -> list[str]:
    """Every chosen row, deduplicated across r (LLM alone and All-SLM always)."""
    out = [LLM_ALONE, ALL_SLM]
    for g in selection.values():
        for c in g.values():
            if c["row"] is not None and c["row"] not in out:
                out.append(c["row"])
    return out


def slos(reference: Mapping, test_anchor: float, retentions: Sequence[float]) -> dict:
    """``{r: SLO}``: p90 ≤ 2 × the LLM alone's lightly loaded validation p90 (mean over seeds)
    and the accuracy clause at r × the exact test-pool accuracy."""
    return {rkey(r): cap.slo_from_reference(reference, LATENCY_SCALE, float(r), test_anchor)
            for r in retentions}


def row_capacity(probes: Mapping, bis: Mapping, row: str, slo: cap.SLO) -> dict:
    """One row's capacity at one SLO from its bisection's probes (``evals.capacity.capacity``
    on the rates the bisection probed: per-seed capacities, what broke first)."""
    mine = {float(x): {row: probes[row][x]} for x in bis["probed"]}
    c = cap.capacity(mine, row, slo, fm.ACCURACY_RULE)
    c["capacity"] = float(bis["capacity"])
    c["censored"] = bool(bis["censored"])
    c["bracket"] = list(bis["bracket"])
    return c


def capacities(phase_c: Mapping, selection: Mapping, slo_by_r: Mapping) -> dict:
    """``{r: {group: capacity dict or {"reading": NOT_REACHED}}}`` (each group's chosen row
    at r; LLM alone and All-SLM at every r)."""
    out = {}
    for r, slo in slo_by_r.items():
        out[r] = {}
        for g in (LLM_ALONE, ALL_SLM):
            out[r][g] = dict(row_capacity(phase_c["probes"], phase_c["by_r"][r][g], g, slo),
                             row=g)
        for g, by_r in selection.items():
            if g in (LLM_ALONE, ALL_SLM):
                continue
            c = by_r[r]
            if c["row"] is None:
                out[r][g] = {"reading": NOT_REACHED, "row": None}
                continue
            out[r][g] = dict(row_capacity(phase_c["probes"], phase_c["by_r"][r][c["row"]],
                                          c["row"], slo), row=c["row"])
    return out


def prada_groups(caps_r: Mapping) -> list[str]:
    return sorted(g for g in caps_r if method_of(g) == PRADA)


def per_seed(c: Mapping, seeds: int) -> np.ndarray:
    """A capacity dict's per-seed capacities; a setting that does not reach r: 0 per seed."""
    if c.get("row") is None:
        return np.zeros(seeds)
    return np.asarray(c["per_seed"], np.float64)


def ratio(caps_r: Mapping, num: Sequence[str], ref: str, seeds: int) -> dict:
    """The capacity ratio num / ref: cells [P, 1, S] of per-seed ratios (``num``: the PRADA
    samples' groups, or one group), the union of the nested-bootstrap and cluster-t 95 %
    intervals, and the registered reading."""
    if all(caps_r[g].get("row") is None for g in num):
        return {"reading": NOT_REACHED, "mean": None, "lo": None, "hi": None}
    if caps_r[ref].get("row") is None:
        return {"reading": f"{ref} {NOT_REACHED}", "mean": None, "lo": None, "hi": None}
    x, dropped = cap.ratio_cells(np.stack([per_seed(caps_r[g], seeds) for g in num]),
                                 per_seed(caps_r[ref], seeds))
    if np.all(np.isnan(x)):
        return {"reading": f"undefined ({ref}'s capacity is 0 on every seed)", "mean": None,
                "lo": None, "hi": None, "dropped_seeds": dropped}
    keep = [i for i in range(x.shape[0]) if np.isfinite(x[i]).any()]
    iv = hier.interval(x[keep])
    return {"reading": cap.reading(iv) + censoring_note(caps_r, num, ref),
            "mean": iv["mean"], "lo": iv["lo"], "hi": iv["hi"],
            "policy_means": [float(v) for v in iv["policy_means"]],
            "dropped_seeds": dropped}


def censoring_note(caps_r: Mapping, num: Sequence[str], ref: str) -> str:
    """What a capacity censored at the bracket's top makes of a ratio (added 2026-12-06
    after the numbers, README deviation 1): the numerator censored → the ratio is a lower
    bound; the reference censored → an upper bound; both → no comparison at this bracket."""
    n = any(caps_r[g].get("censored") for g in num if caps_r[g].get("row") is not None)
    r = bool(caps_r[ref].get("censored"))
    if n and r:
        return " (both censored at the bracket's top: no comparison at this bracket)"
    if n:
        return " (numerator censored at the bracket's top on some sample: a lower bound)"
    if r:
        return f" ({ref} censored at the bracket's top: an upper bound)"
    return ""


def readings(caps: Mapping, seeds: int) -> dict:
    """Per r: PRADA / LLM alone, PRADA / RSD, PRADA / oracle (hierarchical over samples ×
    seeds)."""
    out = {}
    for r, caps_r in caps.items():
        pg = prada_groups(caps_r)
        out[r] = {"PRADA / LLM alone": ratio(caps_r, pg, LLM_ALONE, seeds),
                  "PRADA / RSD": ratio(caps_r, pg, RSD, seeds),
                  "PRADA / oracle": ratio(caps_r, pg, ORACLE, seeds)}
    return out


def capacity_summary(caps_r: Mapping, g: str | Sequence[str]) -> dict:
    """A method's capacity at r: one group's (min over seeds, its bracket), or PRADA over its
    samples (the mean over samples × seeds of per-seed capacities with the hierarchical
    interval, and each sample's capacity)."""
    if isinstance(g, str):
        c = caps_r[g]
        if c.get("row") is None:
            return {"reading": NOT_REACHED}
        ps = np.asarray(c["per_seed"], np.float64)
        iv = stats.mean_ci(ps)
        return {"capacity": c["capacity"], "censored": c["censored"],
                "bracket": c["bracket"], "row": c["row"], "seed_mean": iv.mean,
                "seed_lo": iv.low, "seed_hi": iv.high, "binds": c["binds"]}
    reached = [x for x in g if caps_r[x].get("row") is not None]
    if not reached:
        return {"reading": NOT_REACHED}
    seeds = len(caps_r[reached[0]]["per_seed"])
    x = np.stack([per_seed(caps_r[x], seeds) for x in g])[:, None, :]
    iv = hier.interval(x)
    return {"seed_mean": iv["mean"], "seed_lo": iv["lo"], "seed_hi": iv["hi"],
            "censored": any(bool(caps_r[x].get("censored")) for x in reached),
            "per_sample": {x: (caps_r[x]["capacity"] if caps_r[x].get("row") else NOT_REACHED)
                           for x in g},
            "rows": {x: caps_r[x].get("row") for x in g}}


def gate(phase_b: Mapping, selection: Mapping, caps: Mapping, top: float,
         resolution: float, r: str = rkey(HEADLINE_R)) -> dict:
    """G1 contention: the LLM alone's capacity at r = 0.95 is > 0 and below the bracket's
    top on every seed, with stability or latency breaking first. G2 headroom: the best
    light-load server-seconds per user at r = 0.95 among the oracle's and every method's
    chosen setting (test, phase B) is below the LLM alone's by more than the paired MDE
    (``prada_jax.stats.mde_of_differences``, α 0.05, power 0.8, over seeds) and by at least
    2 × the bisection's resolution in relative terms."""
    llm = caps[r][LLM_ALONE]
    g1 = all(0 < c < top for c in llm["per_seed"]) and all(
        b in (ev_report.UNSTABLE, ev_report.U_BINDS, "latency") for b in llm["binds"])
    rows = phase_b["rows"]
    s_llm = np.asarray(rows[LLM_ALONE]["record"]["server_s_per_user"], np.float64)
    best = None
    for g, by_r in selection.items():
        row = by_r[r]["row"]
        if row is None or g in (LLM_ALONE, ALL_SLM):
            continue
        s = np.asarray(rows[row]["record"]["server_s_per_user"], np.float64)
        if best is None or np.nanmean(s) < np.nanmean(best[1]):
            best = (row, s)
    g2 = {"passed": False, "best": None}
    if best is not None:
        d = s_llm - best[1]
        mde = stats.mde_of_differences(d)
        rel = 1.0 - float(np.nanmean(best[1])) / float(np.nanmean(s_llm))
        g2 = {"best": best[0], "llm_alone_s": float(np.nanmean(s_llm)),
              "best_s": float(np.nanmean(best[1])), "difference": float(np.nanmean(d)),
              "mde": float(mde), "relative": rel,
              "passed": bool(np.nanmean(d) > mde and rel >= 2 * resolution)}
    return {"G1": {"passed": bool(g1), "llm_alone_per_seed": llm["per_seed"],
                   "binds": llm["binds"], "top": top}, "G2": g2,
            "passed": bool(g1 and g2["passed"])}


def screening(phase_b: Mapping, matched: Mapping, selection: Mapping,
              r: str = rkey(HEADLINE_R)) -> dict:
    """PRADA's r = 0.95 setting vs random matched to its measured share (test, light load,
    paired over seeds): per sample the paired difference, and over samples × seeds the
    hierarchical interval; reading better / no better / worse."""
    per, cells = {}, []
    for g in sorted(x for x in selection if method_of(x) == PRADA):
        row = selection[g][r]["row"]
        if row is None or row not in matched:
            per[g] = {"reading": NOT_REACHED}
            continue
        a = np.asarray(phase_b["rows"][row]["record"]["accuracy"], np.float64)
        b = np.asarray(matched[row]["record"]["accuracy"], np.float64)
        d = stats.paired_diff_ci(a, b)
        per[g] = {"row": row, "share": fm.finite_mean(
                      phase_b["rows"][row]["record"]["offload_rate"]),
                  "random_share": fm.finite_mean(matched[row]["record"]["offload_rate"]),
                  "p": matched[row]["p"], "diff": d.mean, "lo": d.low, "hi": d.high}
        cells.append(a - b)
    if not cells:
        return {"per_sample": per, "reading": NOT_REACHED}
    iv = hier.interval(np.asarray(cells)[:, None, :])
    rd = "better" if iv["lo"] > 0 else ("worse" if iv["hi"] < 0 else "no better")
    return {"per_sample": per, "mean": iv["mean"], "lo": iv["lo"], "hi": iv["hi"],
            "reading": rd}


def stable_on_every_seed(rec: Mapping) -> bool:
    rho = np.asarray(rec["rho"], np.float64)
    bl = np.asarray(rec["blocked_rate"], np.float64)
    return bool(np.all(rho < 1.0) and np.all(bl <= ev_report.BLOCKED_TOL))


def latency(probes: Mapping, selection: Mapping, rates: Sequence[float],
            r: str = rkey(HEADLINE_R)) -> dict:
    """PRADA's r = 0.95 setting (per sample) vs the LLM alone: p90 difference paired over
    seeds at each rate where both are stable on every seed; over samples × seeds the
    hierarchical interval; reading lower / higher / unresolved."""
    rows = [selection[g][r]["row"] for g in sorted(selection) if method_of(g) == PRADA]
    rows = [x for x in rows if x is not None]
    out = {}
    for rate in rates:
        k = f"{float(rate):g}"
        llm = probes.get(LLM_ALONE, {}).get(k)
        if llm is None or not rows or any(k not in probes.get(x, {}) for x in rows):
            out[k] = {"reading": "not measured"}
            continue
        if not stable_on_every_seed(llm) or not all(stable_on_every_seed(probes[x][k])
                                                    for x in rows):
            out[k] = {"reading": "not both stable"}
            continue
        a = np.asarray(llm["latency_p90_s"], np.float64)
        d = np.stack([np.asarray(probes[x][k]["latency_p90_s"], np.float64) - a
                      for x in rows])
        iv = hier.interval(d[:, None, :])
        rd = "lower" if iv["hi"] < 0 else ("higher" if iv["lo"] > 0 else "unresolved")
        out[k] = {"prada_minus_llm_p90_s": iv["mean"], "lo": iv["lo"], "hi": iv["hi"],
                  "llm_p90_s": float(np.mean(a)), "reading": rd}
    return out


def frontier_table(phase: Mapping, anchor: float) -> list[dict]:
    """Per row of a light-load phase: pooled accuracy and retention with the interval
    (``evals.capacity.accuracy_interval``), offload share and server-seconds per user
    (mean and 95 % t interval over seeds)."""
    out = []
    for row, d in phase["rows"].items():
        rec = d["record"]
        a = cap.accuracy_interval([rec], anchor, cells=cap.RULE_CELLS[fm.ACCURACY_RULE])
        sh, ss = stats.mean_ci(rec["offload_rate"]), stats.mean_ci(rec["server_s_per_user"])
        out.append({"row": row, "method": method_of(row), **a,
                    "share": sh.mean, "share_lo": sh.low, "share_hi": sh.high,
                    "server_s": ss.mean, "server_s_lo": ss.low, "server_s_hi": ss.high})
    return out


def analyse(parts: Mapping, sizes: fm.Sizes, top: float) -> dict:
    """Every registered quantity of one pair from its parts (``studies.frontier.PARTS``)."""
    va, te = parts["pools"]["validation"], parts["pools"]["test"]
    h = headline_r(sizes.retentions)
    sel = select(parts["phase_a"], va, sizes.retentions)
    ref = parts["phase_a"]["rows"][LLM_ALONE]["record"]
    slo_by_r = slos(ref, te, sizes.retentions)
    out = {"pools": parts["pools"], "selection": sel,
           "slos": {r: s._asdict() for r, s in slo_by_r.items()},
           "frontier_validation": frontier_table(parts["phase_a"], va),
           "frontier_test": frontier_table(parts["phase_b"], te),
           "policies": parts["thetas"].get("policies")}
    if "matched" in parts:
        out["screening"] = screening(parts["phase_b"], parts["matched"], sel, h)
    if "phase_c" in parts and parts["phase_c"].get("complete"):
        caps = capacities(parts["phase_c"], sel, slo_by_r)
        seeds = len(caps[h][LLM_ALONE]["per_seed"])
        out["capacities"] = caps
        out["summary"] = {r: {**{g: capacity_summary(c, g) for g in c
                                 if method_of(g) != PRADA},
                              PRADA: capacity_summary(c, prada_groups(c))}
                          for r, c in caps.items()}
        out["readings"] = readings(caps, seeds)
        out["gate"] = gate(parts["phase_b"], sel, caps, top, sizes.resolution, h)
        if not out["gate"]["passed"]:
            for rd in out["readings"].values():
                for v in rd.values():
                    v["reading"] = "no verdict (gate not passed): " + v["reading"]
        out["latency"] = latency(parts["phase_c"]["probes"], sel, sizes.latency_rates, h)
        out["sensitivity"] = sensitivity(parts["phase_c"], caps, slo_by_r)
    if "ablation" in parts and parts["ablation"].get("complete"):
        out["ablation"] = capacities_ablation(parts["ablation"], slo_by_r)
    return out


def ratio_upper(rec: Mapping, confidence: float = cap.TEST_CONFIDENCE,
                resamples: int = cap.ACCURACY_RESAMPLES, seed: int = 0) -> float:
    """The high end of the two-sided ``confidence`` percentile interval of the pooled accuracy
    Σ correct / Σ arrivals over seeds resampled with replacement (a ratio estimator: the
    arrivals' spread between seeds does not enter as accuracy variance)."""
    a = np.asarray(rec["accuracy"], np.float64)
    n = np.asarray(rec["arrivals"], np.float64)
    ok = np.isfinite(a) & (n > 0)
    a, n = a[ok], n[ok]
    if a.size == 0:
        return math.nan
    idx = np.random.default_rng(seed).integers(0, a.size, (int(resamples), a.size))
    r = (a[idx] * n[idx]).sum(1) / n[idx].sum(1)
    return float(np.quantile(r, 0.5 + confidence / 2.0))


def strict_capacity(probes: Mapping, bis: Mapping, row: str, slo: cap.SLO) -> float:
    """Sensitivity (after the numbers, README caveat; not a registered reading): the row's
    capacity from the same probed rates when the accuracy clause judges ``ratio_upper``
    instead of ``evals.capacity.accuracy_interval`` (stability and p90 per seed unchanged)."""
    rates = sorted(float(x) for x in bis["probed"])
    ok = []
    for x in rates:
        rec = probes[row][f"{x:g}"]
        f = cap.failures(rec, slo, fm.ACCURACY_RULE)
        load = f[ev_report.UNSTABLE] | f[ev_report.U_BINDS] | f["latency"]
        ok.append(~load & (ratio_upper(rec) >= slo.accuracy))
    return float(np.min(cap.seed_capacity(rates, np.stack(ok))))


def sensitivity(phase_c: Mapping, caps: Mapping, slo_by_r: Mapping) -> dict:
    """``{r: {group: [registered capacity, strict capacity]}}`` of every chosen row."""
    out = {}
    for r, caps_r in caps.items():
        out[r] = {}
        for g, c in caps_r.items():
            if c.get("row") is None:
                continue
            bis = phase_c["by_r"][r][c["row"]]
            out[r][g] = [float(c["capacity"]),
                         strict_capacity(phase_c["probes"], bis, c["row"], slo_by_r[r])]
    return out


def capacities_ablation(abl: Mapping, slo_by_r: Mapping) -> dict:
    """The no-cache server's capacities of the rows it bisected, per r."""
    return {r: {row: row_capacity(abl["probes"], b, row, slo_by_r[r])["capacity"]
                for row, b in abl["by_r"][r].items()} for r in slo_by_r}
